"""Cross-device scale: pFedKDH and FedEAGD with 1,000 to 100,000 clients served by a pool of nodes.

Each run is ``fedpers run`` (Flower's Ray simulation, ``client_layout=pool``) in a child process while the
memory of its whole process tree (driver, Ray's GCS/raylet, the client actors) is sampled from /proc. Data:
the FedProx paper's Synthetic(1, 1) (``dataset=synthetic``, generated per client on demand; docs/data.md),
every client with its own distribution and labelling rule and at least 50 samples, and the same paper's
iid variant (``synthetic_iid``: one rule and one input distribution for every client), where a client
seen once can learn from what the others taught the shared model; the MLP model. 100 clients sampled per
round, 1 local epoch, 100 clients evaluated every ``--eval-every`` rounds and at the last, a seeded sample
among the clients trained so far (``eval_among=trained``: a client drawn from 100,000 has almost never
trained, and its personalized model would say nothing);
|Ds| = 1,000 for pFedKDH. Reported per run:

* the seconds outside rounds (start-up and shut-down: Ray, data, server; no message to any client before
  round 1 in this layout), the mean seconds of a round that only trains and of one that also evaluates;
* peak driver RSS and peak tree PSS (PSS splits shared pages between processes);
* the personalized accuracy at the last round next to a trivial baseline on the same evaluated clients:
  each client predicting the majority class of its own training split (both readings below); and the
  shared model's accuracy (where the method has one) next to always predicting the global test set's most
  common class.

Two budgets (``--budget``), each with its own run directory and table:

* ``first``: both methods at their defaults (pFedKDH-Fair: the private head as it was left; FedEAGD's
  residual gate shut before round 20, at 1/20 in round 20); ``results/scale/pool_table.md``, Synthetic(1, 1)
  only. At 20 rounds FedEAGD's personalized model is then almost its global model, and a head left on a
  backbone that moved on does not beat the trivial baseline: learning did not show.
* ``cross-device`` (the default): what a client seen about once needs (ours). pFedKDH-EA, the paper's own
  evaluation variant, adapts the private head on the current backbone at evaluation (5 epochs of the
  client's train data at the local learning rate), and the Fair reading (head as is) is kept beside it;
  FedEAGD's gate is open from the first round (``fedeagd_fusion_start`` 0, ramp 1), since its default
  schedule counts rounds in which every client trains. ``results/scale/pool_learning.md``.

Accuracy is read two ways, each beside its own trivial baseline: client-macro (the mean of the evaluated
clients' accuracies) and sample-weighted (all their test samples together, the FedProx paper's reading of
this dataset); Synthetic(1, 1) clients are dominated by one class, so the baseline of each client predicting
its own majority training class is high. The baselines are computed from the run's metrics at report time.

Runs (``--clients``) are kept in their directories (``measure.json``), so the script resumes where it stopped.

    python benchmarks/scale_pool.py --clients 1000 10000 100000
    python benchmarks/scale_pool.py --budget first
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


# Each budget's run directory, table and per-method keys beyond the shared ones of :func:`settings`.
BUDGETS = {
    "first": {"runs": "scale_pool_runs", "table": "scale/pool_table", "data": ["synthetic(1,1)"], "keys": {}},
    "cross-device": {"runs": "scale_pool_learning_runs", "table": "scale/pool_learning",
                     "data": ["synthetic(1,1)", "synthetic-iid"],
                     "keys": {"pfedkdh": {"variant": "ea", "ea_epochs": 5, "ea_lr": 0.05},
                              "fedeagd": {"fedeagd_fusion_start": 0, "fedeagd_fusion_ramp": 1}}},
}
LOCAL_LR = 0.05


# The generator's variants (``--data``): each client with its own labelling rule, or one rule for all.
DATA = {"synthetic(1,1)": {"suffix": "", "keys": {}},
        "synthetic-iid": {"suffix": "_iid", "keys": {"synthetic_iid": True}}}


def run_dir(out: Path, method: str, clients: int, data: str) -> Path:
    """Where one run's results and measurement live."""
    return out / f"{method}_k{clients}_pool{DATA[data]['suffix']}"


def settings(method: str, clients: int, data: str, args: argparse.Namespace) -> dict:
    """The run's config keys: the shared cross-device setting, the data variant's and the budget's keys for
    ``method``."""
    return {**DATA[data]["keys"],
            "method": method, "dataset": "synthetic", "num_clients": clients, "fraction_fit": SAMPLED / clients,
            "client_layout": "pool", "rounds": args.rounds, "eval_every": args.eval_every,
            "eval_clients": EVAL_CLIENTS, "eval_among": "trained", "local_epochs": 1, "batch_size": 10,
            "lr": LOCAL_LR, "aux_size": 1000 if method == "pfedkdh" else 0, "device": "cpu", "seed": 0,
            **BUDGETS[args.budget]["keys"].get(method, {})}


