"""Scale of the Ray simulation: 100 and 1,000 clients with 10% participation, pFedKDH and FedEAGD on MNIST.

For each (method, clients) it runs ``fedpers run`` as a child process and samples the memory of the whole
process tree (driver, Ray's GCS/raylet and the client actors) from /proc, and reports

* seconds per round of the training-only rounds (every round but the last; the last one also evaluates
  all clients, reported apart),
* the peak summed RSS and PSS of the process tree and the driver's peak RSS (Flower's simulation engine
  keeps every client's ``context.state`` in the driver).

Clients get an IID split (1,000 clients hold ~55 MNIST images each; a Dirichlet split that small leaves
clients empty), |Ds| = 5000 for pFedKDH, 1 local epoch. The runs (``--runs``, CLIENTS:FRACTION[:spill]):
100 and 1,000 clients at 10% (the issue's setting; the data trained per round is the same, the number of
sampled clients grows 10x), 1,000 clients at 1% (as many sampled clients as 100 at 10%: the cost of the
clients that are *not* sampled), and 1,000 at 10% with ``client_state_spill`` (client state on disk
instead of in the driver's memory). A finished run's measurement is kept in its directory
(``measure.json``), so the script resumes.

    python benchmarks/scale.py --data ../shared/data/mnist.npz --rounds 4

Writes benchmarks/results/scale.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from proctree import run_sampled  # noqa: E402


def measure(method: str, run: str, args: argparse.Namespace) -> dict:
    """Run (or reuse) one CLIENTS:FRACTION[:spill] run of ``method`` under the memory sampler."""
    clients, fraction, *flags = run.split(":")
    clients, fraction, spill = int(clients), float(fraction), "spill" in flags
    out = Path(args.out) / (f"{method}_k{clients}" + (f"_f{fraction}" if fraction != 0.1 else "")
                            + ("_spill" if spill else ""))
    if (out / "measure.json").exists():
        return json.loads((out / "measure.json").read_text())
    sets = {"method": method, "dataset": args.data, "partition": "iid", "num_clients": clients,
            "fraction_fit": fraction, "rounds": args.rounds, "eval_every": args.rounds, "local_epochs": 1,
            "aux_size": 5000 if method == "pfedkdh" else 0, "min_samples_per_client": 1, "device": "cpu",
            "client_state_spill": spill}
    cmd = [sys.executable, "-m", "fedpers", "run", "--out", str(out)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    rc, sampler = run_sampled(cmd, cwd=HERE.parent, interval=args.interval, timeout=args.timeout)
    if rc != 0:
        return {"method": method, "clients": clients, "fraction": fraction, "spill": spill,
                "error": f"run failed ({rc})"}
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_only = [r["round_seconds"] for r in rounds[1:-1]] or [rounds[0]["round_seconds"]]
    result = {"method": method, "clients": clients, "fraction": fraction, "spill": spill,
              "sampled_per_round": len(rounds[0]["fit_clients"]),
            "wall_seconds": time.perf_counter() - start, "round1_seconds": rounds[0]["round_seconds"],
            "seconds_per_round": sum(train_only) / len(train_only),
            "last_round_with_full_eval_seconds": rounds[-1]["round_seconds"],
            "final_personalized_macro_acc": rounds[-1]["personalized_macro_acc"],
            **{f"peak_{k}": v for k, v in sampler.peak.items()}}
    (out / "measure.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--runs", nargs="+", default=["100:0.1", "1000:0.1", "1000:0.01", "1000:0.1:spill"],
                   help="CLIENTS:FRACTION[:spill] per run")
    p.add_argument("--methods", nargs="+", default=["pfedkdh", "fedeagd"])
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default=str(HERE / "results" / "scale_runs"))
    args = p.parse_args()
    rows = [measure(m, run, args) for m in args.methods for run in args.runs]
    gb = 1e9
    lines = [f"# Scale: MNIST, IID, {args.rounds} rounds, 1 local epoch, CPU (2 cores)", "",
             f"Command: `python benchmarks/scale.py --rounds {args.rounds}`. Memory sampled every {args.interval} s "
             "over the whole process tree; RSS sums count shared pages once per process, PSS splits them.", "",
             "| method | clients | participation | state | sampled/round | s/round (training rounds) | round 1 s | "
             "last round (+eval of all) s | peak tree PSS GB | peak tree RSS GB | peak driver RSS GB |",
             "|---|" + "---|" * 10]
    for r in rows:
        run = f"| {r['method']} | {r['clients']} | {r['fraction']:.0%} | {'disk' if r['spill'] else 'memory'} | "
        if "error" in r:
            lines.append(run + f"{r['error']} |||||||")
            continue
        lines.append(run + f"{r['sampled_per_round']} | {r['seconds_per_round']:.1f} | {r['round1_seconds']:.1f} | "
                     f"{r['last_round_with_full_eval_seconds']:.1f} | {r['peak_tree_pss'] / gb:.2f} | "
                     f"{r['peak_tree_rss'] / gb:.2f} | {r['peak_driver_rss'] / gb:.2f} |")
    text = "\n".join(lines) + "\n"
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "scale.md").write_text(text)
    (HERE / "results" / "scale.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
