"""Does a round's last, short mini-batch move the personalized accuracies? (FedAS's falls on CIFAR-10 Practical)

Every method draws the same local batch order for a given seed, round and client (``seeds.CLIENT_FIT``), and
with ``drop_last_batch: false`` (every committed study) an epoch ends with one SGD step on the client's
``n_k mod batch_size`` leftover samples, weighted like a full batch. On a label-skewed split those few
samples are sometimes all from the client's rare classes. This script replays each evaluated round's last
batch for every client of a finished study (the order only; nothing is trained) and sets it beside each
row's per-client accuracy in that round. A method whose client draws from the same generator before its
epochs (FedALA) trained on other batches: its row is a placebo. Runs made with ``drop_last_batch: true``
are the control: the same batches are drawn and skipped, so their dips should not follow the skew.

For a client and an evaluated round r: the last batch's *skew* is the total variation distance between its
label distribution and the client's train split's (0: the same proportions; near 1: classes the client
barely holds, or one class of several); a full batch of 64 is rarely far from the split, a batch of 2 to 5
often is. The *dip* is the client's accuracy at r minus the mean of its accuracies
at the neighbouring evaluated rounds (r - eval_every, r + eval_every). Per row: Spearman's rank correlation
between skew and dip over (client, round) pairs, all of them and those whose last batch holds at most
``--short`` samples, and the mean dip where the last batch is skewed (skew at
least ``--skewed``) against the rest.

    python benchmarks/last_batch_draws.py benchmarks/results/fedeagd_cifar10_practical --from-round 55 \\
        --data-dir ../shared/data

Writes ``benchmarks/results/last_batch/<name>.md`` and ``.json`` (``--name``, default the study folder's
name) and prints the tables. Test accuracies are read, never used to choose anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report_files import write_report  # noqa: E402
from fedpers.core import seeds  # noqa: E402
from fedpers.core.errors import FedpersError  # noqa: E402
from fedpers.core.federation import DATA_KEYS, get_federation  # noqa: E402
from fedpers.core.results import read_metrics, read_summary  # noqa: E402
from fedpers.core.training import minibatches, seed_everything  # noqa: E402
from fedpers.registry.config import build_config  # noqa: E402

# the keys that fix each client's samples and batch order: equal in every row, or the rows are not paired
ORDER_KEYS = (*DATA_KEYS, "batch_size", "drop_last_batch")
# methods whose client draws from the fit generator before its epochs: the batches replayed here are not the
# ones they trained on, so their rows are a placebo (their dips should not follow the replayed skew)
OTHER_ORDER = {"fedala": "its ALA step draws its sample from the fit generator before training"}


def last_batch(n: int, batch_size: int, seed: int, server_round: int, partition_id: int) -> torch.Tensor:
    """Indices (into the client's train split) of the last mini-batch of round ``server_round``'s first
    local epoch, as the client's training draws it (:func:`fedpers.core.training.minibatches`)."""
    generator = seed_everything(seed, server_round, partition_id, seeds.CLIENT_FIT)
    return list(minibatches(n, batch_size, generator, torch.device("cpu"), drop_last=False))[-1]


def skew(labels: np.ndarray, class_share: np.ndarray) -> float:
    """Total variation distance between the batch's label distribution and ``class_share`` (the client's)."""
    batch_share = np.bincount(labels, minlength=len(class_share)) / len(labels)
    return float(0.5 * np.abs(batch_share - class_share).sum())


def dips(accuracy: dict[int, float], every: int) -> dict[int, float]:
    """Per evaluated round with both neighbours: accuracy minus the mean of the neighbours' accuracies."""
    return {r: a - (accuracy[r - every] + accuracy[r + every]) / 2 for r, a in accuracy.items()
            if r - every in accuracy and r + every in accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a sweep's results folder (runs/<row>/<data>/seed<k>)")
    parser.add_argument("--seed", type=int, default=0, help="which seed's runs (default 0)")
    parser.add_argument("--from-round", type=int, default=1, help="first evaluated round counted (default 1)")
    parser.add_argument("--skewed", type=float, default=0.5,
                        help="skew from which a last batch counts as skewed (default 0.5, ours)")
    parser.add_argument("--short", type=int, default=8,
                        help="last batches of at most this many samples count as short (default 8, ours)")
    parser.add_argument("--data-dir", default="", help="dataset folder (as the runs' data_dir)")
    parser.add_argument("--name", default="", help="report name (default: the study folder's name)")
    args = parser.parse_args()

    run_dirs = sorted(p.parent for p in args.study.glob(f"runs/*/*/seed{args.seed}/summary.json"))
    if not run_dirs:
        raise SystemExit(f"last_batch_draws: no finished run of seed {args.seed} under {args.study}/runs")
    summaries = {d: read_summary(d) for d in run_dirs}
    first = summaries[run_dirs[0]]["config"]
    for d, s in summaries.items():
        differ = [k for k in ORDER_KEYS if k != "data_dir" and s["config"].get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"last_batch_draws: {d} differs from {run_dirs[0]} in {differ}: batches not paired")
    dropped = bool(first.get("drop_last_batch"))
    cfg = build_config({k: first[k] for k in ("method", *ORDER_KEYS) if k in first} | {"data_dir": args.data_dir})
    fed = get_federation(cfg)
    batch, seed = cfg.batch_size, cfg.seed

    rows: dict[str, dict[int, dict[int, float]]] = {}  # row -> client -> round -> accuracy
    placebo: dict[str, str] = {}  # rows whose batches are another draw: why
    every = 0
    for d in run_dirs:
        records = [r for r in read_metrics(d) if r.get("per_client_acc")]
        row, method = d.parts[-3], summaries[d]["config"].get("method")
        if method in OTHER_ORDER:
            placebo[row] = OTHER_ORDER[method]
        rows[row] = {}
        for r in records:
            for pid, acc in r["per_client_acc"].items():
                rows[row].setdefault(int(pid), {})[r["round"]] = 100 * acc
        rounds = [r["round"] for r in records]
        every = every or int(np.min(np.diff(rounds)))

    clients = sorted(next(iter(rows.values())))
    draws = {}
    for pid in clients:
        y = fed.client(pid, torch.device("cpu")).train.y.cpu().numpy()
        share = np.bincount(y, minlength=fed.num_classes) / len(y)
        rounds = sorted(next(iter(rows.values()))[pid])
        for r in rounds:
            idx = last_batch(len(y), batch, seed, r, pid).numpy()
            draws[(pid, r)] = {"size": len(idx), "labels": y[idx].tolist(), "skew": skew(y[idx], share)}

    table, data = [], {"study": str(args.study), "seed": args.seed, "from_round": args.from_round,
                       "drop_last_batch": dropped, "placebo": placebo, "skewed_from": args.skewed,
                       "short_at_most": args.short, "batch_size": batch, "rows": {}}
    for row, per_client in rows.items():
        pairs = [(draws[(pid, r)]["skew"], dip, pid, r) for pid in clients
                 for r, dip in dips(per_client[pid], every).items() if r >= args.from_round]
        t = np.array([p[0] for p in pairs])
        dip = np.array([p[1] for p in pairs])
        rho, p_value = stats.spearmanr(t, dip)
        short = np.array([draws[(pid, r)]["size"] <= args.short for _, _, pid, r in pairs])
        rho_short, p_short = stats.spearmanr(t[short], dip[short]) if short.sum() > 2 else (np.nan, np.nan)
        low = dip[t >= args.skewed]
        worst = sorted(pairs, key=lambda p: p[1])[:5]
        data["rows"][row] = {"pairs": len(pairs), "spearman": float(rho), "p_value": float(p_value),
                             "short_pairs": int(short.sum()), "spearman_short": float(rho_short),
                             "p_value_short": float(p_short),
                             "skewed": int(len(low)), "mean_dip_skewed": float(low.mean()) if len(low) else None,
                             "mean_dip_rest": float(dip[t < args.skewed].mean()),
                             "largest_dips": [{"client": pid, "round": r, "dip": round(float(d), 2),
                                               **draws[(pid, r)], "skew": round(float(tt), 3)}
                                              for tt, d, pid, r in worst]}
        row_data = data["rows"][row]
        skewed_mean = f"{row_data['mean_dip_skewed']:+.2f}" if len(low) else "-"
        label = f"{row} (placebo)" if row in placebo else row
        table.append(f"| {label} | {len(pairs)} | {rho:+.2f} | {p_value:.1e} | {int(short.sum())} | "
                     f"{rho_short:+.2f} | {p_short:.1e} | {len(low)} | {skewed_mean} | "
                     f"{row_data['mean_dip_rest']:+.2f} |")

    worst_lines = []
    for row, row_data in data["rows"].items():
        for w in row_data["largest_dips"]:
            worst_lines.append(f"| {row} | {w['client']} | {w['round']} | {w['dip']:+.2f} | {w['size']} | "
                               f"{w['labels']} | {w['skew']:.3f} |")
    trained = ("The runs dropped the short last batch (`drop_last_batch: true`): the batches below were drawn "
               "and not trained on, the control.\n\n" if dropped else
               "The runs trained on the short last batch (`drop_last_batch: false`).\n\n")
    md = (f"# Last mini-batch draws against per-client accuracy ({args.study.name}, seed {args.seed})\n\n"
          f"`python benchmarks/last_batch_draws.py {args.study} --from-round {args.from_round} --skewed "
          f"{args.skewed} --short {args.short}`. Evaluated rounds {args.from_round}+ with both neighbouring "
          f"evaluations; batch {batch}. Skew: total variation distance between the last batch's labels and the "
          f"client's train split's. Dip: the client's accuracy minus the mean of its accuracies {every} rounds "
          "before and after (points).\n\n"
          "| row | (client, round) pairs | Spearman rho (skew, dip) | p | pairs with a short last batch | "
          "their rho | p | skewed last batches | mean dip, skewed | mean dip, rest |\n"
          "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(table) + "\n\n" + trained.rstrip() +
          "".join(f" Placebo: {row}, whose batches are another draw ({why})." for row, why in placebo.items()) +
          "\n\nThe five largest dips of each row:\n\n| row | client | round | dip | last batch size | "
          "its labels | skew |\n|---|---|---|---|---|---|---|\n" + "\n".join(worst_lines) + "\n")
    write_report(f"last_batch/{args.name or args.study.name}", md, data)


if __name__ == "__main__":
    try:
        main()
    except FedpersError as exc:
        raise SystemExit(f"last_batch_draws: {exc}") from None
