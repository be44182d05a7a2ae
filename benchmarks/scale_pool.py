"""Cross-device scale: pFedKDH and FedEAGD with 1,000 to 100,000 clients served by a pool of nodes.

Each run is ``fedpers run`` (Flower's Ray simulation, ``client_layout=pool``) in a child process while the
memory of its whole process tree (driver, Ray's GCS/raylet, the client actors) is sampled from /proc. Data:
the FedProx paper's Synthetic(1, 1) (``dataset=synthetic``, generated per client on demand; docs/data.md),
every client with its own distribution and at least 50 samples; the MLP model. 100 clients sampled per
round, 1 local epoch, 100 clients evaluated every ``--eval-every`` rounds and at the last, a seeded sample
among the clients trained so far (``eval_among=trained``: a client drawn from 100,000 has almost never
trained, and its personalized model would say nothing);
|Ds| = 1,000 for pFedKDH. Reported per run:

* the seconds outside rounds (start-up and shut-down: Ray, data, server; no message to any client before
  round 1 in this layout), the mean seconds of a round that only trains and of one that also evaluates;
* peak driver RSS and peak tree PSS (PSS splits shared pages between processes);
* the personalized accuracy at the last round next to a trivial baseline on the same evaluated clients:
  each client predicting the majority class of its own training split; and the shared model's accuracy
  (where the method has one) next to always predicting the global test set's most common class.

Runs (``--clients``) are kept in their directories (``measure.json``), so the script resumes where it stopped.

    python benchmarks/scale_pool.py --clients 1000 10000 100000

Writes benchmarks/results/scale/pool_table.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from proctree import run_fedpers_sampled  # noqa: E402
from report_files import write_report  # noqa: E402

SAMPLED, EVAL_CLIENTS, GB = 100, 100, 1e9


def run_dir(out: Path, method: str, clients: int) -> Path:
    """Where one run's results and measurement live."""
    return out / f"{method}_k{clients}_pool"


def settings(method: str, clients: int, args: argparse.Namespace) -> dict:
    """The run's config keys."""
    return {"method": method, "dataset": "synthetic", "num_clients": clients, "fraction_fit": SAMPLED / clients,
            "client_layout": "pool", "rounds": args.rounds, "eval_every": args.eval_every,
            "eval_clients": EVAL_CLIENTS, "eval_among": "trained", "local_epochs": 1, "batch_size": 10, "lr": 0.05,
            "aux_size": 1000 if method == "pfedkdh" else 0, "device": "cpu", "seed": 0}


def majority_baseline(cfg_keys: dict, rounds: dict) -> float:
    """Mean over the last round's evaluated clients of the accuracy of predicting each client's majority
    training class on its own test split."""
    from fedpers.core.federation import get_federation
    from fedpers.registry.config import build_config

    fed = get_federation(build_config(cfg_keys))
    accs = []
    for pid in rounds[max(rounds)]["per_client_acc"]:
        data = fed.client(int(pid), "cpu")
        majority = int(np.bincount(data.train.y.numpy()).argmax())
        accs.append(float((data.test.y.numpy() == majority).mean()))
    return float(np.mean(accs))


def shared_model_learning(keys: dict, rounds: dict) -> dict:
    """The shared model's accuracy on the global test set at the last round (None for a method without a
    global head) and the trivial baseline for it: always predicting the most common class of that set."""
    from fedpers.core.federation import get_federation
    from fedpers.registry.config import build_config

    labels = get_federation(build_config(keys)).test("cpu").y.numpy()
    return {"global_acc": rounds[max(rounds)].get("global_acc"),
            "global_majority_baseline": float(np.bincount(labels).max() / len(labels))}


