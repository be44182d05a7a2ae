"""pFedKDH paper, Table 2 (MNIST column), every method fedpers has for it, next to the paper.

Runs pFedKDH (one run gives both Fair and EA: they share training and differ only at evaluation), the
shared-model baselines FedAvg and FedProx, and the personalized baselines FedPer, Ditto, pFedMe, FedRep,
FedBABU, FedProto, FedALA, FedFed, pFedSim and FedAS on MNIST with 20 clients, 50% participation,
alpha in {0.05, 0.5}, one seed, at the paper's Table 1 budget (2 local epochs, batch 64, lr 0.015,
|Ds| = 5000 removed from the clients for every method) except the number of rounds (``--rounds``; the paper
uses 50). A baseline runs from its ready config ``configs/baselines/<method>.yaml`` (the papers'
hyperparameters); FedFed's feature-distillation rounds are scaled to the budget (15 of 50 in the config).
Every run is evaluated once, after its last round, on the metric its ``summary.json`` names (global accuracy
for FedAvg/FedProx, personalized macro accuracy for the others).

Seconds per round: ``train s/round`` is the mean over rounds 2 .. R-1 (no evaluation; round 1 also pays
Ray's actor warm-up), or round 1 when R <= 2; ``x FedPer`` divides it by FedPer's in the same column, the
paper's cost comparison (it reports pFedKDH at about 1.6x FedPer). Writes
``benchmarks/results/mnist_table2_r<R>.md`` and ``.json``; finished runs are skipped, so it resumes, and a
failed run is reported in the table instead of stopping the others.

    python benchmarks/mnist_table2.py --data ../shared/data/mnist.npz --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fedpers.apps.sweep import load_sweep

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TABLE2 = ROOT / "configs" / "sweeps" / "pfedkdh_table2.yaml"  # Table 2's one declaration: rows, paper numbers
# methods fedpers has that the paper's Table 2 does not list, run after its rows
NOT_IN_PAPER = [("pFedSim", "pfedsim", [], None), ("FedAS", "fedas", [], None)]


def table2_rows() -> tuple[list[tuple[str, str, list[str], str | None]], dict[str, dict[float, float]]]:
    """(label, method, extra --set, metric or None) of every row, and the paper's MNIST numbers
    {label: {alpha: %}}, both read from Table 2's sweep file."""
    sweep = load_sweep(TABLE2)
    rows = [(m.label, m.method, [f"{k}={v}" for k, v in m.set.items()], m.metric) for m in sweep.methods]
    paper = {label: {float(column.split("_a")[1]): value for column, value in cells.items()
                     if column.startswith("mnist_a")} for label, cells in sweep.paper.items()}
    return rows + NOT_IN_PAPER, paper


def budget_sets(method: str, rounds: int) -> list[str]:
    """Keys a method needs scaled from the paper's 50 rounds to ``rounds``."""
    if method == "fedfed":  # 15 of 50 rounds distil features (FedFed's code); keep the proportion
        return [f"fedfed_distill_rounds={max(1, round(15 * rounds / 50))}"]
    return []


def run_dir(method: str, alpha: float, args: argparse.Namespace) -> Path:
    """Where the run of ``method`` at ``alpha`` (with the script's rounds and seed) writes its results."""
    return Path(args.out) / f"{method}_a{alpha}_r{args.rounds}_s{args.seed}"


def run_one(method: str, alpha: float, extra: list[str], args: argparse.Namespace) -> dict:
    """Run (or reuse) one experiment; return its summary, {} if not run, {"error": ...} if it failed."""
    out = run_dir(method, alpha, args)
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    if args.table_only:
        return {}
    cmd = [sys.executable, "-m", "fedpers", "run"]
    ready = ROOT / "configs" / "baselines" / f"{method}.yaml"
    if ready.exists():
        cmd.append(str(ready))
    cmd += ["--out", str(out), "--set", f"method={method}", "--set", f"dataset={args.data}",
            "--set", f"alpha={alpha}", "--set", f"rounds={args.rounds}", "--set", f"eval_every={args.rounds}",
            "--set", f"seed={args.seed}"]
    for item in extra + budget_sets(method, args.rounds):
        cmd += ["--set", item]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode != 0:
        print(f"!! {method} alpha={alpha} failed (exit {done.returncode}); continuing", flush=True)
        return {"error": f"exit {done.returncode}"}
    return json.loads((out / "summary.json").read_text())