def read_rounds(out: Path) -> dict[int, dict]:
    """The run's metrics.jsonl records by round."""
    from fedpers.core.results import read_metrics

    return {r["round"]: r for r in read_metrics(out)}


def per_client_readings(fed, per_client_acc: dict) -> dict:
    """The trivial baseline of the evaluated clients (the keys of ``per_client_acc``) in the run's federation
    ``fed``: each predicting the majority class of its own training split on its own test split, read
    client-macro (the mean of their accuracies) and sample-weighted (their test samples together); also the
    personalized accuracy sample-weighted by the same test sizes, so that both readings compare like with
    like."""
    baseline, sizes, accs = [], [], []
    for pid, acc in per_client_acc.items():
        data = fed.client(int(pid), "cpu")
        labels = data.test.y.numpy()
        majority = int(np.bincount(data.train.y.numpy()).argmax())
        baseline.append(float((labels == majority).mean()))
        sizes.append(len(labels))
        accs.append(acc)
    return {"majority_class_baseline": float(np.mean(baseline)),
            "weighted_majority_baseline": float(np.average(baseline, weights=sizes)),
            "final_personalized_weighted_acc": float(np.average(accs, weights=sizes))}


def shared_model_learning(fed, rounds: dict) -> dict:
    """The shared model's accuracy on the global test set of the run's federation ``fed`` at the last round
    (None for a method without a global head) and the trivial baseline for it: always predicting the most
    common class of that set."""
    labels = fed.test("cpu").y.numpy()
    return {"global_acc": rounds[max(rounds)].get("global_acc"),
            "global_majority_baseline": float(np.bincount(labels).max() / len(labels))}


def learning(keys: dict, rounds: dict) -> dict:
    """The last round's accuracies and their trivial baselines, from the run's records by round: the
    personalized reading (client-macro and sample-weighted), pFedKDH-EA's head-as-is reading where the run
    has one, and the shared model's."""
    from fedpers.core.federation import get_federation
    from fedpers.registry.config import build_config

    fed = get_federation(build_config(keys))
    last = rounds[max(rounds)]
    evaluated = [r for r in rounds.values() if r.get("evaluated_clients")]
    return {"first_evaluation_acc": evaluated[0]["personalized_macro_acc"],
            "final_personalized_macro_acc": last["personalized_macro_acc"],
            "final_head_as_is_macro_acc": last.get("personalized_macro_acc_fair"),
            **per_client_readings(fed, last["per_client_acc"]), **shared_model_learning(fed, rounds)}


def measure(method: str, clients: int, data: str, args: argparse.Namespace) -> dict:
    """Run (or reuse) one run of ``method`` with ``clients`` clients under the memory sampler; its learning
    readings are computed from the run's files each time."""
    out = run_dir(Path(args.out), method, clients, data)
    keys = settings(method, clients, data, args)
    if (out / "measure.json").exists():
        return {"data": data, **json.loads((out / "measure.json").read_text()), **learning(keys, read_rounds(out))}
    rc, sampler, log, wall = run_fedpers_sampled(keys, out, cwd=HERE.parent, interval=args.interval,
                                                 timeout=args.timeout)
    base = {"method": method, "clients": clients, "data": data}
    if rc != 0:
        return {**base, "error": f"run failed ({rc}), see {log}"}
    rounds = read_rounds(out)
    evaluated = [r for r in rounds.values() if r.get("evaluated_clients")]
    training = [r for r in rounds.values() if not r.get("evaluated_clients")]
    result = {**base, "keys": keys, "rounds": len(rounds), "sampled_per_round": len(rounds[1]["fit_clients"]),
              "evaluated_per_round": rounds[max(rounds)]["evaluated_clients"], "wall_seconds": wall,
              "outside_rounds_seconds": wall - sum(r["round_seconds"] for r in rounds.values()),
              "first_round_seconds": rounds[1]["round_seconds"],
              "training_round_seconds": float(np.mean([r["round_seconds"] for r in training])),
              "evaluation_round_seconds": float(np.mean([r["round_seconds"] for r in evaluated])),
              **{f"peak_{k}": v for k, v in sampler.peak.items()}}
    (out / "measure.json").write_text(json.dumps(result, indent=2) + "\n")
    return {**result, **learning(keys, rounds)}