def measure(method: str, clients: int, args: argparse.Namespace) -> dict:
    """Run (or reuse) one run of ``method`` with ``clients`` clients under the memory sampler."""
    out = run_dir(Path(args.out), method, clients)
    if (out / "measure.json").exists():
        return json.loads((out / "measure.json").read_text())
    keys = settings(method, clients, args)
    rc, sampler, log, wall = run_fedpers_sampled(keys, out, cwd=HERE.parent, interval=args.interval,
                                                 timeout=args.timeout)
    base = {"method": method, "clients": clients}
    if rc != 0:
        return {**base, "error": f"run failed ({rc}), see {log}"}
    rounds = {r["round"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    evaluated = [r for r in rounds.values() if r.get("evaluated_clients")]
    training = [r for r in rounds.values() if not r.get("evaluated_clients")]
    result = {**base, "rounds": len(rounds), "sampled_per_round": len(rounds[1]["fit_clients"]),
              "evaluated_per_round": rounds[max(rounds)]["evaluated_clients"], "wall_seconds": wall,
              "outside_rounds_seconds": wall - sum(r["round_seconds"] for r in rounds.values()),
              "first_round_seconds": rounds[1]["round_seconds"],
              "training_round_seconds": float(np.mean([r["round_seconds"] for r in training])),
              "evaluation_round_seconds": float(np.mean([r["round_seconds"] for r in evaluated])),
              "first_evaluation_acc": evaluated[0]["personalized_macro_acc"],
              "final_personalized_macro_acc": rounds[max(rounds)]["personalized_macro_acc"],
              "majority_class_baseline": majority_baseline(keys, rounds), **shared_model_learning(keys, rounds),
              **{f"peak_{k}": v for k, v in sampler.peak.items()}}
    (out / "measure.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the measured runs."""
    lines = ["| method | clients | sampled / evaluated per round | outside rounds s | round 1 s | training round s | "
             "evaluation round s | peak driver RSS GB | peak tree PSS GB | personalized accuracy | "
             "own-majority baseline | shared model accuracy | global-majority baseline |", "|---|" + "---|" * 12]
    for r in rows:
        run = f"| {r['method']} | {r['clients']:,} | "
        if "error" in r:
            lines.append(run + f"{r['error']} |" + " |" * 10)
            continue
        lines.append(run + f"{r['sampled_per_round']} / {r['evaluated_per_round']} | {r['outside_rounds_seconds']:.1f} | "
                     f"{r['first_round_seconds']:.1f} | {r['training_round_seconds']:.1f} | "
                     f"{r['evaluation_round_seconds']:.1f} | {r['peak_driver_rss'] / GB:.2f} | "
                     f"{r['peak_tree_pss'] / GB:.2f} | {100 * r['final_personalized_macro_acc']:.2f} | "
                     f"{100 * r['majority_class_baseline']:.2f} | "
                     + ("- | " if r["global_acc"] is None else f"{100 * r['global_acc']:.2f} | ")
                     + f"{100 * r['global_majority_baseline']:.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", nargs="+", type=int, default=[1000, 10000, 100000])
    p.add_argument("--methods", nargs="+", default=["pfedkdh", "fedeagd"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default=str(HERE / "results" / "scale_pool_runs"))
    p.add_argument("--note", default="", help="a line on the conditions (e.g. what else ran) for the report")
    args = p.parse_args()
    rows = [measure(m, k, args) for m in args.methods for k in args.clients]
    lines = [f"# Cross-device scale: Synthetic(1, 1), {SAMPLED} clients sampled per round, client_layout=pool, "
             f"{args.rounds} rounds, 1 local epoch, {EVAL_CLIENTS} clients evaluated every {args.eval_every} "
             "rounds (among those trained so far), CPU", "",
             "Command: `python benchmarks/scale_pool.py`. Memory sampled every "
             f"{args.interval} s over the whole process tree. Outside rounds: the run's wall time less its rounds "
             "(start-up and shut-down). Personalized accuracy: macro accuracy of the evaluated clients' own "
             "models at the last round; own-majority baseline: the same clients each predicting its own "
             "majority training class. Shared model accuracy: the global model (pFedKDH's teacher head) on "
             "the global test set (the test splits of 100 seeded clients) at the last round; global-majority "
             "baseline: always the most common class of that set. "
             "A budget of this many rounds is a diagnostic of scale and of learning, not a reproduction of "
             "any paper's number.", ""]
    if args.note:
        lines += [args.note, ""]
    write_report("scale/pool_table", "\n".join(lines + table(rows)) + "\n", rows)


if __name__ == "__main__":
    main()