def round_seconds(out: Path) -> tuple[float, float]:
    """(mean seconds of the training-only rounds 2..R-1 (round 1 if R <= 2), seconds of the last round)."""
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r["round_seconds"] for r in rounds[1:] if not r.get("evaluated_clients")]
    if not train:
        train = [rounds[0]["round_seconds"]]
    return sum(train) / len(train), rounds[-1]["round_seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.05, 0.5])
    p.add_argument("--methods", nargs="+", default=None, help="method names to run (default: every row)")
    p.add_argument("--out", default=str(HERE / "results" / "mnist_table2_runs"))
    p.add_argument("--table-only", action="store_true", help="write the table from finished runs, run nothing")
    p.add_argument("--note", default="", help="a line added under the table's header (e.g. how it was measured)")
    args = p.parse_args()

    all_rows, paper_numbers = table2_rows()
    rows = [row for row in all_rows if args.methods is None or row[1] in args.methods]
    table: dict[str, dict[float, dict | None]] = {}
    for alpha in args.alphas:  # a whole column first: if time runs out, one alpha is complete
        summaries: dict[tuple, dict] = {}
        for label, method, extra, metric in rows:
            key = (method, tuple(extra))
            if key not in summaries:
                summaries[key] = run_one(method, alpha, extra, args)
            s = summaries[key]
            if not s or "error" in s:
                table.setdefault(label, {})[alpha] = s.get("error") if s else None
                continue
            train_s, last_s = round_seconds(run_dir(method, alpha, args))
            name = metric or s["metric"]
            table.setdefault(label, {})[alpha] = {
                "ours": 100 * s["final"][name], "paper": paper_numbers.get(label, {}).get(alpha), "metric": name,
                "train_round_seconds": train_s, "last_round_seconds": last_s,
                "mean_round_seconds": s["mean_round_seconds"], "wall_seconds": s["wall_seconds"],
            }

    def fedper_seconds(alpha: float) -> float | None:
        c = table.get("FedPer", {}).get(alpha)
        return c["train_round_seconds"] if isinstance(c, dict) else None

    lines = [
        f"# MNIST, 20 clients, 50% participation, {args.rounds} rounds (paper: 50), seed {args.seed}",
        "",
        "Accuracy in %. Ours: one run, evaluated after the last round; paper: Table 2 mean over repetitions",
        "('-': not in the paper's table). FedAvg/FedProx: global accuracy; the others: personalized macro",
        f"accuracy. Command: `python benchmarks/mnist_table2.py --rounds {args.rounds}`.",
        "train s: mean wall seconds of the rounds without evaluation after round 1 (round 1 when rounds <= 2);",
        "x FedPer: train s over FedPer's; last s: the last round, which also evaluates every client (FedBABU",
        "fine-tunes there). 2-core CPU machine; 'not run': did not fit in the session's CPU time (rerun the",
        "command: finished runs are skipped).",
        *([args.note] if args.note else []),
        "",
        "| method | " + " | ".join(f"a={a} ours | paper | diff | train s | x FedPer | last s" for a in args.alphas)
        + " |",
        "|---|" + "---|---|---|---|---|---|" * len(args.alphas),
    ]
    for label, *_ in rows:
        cells = []
        for a in args.alphas:
            c = table[label][a]
            paper = paper_numbers.get(label, {}).get(a)
            paper_text = f"{paper:.2f}" if paper is not None else "-"
            if not isinstance(c, dict):
                cells.append(f"{'failed: ' + c if c else 'not run'} | {paper_text} | | | | ")
                continue
            diff = f"{c['ours'] - paper:+.2f}" if paper is not None else ""
            ref = fedper_seconds(a)
            ratio = f"{c['train_round_seconds'] / ref:.2f}" if ref else ""
            cells.append(f"{c['ours']:.2f} | {paper_text} | {diff} | {c['train_round_seconds']:.1f} | {ratio} | "
                         f"{c['last_round_seconds']:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    stem = f"mnist_table2_r{args.rounds}"
    (results / f"{stem}.md").write_text(text)
    (results / f"{stem}.json").write_text(json.dumps(
        {"rounds": args.rounds, "seed": args.seed, "data": args.data,
         "table": {k: {str(a): v for a, v in d.items()} for k, d in table.items()}}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
