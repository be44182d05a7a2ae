"""FedBABU's evaluation-time fine-tuning, epoch by epoch, from a finished run's checkpoint.

FedBABU (Oh et al., ICLR 2022, Sec. 4) fine-tunes a copy of the whole model on each client's train data
before testing it. In fedpers' MNIST runs its personalized accuracy falls while its global (initial)
accuracy rises, and single clients drop from ~100 % to a few test samples right between two fine-tuning
lengths. This script replays that fine-tuning on the global model a run checkpointed, for every client
and each learning rate asked (the run's own, ``lr``, is FedBABU's: it fine-tunes at the training rate), and
records after every epoch the mean fine-tuning loss and the client's test (and, where the run held one
out, validation) accuracy, next to the norm of the backbone features the fine-tuning starts from. It
answers whether the drops are the fine-tuning's step size (the loss climbs) or something else.

    python benchmarks/fedbabu_finetune_trace.py RUN_DIR --epochs 20 --lrs 0.015 0.005 --data-dir ../shared/data

RUN_DIR is a fedbabu run directory holding ``checkpoint/`` (a sweep's ``runs/<row>/<data>/seed<k>``).
Writes ``benchmarks/results/fedbabu_finetune/<name>.md`` and ``.json`` (``--name``, default the run's
dataset and seed) and prints the table. The fine-tuning is the one FedBABU's client runs
(:func:`fedpers.algorithms.fedbabu.fine_tune_copies`), seeded per client; test accuracy is read, never used
to choose anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report_files import write_report  # noqa: E402
from fedpers.algorithms.fedbabu import fine_tune_copies  # noqa: E402
from fedpers.core import seeds  # noqa: E402
from fedpers.core.checkpoint import load_checkpoint  # noqa: E402
from fedpers.core.errors import FedpersError  # noqa: E402
from fedpers.core.models import build_model  # noqa: E402
from fedpers.core.results import read_metrics  # noqa: E402
from fedpers.core.training import backbone_features, evaluate, seed_everything  # noqa: E402
from fedpers.registry.config import build_config  # noqa: E402
from fedpers.registry.methods import federation_for, model_kind_of  # noqa: E402

COLLAPSE = 0.2  # a client "drops" when its test accuracy falls this far below its best epoch so far


def run_config(run_dir: Path, data_dir: str | None):
    """The run's config from its checkpoint, and the checkpoint's state (the global model)."""
    state = load_checkpoint(run_dir / "checkpoint")
    values = dict(state["config"])
    if values.get("method") != "fedbabu":
        raise FedpersError(f"{run_dir}: a {values.get('method')} run; this traces FedBABU's fine-tuning only")
    if data_dir is not None:
        values["data_dir"] = data_dir
    return build_config(values), state


def trace_client(model: torch.nn.Module, data, *, epochs: int, lr: float, cfg, server_round: int, pid: int) -> dict:
    """One client's fine-tuning: per epoch the mean loss and test/validation accuracy (epoch 0: before).
    Seeded as the client seeds its evaluation of ``server_round``, so at the run's lr the copy after
    ``fedbabu_finetune_epochs`` epochs is the one whose accuracy the run recorded."""
    generator = seed_everything(cfg.seed, server_round, pid, seeds.CLIENT_EVALUATE)
    rows = [{"epoch": 0, "loss": None, "test": evaluate(model, data.test.x, data.test.y)[0],
             "val": evaluate(model, data.val.x, data.val.y)[0] if data.val is not None else None}]

    def record(epoch: int, tuned: torch.nn.Module, loss: float) -> None:
        rows.append({"epoch": epoch, "loss": loss, "test": evaluate(tuned, data.test.x, data.test.y)[0],
                     "val": evaluate(tuned, data.val.x, data.val.y)[0] if data.val is not None else None})

    fine_tune_copies(model, data.train.x, data.train.y, epochs=[epochs], lr=lr, batch_size=cfg.batch_size,
                     generator=generator, drop_last=cfg.drop_last_batch, momentum=cfg.momentum,
                     weight_decay=cfg.weight_decay, on_epoch=record)
    feature_norm = float(backbone_features(model, data.train.x).norm(dim=1).mean()) if len(data.train.x) else 0.0
    return {"train_samples": int(len(data.train.y)), "feature_norm": feature_norm, "epochs": rows}


def summarize(traces: dict[int, dict], epochs: int) -> list[dict]:
    """Per epoch over the clients: mean test/val accuracy, mean and max loss, clients that dropped."""
    out = []
    for e in range(epochs + 1):
        at = [t["epochs"][e] for t in traces.values()]
        best_before = [max(r["test"] for r in t["epochs"][: e + 1]) for t in traces.values()]
        vals = [r["val"] for r in at if r["val"] is not None]
        losses = [r["loss"] for r in at if r["loss"] is not None]
        out.append({"epoch": e, "test": float(np.mean([r["test"] for r in at])),
                    "val": float(np.mean(vals)) if vals else None,
                    "mean_loss": float(np.mean(losses)) if losses else None,
                    "max_loss": float(np.max(losses)) if losses else None,
                    "dropped": [pid for pid, r, b in zip(traces, at, best_before) if r["test"] < b - COLLAPSE]})
    return out


def replay_check(run_dir: Path, server_round: int, cfg, results: dict) -> str:
    """Whether the replay at the run's lr gives the personalized accuracy the run recorded for the round."""
    recorded = next((r.get("personalized_macro_acc") for r in read_metrics(run_dir)
                     if r.get("round") == server_round), None)
    rows = results.get(cfg.lr)
    e = cfg.fedbabu_finetune_epochs
    if recorded is None or rows is None or e >= len(rows):
        return "not checked (the run's lr and fine-tuning length were not both replayed, or no record)"
    replayed = rows[e]["test"]
    same = "the same" if abs(replayed - recorded) < 1e-6 else "DIFFERENT"
    return (f"at lr {cfg.lr:g}, {e} epochs: {100 * replayed:.2f} replayed, {100 * recorded:.2f} recorded by the "
            f"run for round {server_round} ({same})")


