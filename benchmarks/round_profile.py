"""Where a fedpers round's seconds go, and seconds per round in Flower's Ray simulation.

For each method it (1) runs ``--rounds`` rounds through ``run_simulation`` (2 client actors of 1 CPU) and
takes the seconds of rounds 2+ (round 1 carries Ray start-up, actor creation and data loading), then
(2) replays one round of the *same code* in this process, without Flower's engine or Ray: the method's
real NumPyClient (``fit`` of every client sampled in round 2, ``evaluate`` of every client the strategy
would ask, with one thread each as the actors have) and its real Strategy (aggregation with the server-side
steps such as pFedKDH's recalibration, and the global evaluation, with two threads as the driver has).
The sums tell how much of a round is the method's arithmetic and how much is engine, serialization and
waiting; with two actors, the client work divides by about two.

    python benchmarks/round_profile.py --rounds 3                       # both settings below
    python benchmarks/round_profile.py --only fedavg_pfllib

Settings: ``fedavg_pfllib`` = FedAvg on PFLlib's own MNIST split (``../shared/data/pfllib_mnist_dir0.1_20c.npz``,
PFLlib's settings: 20 clients, half per round, 2 local epochs, batch 64, lr 0.015, no Ds);
``pfedkdh_table1`` = pFedKDH-EA on MNIST at the pFedKDH paper's Table 1 settings (Dirichlet 0.05, |Ds| 5,000).
Writes benchmarks/results/round_profile.json and prints a table.
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

from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.core.schema import clients_per_round
from fedpers.registry.methods import client_class_for, strategy_class_for
from fedpers.core.results import read_metrics
from fedpers.apps.simulation import run_simulation

try:
    from strategies.base import Upload  # issue 18: an upload is its model section plus named others
except ImportError:  # a tree before it (the "before" profile)
    Upload = None

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
TABLE1 = {"num_clients": 20, "fraction_fit": 0.5, "local_epochs": 2, "batch_size": 64, "lr": 0.015}
SETTINGS = {
    "fedavg_pfllib": {"method": "fedavg", "dataset": str(DATA / "mnist.npz"), "partition": "file",
                      "partition_file": str(DATA / "pfllib_mnist_dir0.1_20c.npz"), "aux_size": 0, **TABLE1},
    "pfedkdh_table1": {"method": "pfedkdh", "variant": "ea", "dataset": str(DATA / "mnist.npz"), "alpha": 0.05,
                       "aux_size": 5000, **TABLE1},
}


def simulated_round_seconds(cfg) -> list[float]:
    """Seconds of every round of a real ``run_simulation`` of ``cfg``."""
    out = tempfile.mkdtemp(prefix="fedpers-profile-")
    run_simulation(cfg.replace(out_dir=out))
    return [r["round_seconds"] for r in read_metrics(out)]


def _context(cfg, pid: int):
    from flwr.app import Context, RecordDict

    return Context(run_id=0, node_id=pid, node_config={"partition-id": pid, "num-partitions": cfg.num_clients},
                   state=RecordDict(), run_config=cfg.to_dict())


def replay_round(cfg, server_round: int = 2) -> dict[str, float]:
    """Seconds of each part of one round, run in this process with the method's own classes."""
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    fed = get_federation(cfg)
    timings: dict[str, float] = {}
    torch.set_num_threads(2)
    t = time.perf_counter()
    strategy = strategy_class_for(cfg)(cfg, fed, None)
    timings["server set-up (incl. initial calibration)"] = time.perf_counter() - t
    strategy.book.start()
    broadcast = strategy.download_arrays()
    # the message config with the broadcast's section counts (trees before issue 18 sent the round only)
    config = (strategy.message_config(server_round) if hasattr(strategy, "message_config")
              else {"server_round": server_round})
    k = fed.num_clients
    m = clients_per_round(cfg.fraction_fit, k)
    chosen = sorted(int(p) for p in np.random.default_rng([cfg.seed, server_round]).choice(k, size=m, replace=False))
    client_cls = client_class_for(cfg)
    contexts = {pid: _context(cfg, pid) for pid in range(k)}
    torch.set_num_threads(1)  # as one client actor
    fit_s, build_s, ser_s, updates = 0.0, 0.0, 0.0, {}
    for pid in chosen:
        t = time.perf_counter()
        client = client_cls(cfg, contexts[pid])
        build_s += time.perf_counter() - t
        t = time.perf_counter()
        arrays, n, _ = client.fit(broadcast, config)
        fit_s += time.perf_counter() - t
        t = time.perf_counter()
        received = parameters_to_ndarrays(ndarrays_to_parameters(arrays))
        updates[pid] = Upload(received, n, {}) if Upload is not None else (received, n)
        ser_s += time.perf_counter() - t
    timings["client fit (sum over sampled clients, 1 thread)"] = fit_s
    torch.set_num_threads(2)  # the driver
    t = time.perf_counter()
    strategy.apply_aggregate(server_round, strategy.aggregate(server_round, updates))
    timings["server aggregate + server-side steps"] = time.perf_counter() - t
    t = time.perf_counter()
    strategy.evaluate(server_round, ndarrays_to_parameters(strategy.download_arrays()))
    timings["server global evaluation"] = time.perf_counter() - t
    broadcast = strategy.download_arrays()
    torch.set_num_threads(1)
    eval_s = 0.0
    # getattr: the same script measured the tree before personalized_is_global existed ("before")
    evaluated = [] if getattr(strategy, "personalized_is_global", False) else list(range(k))
    for pid in evaluated:
        t = time.perf_counter()
        client = client_cls(cfg, contexts[pid])
        build_s += time.perf_counter() - t
        t = time.perf_counter()
        client.evaluate(broadcast, config)
        eval_s += time.perf_counter() - t
    timings["clients asked to evaluate"] = len(evaluated)
    timings["client evaluate (sum over the clients asked, 1 thread)"] = eval_s
    timings["client construction (sum)"] = build_s
    timings["serialization of the uploads (sum)"] = ser_s
    client_work = fit_s + eval_s + build_s
    timings["model: client work / 2 actors + server work"] = (
        client_work / 2 + timings["server aggregate + server-side steps"] + timings["server global evaluation"])
    return timings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS))
    p.add_argument("--tag", default="", help="label of this measurement (e.g. before / after)")
    args = p.parse_args()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    path = HERE / "results" / "round_profile.json"
    report = json.loads(path.read_text()) if path.is_file() else {}
    for name in args.only:
        cfg = build_config({**SETTINGS[name], "rounds": args.rounds, "device": "cpu", "client_cpus": 1.0})
        seconds = simulated_round_seconds(cfg)
        parts = replay_round(cfg)
        later = float(np.mean(seconds[1:])) if len(seconds) > 1 else float("nan")
        entry = {"settings": SETTINGS[name], "rounds": args.rounds, "round_seconds": seconds,
                 "mean_seconds_rounds_2_plus": later, "replayed_round_2": parts,
                 "command": f"python benchmarks/round_profile.py --rounds {args.rounds} --only {name}"}
        report.setdefault(name, {})[args.tag or "latest"] = entry
        print(f"\n{name}: simulated s/round (rounds 2+) {later:.2f}; all rounds "
              f"{', '.join(f'{s:.1f}' for s in seconds)}")
        for part, sec in parts.items():
            print(f"  {part:58s} {sec:7.2f} s")
        print(f"  {'engine, messages and waiting (simulated - modelled)':58s} "
              f"{later - parts['model: client work / 2 actors + server work']:7.2f} s")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The profile as tables: one per setting, one column per measurement tag (e.g. before / after)."""
    lines = ["# Where a round's seconds go (benchmarks/round_profile.py)", "",
             "Seconds of round 2 replayed in one process with the method's own classes (client parts with 1 thread,",
             "summed over clients; server parts with 2 threads), and the simulated seconds per round (rounds 2+,",
             "2 Ray actors) of the same settings. 'engine, messages, waiting' = simulated minus modelled.", ""]
    for name, tags in report.items():
        order = sorted(tags, key=lambda t: (t != "before", t))
        parts = list(next(iter(tags.values()))["replayed_round_2"])
        lines += [f"## {name}", "", f"`{next(iter(tags.values()))['command']}`", "",
                  "| part | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]
        for part in parts:
            lines.append(f"| {part} | " + " | ".join(
                f"{tags[t]['replayed_round_2'].get(part, float('nan')):.2f}" for t in order) + " |")
        lines.append("| **simulated s/round, rounds 2+** | " + " | ".join(
            f"**{tags[t]['mean_seconds_rounds_2_plus']:.2f}**" for t in order) + " |")
        lines.append("| engine, messages, waiting | " + " | ".join(
            f"{tags[t]['mean_seconds_rounds_2_plus'] - tags[t]['replayed_round_2']['model: client work / 2 actors + server work']:.2f}"
            for t in order) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