def percent(value: float | None) -> str:
    """A share as a percentage with two decimals, or "-" where the run has no such reading."""
    return "-" if value is None else f"{100 * value:.2f}"


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the measured runs."""
    lines = ["| data | method | clients | sampled / evaluated per round | outside rounds s | round 1 s | "
             "training round s | "
             "evaluation round s | peak driver RSS GB | peak tree PSS GB | personalized, client-macro | "
             "own-majority, client-macro | personalized, sample-weighted | own-majority, sample-weighted | "
             "head as is, client-macro | shared model accuracy | global-majority baseline |",
             "|---|" + "---|" * 16]
    for r in rows:
        run = f"| {r['data']} | {r['method']} | {r['clients']:,} | "
        if "error" in r:
            lines.append(run + f"{r['error']} |" + " |" * 13)
            continue
        lines.append(run + f"{r['sampled_per_round']} / {r['evaluated_per_round']} | {r['outside_rounds_seconds']:.1f} | "
                     f"{r['first_round_seconds']:.1f} | {r['training_round_seconds']:.1f} | "
                     f"{r['evaluation_round_seconds']:.1f} | {r['peak_driver_rss'] / GB:.2f} | "
                     f"{r['peak_tree_pss'] / GB:.2f} | "
                     + " | ".join(percent(r[k]) for k in (
                         "final_personalized_macro_acc", "majority_class_baseline", "final_personalized_weighted_acc",
                         "weighted_majority_baseline", "final_head_as_is_macro_acc", "global_acc",
                         "global_majority_baseline")) + " |")
    return lines


BUDGET_TEXT = {
    "first": "both methods at their defaults: pFedKDH-Fair (each private head as it was left) and FedEAGD with "
             "its residual gate shut before round 20 and at 1/20 in round 20 (fedeagd_fusion_start 20, "
             "fedeagd_fusion_ramp 20), so that at this budget its personalized model is almost its global model",
    "cross-device": "pFedKDH-EA (the paper's evaluation variant: the private head adapted on the current "
                    "backbone at evaluation, 5 epochs of the client's train data at the local learning rate; "
                    "'head as is' is the Fair reading of the same run) and FedEAGD with its residual gate open "
                    "from the first round (fedeagd_fusion_start 0, fedeagd_fusion_ramp 1), both ours for "
                    "clients that train about once",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", nargs="+", type=int, default=[1000, 10000, 100000])
    p.add_argument("--methods", nargs="+", default=["pfedkdh", "fedeagd"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--budget", choices=sorted(BUDGETS), default="cross-device",
                   help="which methods' keys (see the module docstring); each budget has its runs and table")
    p.add_argument("--data", nargs="+", choices=sorted(DATA), default=None,
                   help="the generator's variants (default: the budget's)")
    p.add_argument("--out", default=None, help="run directories (default: the budget's, under results/)")
    p.add_argument("--note", default="", help="a line on the conditions (e.g. what else ran) for the report")
    args = p.parse_args()
    budget = BUDGETS[args.budget]
    args.out = args.out or str(HERE / "results" / budget["runs"])
    data = args.data or budget["data"]
    rows = [measure(m, k, d, args) for d in data for m in args.methods for k in args.clients]
    command = "python benchmarks/scale_pool.py" + ("" if args.budget == "cross-device" else f" --budget {args.budget}")
    lines = [f"# Cross-device scale: {', '.join(data)}, {SAMPLED} clients sampled per round, "
             "client_layout=pool, "
             f"{args.rounds} rounds, 1 local epoch, {EVAL_CLIENTS} clients evaluated every {args.eval_every} "
             "rounds (among those trained so far), CPU", "",
             f"Command: `{command}`. Budget `{args.budget}`: {BUDGET_TEXT[args.budget]}. Memory sampled every "
             f"{args.interval} s over the whole process tree. Outside rounds: the run's wall time less its rounds "
             "(start-up and shut-down). Personalized accuracy: the evaluated clients' own models at the last "
             "round, client-macro (the mean of their accuracies) and sample-weighted (their test samples "
             "together, the FedProx paper's reading of this dataset); own-majority baseline: the same clients "
             "each predicting its own majority training class, read the same two ways. Shared model accuracy: "
             "the global model (pFedKDH's teacher head) on the global test set (the test splits of 100 seeded "
             "clients) at the last round; global-majority baseline: always the most common class of that set. "
             "A budget of this many rounds is a diagnostic of scale and of learning, not a reproduction of "
             "any paper's number.", ""]
    if args.note:
        lines += [args.note, ""]
    write_report(budget["table"], "\n".join(lines + table(rows)) + "\n", rows)


if __name__ == "__main__":
    main()