def markdown(name: str, run_dir: Path, round_: int, results: dict, norms: dict, check: str) -> str:
    lines = [f"# FedBABU fine-tuning, epoch by epoch: {name}", "",
             f"Run `{run_dir}`, global model of round {round_}; every client fine-tuned from it "
             f"(`benchmarks/fedbabu_finetune_trace.py`). Accuracy in %: macro over the clients. 'dropped': "
             f"clients whose test accuracy is more than {COLLAPSE * 100:.0f} points below their best epoch so "
             f"far. Loss: the epoch's mean fine-tuning cross-entropy (mean / max over clients).", "",
             f"Mean backbone-feature norm on the clients' train data: {np.mean(list(norms.values())):.1f} "
             f"(min {min(norms.values()):.1f}, max {max(norms.values()):.1f}).", "",
             f"Replay check: {check}.", ""]
    for lr, rows in results.items():
        lines += [f"## fine-tuning lr {lr:g}", "", "| epoch | test | val | loss mean | loss max | dropped |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            val = f"{100 * r['val']:.2f}" if r["val"] is not None else ""
            loss = f"{r['mean_loss']:.4f} | {r['max_loss']:.4f}" if r["mean_loss"] is not None else " | "
            lines.append(f"| {r['epoch']} | {100 * r['test']:.2f} | {val} | {loss} | "
                         f"{', '.join(map(str, r['dropped']))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lrs", type=float, nargs="+", help="fine-tuning learning rates (default: the run's lr)")
    parser.add_argument("--data-dir", help="the data directory, if the run's relative one does not resolve here")
    parser.add_argument("--name", help="the results file's name under results/fedbabu_finetune/")
    args = parser.parse_args(argv)
    try:
        cfg, state = run_config(args.run_dir, args.data_dir)
        fed = federation_for(cfg)
    except FedpersError as exc:
        print(f"fedbabu_finetune_trace: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    model = build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim, dropout=cfg.dropout,
                        kind=model_kind_of(cfg))
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state["model"].items()})
    lrs = args.lrs or [cfg.lr]
    server_round = int(state["round"])
    results, per_client, norms = {}, {}, {}
    for lr in lrs:
        traces = {}
        for pid in range(fed.num_clients):
            traces[pid] = trace_client(model, fed.client(pid, torch.device("cpu")), epochs=args.epochs, lr=lr,
                                       cfg=cfg, server_round=server_round, pid=pid)
            norms[pid] = traces[pid]["feature_norm"]
        results[lr] = summarize(traces, args.epochs)
        per_client[str(lr)] = traces
    check = replay_check(args.run_dir, server_round, cfg, results)
    name = args.name or f"{cfg.get('dataset')}_seed{cfg.seed}_round{int(state['round'])}"
    name = Path(str(name)).name.replace(".npz", "")
    write_report(f"fedbabu_finetune/{name}", markdown(name, args.run_dir, server_round, results, norms, check),
                 {"run_dir": str(args.run_dir), "round": server_round, "epochs": args.epochs, "replay_check": check,
                  "summary": {str(k): v for k, v in results.items()}, "per_client": per_client})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
