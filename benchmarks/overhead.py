"""Overhead of fedpers' Flower/Ray simulation over a bare PyTorch loop doing the same work.

For one FL run (MNIST, 20 clients, 50% participation, a few rounds) and each method (FedAvg, pFedKDH-Fair):

(a) **bare**: one process, no Flower, no Ray: the same client sampling, the same local training (same
    seeds, losses and optimizer), the same aggregation, teacher recalibration and evaluation of every
    client (FedAvg: read off one global evaluation, as fedpers does), written as a plain loop over
    clients with the fedpers math functions;
(b) **fedpers**: ``run_simulation`` in Flower's Ray simulation engine (2 client actors of 1 CPU each).

It prints and saves the ratio b/a of the whole wall time (with engine start-up) and of the rounds after
the first (without start-up: Ray start, actor creation and each actor's first data load happen before
or during round 1). Both do identical arithmetic, so their final accuracies are printed side by side as
a check that the bare loop does the same work.

    python benchmarks/overhead.py --data ../shared/data/mnist.npz --rounds 3

Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.core import seeds
from fedpers.algorithms.pfedkdh import pfedkdh_objective, recalibrate_head
from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.core.schema import clients_per_round
from fedpers.core.models import backbone_parameters, build_model, get_arrays, set_arrays
from fedpers.core.results import read_metrics
from fedpers.apps.simulation import run_simulation
from fedpers.core.training import evaluate, frozen_copy, predict_logits, seed_everything, sgd, train_epochs
from fedpers.core.validation import weighted_average

HERE = Path(__file__).resolve().parent


def bare_run(cfg) -> dict:
    """Plain-loop replica of one fedpers run (FedAvg or pFedKDH-Fair); returns timings and accuracies."""
    t0 = time.perf_counter()
    fed = get_federation(cfg)
    device = torch.device("cpu")
    k = fed.num_clients

    def fresh():
        return build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim, dropout=cfg.dropout,
                           seed=cfg.seed).to(device)

    server = fresh()
    pfedkdh = cfg.method == "pfedkdh"
    part = "backbone" if pfedkdh else "all"
    heads: dict[int, list[np.ndarray]] = {}
    initial_head = get_arrays(server, "head")
    if pfedkdh:
        aux = fed.aux(device)
        recalibrate_head(server, aux.x, aux.y, epochs=cfg.recal_epochs, lr=cfg.recal_lr,
                         batch_size=cfg.batch_size, generator=seed_everything(cfg.seed, seeds.SERVER_TRAINING, 1),
                         drop_last=cfg.drop_last_batch)
    round_seconds, final = [], {}
    for rnd in range(1, cfg.rounds + 1):
        start = time.perf_counter()
        m = clients_per_round(cfg.fraction_fit, k)
        chosen = sorted(int(p) for p in np.random.default_rng([cfg.seed, rnd]).choice(k, size=m, replace=False))
        broadcast = get_arrays(server, "all")
        updates = []
        for pid in chosen:
            gen = seed_everything(cfg.seed, rnd, pid, seeds.CLIENT_FIT)
            model = fresh()
            set_arrays(model, broadcast, "all")
            data = fed.client(pid, device).train
            if pfedkdh:
                teacher = frozen_copy(model)
                student_bb = backbone_parameters(model)
                global_bb = [p.detach().clone() for p in student_bb]
                set_arrays(model, heads.get(pid, initial_head), "head")

                def loss_fn(x, y, model=model, teacher=teacher, student_bb=student_bb, global_bb=global_bb):
                    with torch.no_grad():
                        t = teacher(x)
                    return pfedkdh_objective(model(x), t, y, temperature=cfg.temperature, lambda_kd=cfg.lambda_kd,
                                             mu=cfg.mu, backbone=student_bb, global_backbone=global_bb)
            else:
                def loss_fn(x, y, model=model):
                    return F.cross_entropy(model(x), y)
            opt = sgd(model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay)
            train_epochs(model, data.x, data.y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, optimizer=opt,
                         batch_loss=loss_fn, generator=gen, drop_last=cfg.drop_last_batch)
            if pfedkdh:
                heads[pid] = get_arrays(model, "head")
            updates.append((get_arrays(model, part), len(data)))
        set_arrays(server, weighted_average(updates), part)
        if pfedkdh:
            recalibrate_head(server, aux.x, aux.y, epochs=cfg.recal_epochs, lr=cfg.recal_lr,
                             batch_size=cfg.batch_size, generator=seed_everything(cfg.seed, seeds.SERVER_TRAINING, rnd + 1),
                             drop_last=cfg.drop_last_batch)
        test = fed.test(device)
        logits = predict_logits(server, test.x)
        global_acc = (logits.argmax(dim=1) == test.y).float().mean().item()
        if pfedkdh:
            per_client = []
            for pid in range(k):  # every client evaluates its personalized model
                model = fresh()
                set_arrays(model, get_arrays(server, "all"), "all")
                set_arrays(model, heads.get(pid, initial_head), "head")
                data = fed.client(pid, device).test
                per_client.append(evaluate(model, data.x, data.y)[0])
        else:  # FedAvg: every client's model is the global one, as fedpers reads it off one evaluation
            correct = (logits.argmax(dim=1) == test.y).numpy()
            per_client = [float(correct[pos].mean()) for pos in fed.test_positions()]
        round_seconds.append(time.perf_counter() - start)
        final = {"global_acc": global_acc, "personalized_macro_acc": float(np.mean(per_client))}
    return {"wall_seconds": time.perf_counter() - t0, "round_seconds": round_seconds, "final": final}


def fedpers_run(cfg) -> dict:
    """The same run through Flower's Ray simulation engine."""
    out = tempfile.mkdtemp(prefix="fedpers-overhead-")
    cfg = cfg.replace(out_dir=out)
    t0 = time.perf_counter()
    run_simulation(cfg)
    wall = time.perf_counter() - t0
    rounds = read_metrics(out)
    return {"wall_seconds": wall, "round_seconds": [r["round_seconds"] for r in rounds],
            "final": {"global_acc": rounds[-1]["global_acc"],
                      "personalized_macro_acc": rounds[-1]["personalized_macro_acc"]}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--methods", nargs="+", default=["fedavg", "pfedkdh"])
    args = p.parse_args()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    torch.set_num_threads(2)  # the bare loop gets the whole machine, as the two 1-CPU actors do
    results = {}
    for method in args.methods:
        cfg = build_config({"method": method, "dataset": args.data, "rounds": args.rounds,
                            "local_epochs": args.local_epochs, "device": "cpu", "variant": "fair",
                            "alpha": 0.5, "client_cpus": 1.0})
        a = bare_run(cfg)
        b = fedpers_run(cfg)
        later = lambda r: sum(r["round_seconds"][1:])  # noqa: E731 - rounds after the first
        results[method] = {
            "bare": a, "fedpers": b,
            "ratio_with_startup": b["wall_seconds"] / a["wall_seconds"],
            "ratio_without_startup": later(b) / later(a),
        }
        print(f"{method:8s} bare {a['wall_seconds']:7.1f} s (rounds 2+: {later(a):6.1f} s) | fedpers "
              f"{b['wall_seconds']:7.1f} s (rounds 2+: {later(b):6.1f} s) | ratio {results[method]['ratio_with_startup']:.2f} "
              f"with start-up, {results[method]['ratio_without_startup']:.2f} without | final acc bare "
              f"{a['final']} fedpers {b['final']}", flush=True)
    report = {"command": "python benchmarks/overhead.py " + f"--rounds {args.rounds} --local-epochs {args.local_epochs}",
              "settings": {"dataset": Path(args.data).name, "clients": 20, "fraction_fit": 0.5, "alpha": 0.5,
                           "rounds": args.rounds, "local_epochs": args.local_epochs, "client_cpus": 1},
              "results": results}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "overhead.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
