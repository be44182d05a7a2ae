"""pFedKDH paper, Table 2 (MNIST column) next to fedpers' own runs.

Runs pFedKDH (one run gives both Fair and EA: they share training and differ only at evaluation),
FedPer, FedAvg and FedProx on MNIST with 20 clients, 50% participation, alpha in {0.05, 0.5}, one seed,
Table 1 settings except the number of rounds (``--rounds``, default 10; the paper uses 50), and writes
``benchmarks/results/mnist_table2.md`` and ``.json``. Finished runs are skipped, so the script resumes.

    python benchmarks/mnist_table2.py --data ../shared/data/mnist.npz --rounds 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Paper Table 2, MNIST, mean over repetitions (%); rows: (label, method, metric key in summary.final)
PAPER = {
    "FedAvg": {0.05: 93.23, 0.5: 97.89},
    "FedProx": {0.05: 93.22, 0.5: 97.88},
    "FedPer": {0.05: 99.11, 0.5: 98.08},
    "pFedKDH-Fair": {0.05: 99.22, 0.5: 98.96},
    "pFedKDH-EA": {0.05: 99.28, 0.5: 99.01},
}
ROWS = [  # label, method, extra --set, metric read from summary["final"]
    ("FedAvg", "fedavg", [], "global_acc"),
    ("FedProx", "fedprox", [], "global_acc"),
    ("FedPer", "fedper", [], "personalized_macro_acc"),
    ("pFedKDH-Fair", "pfedkdh", ["variant=ea"], "personalized_macro_acc_fair"),
    ("pFedKDH-EA", "pfedkdh", ["variant=ea"], "personalized_macro_acc"),
]


def run_one(method: str, alpha: float, extra: list[str], args: argparse.Namespace) -> dict:
    """Run (or reuse) one experiment and return its summary."""
    out = Path(args.out) / f"{method}_a{alpha}"
    if args.table_only and not (out / "summary.json").exists():
        return {}
    if not (out / "summary.json").exists():
        cmd = [sys.executable, "-m", "fedpers.cli", "run", "--out", str(out),
               "--set", f"method={method}", "--set", f"dataset={args.data}", "--set", f"alpha={alpha}",
               "--set", f"rounds={args.rounds}", "--set", f"eval_every={args.eval_every}",
               "--set", f"seed={args.seed}"]
        for item in extra:
            cmd += ["--set", item]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.5])
    p.add_argument("--out", default=str(HERE / "results" / "mnist_table2_runs"))
    p.add_argument("--table-only", action="store_true", help="write the table from finished runs, run nothing")
    args = p.parse_args()

    table: dict[str, dict[float, dict]] = {}
    for alpha in args.alphas:
        summaries = {}
        # run the personalized methods first: if time runs out, the headline rows exist
        for label, method, extra, metric in sorted(ROWS, key=lambda row: row[1] not in ("pfedkdh", "fedper")):
            key = (method, tuple(extra))
            if key not in summaries:
                summaries[key] = run_one(method, alpha, extra, args)
        for label, method, extra, metric in ROWS:
            s = summaries[(method, tuple(extra))]
            if not s:  # --table-only and the run was not made
                table.setdefault(label, {})[alpha] = None
                continue
            table.setdefault(label, {})[alpha] = {
                "ours": 100 * s["final"][metric], "paper": PAPER[label][alpha], "metric": metric,
                "mean_round_seconds": s["mean_round_seconds"], "wall_seconds": s["wall_seconds"],
            }

    lines = [
        f"# MNIST, 20 clients, 50% participation, {args.rounds} rounds (paper: 50), seed {args.seed}",
        "",
        "Accuracy in %. Ours: one run; paper: Table 2 mean over repetitions. FedAvg/FedProx: global accuracy;",
        "the others: personalized macro accuracy. Command: "
        f"`python benchmarks/mnist_table2.py --rounds {args.rounds}`.",
        "s/round: mean wall seconds per round on this 2-core CPU machine, shared with other work while it ran",
        "(not a speed measurement). 'not run': the run did not fit in the session's CPU time; rerun the command",
        "(finished runs are skipped).",
        "",
        "| method | " + " | ".join(f"alpha={a} ours | paper | diff | s/round" for a in args.alphas) + " |",
        "|---|" + "---|---|---|---|" * len(args.alphas),
    ]
    for label, *_ in ROWS:
        cells = []
        for a in args.alphas:
            c = table[label][a]
            if c is None:
                cells.append("not run | " + f"{PAPER[label][a]:.2f} | | ")
                continue
            cells.append(f"{c['ours']:.2f} | {c['paper']:.2f} | {c['ours'] - c['paper']:+.2f} | "
                         f"{c['mean_round_seconds']:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "mnist_table2.md").write_text(text)
    (results / "mnist_table2.json").write_text(json.dumps(
        {"rounds": args.rounds, "seed": args.seed, "table": {k: {str(a): v for a, v in d.items()}
                                                            for k, d in table.items()}}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
