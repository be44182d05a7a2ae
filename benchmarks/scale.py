"""Scale of the Ray simulation: pFedKDH and FedEAGD with 100 to 10,000 clients on MNIST.

Each run is ``fedpers run`` in a child process while the memory of its whole process tree (driver, Ray's
GCS/raylet, the client actors) is sampled from /proc. Clients get an IID split (every class dealt in turn:
at 10,000 clients each holds 5-6 training images and one test image), 1 local epoch, |Ds| = 5,000 for
pFedKDH, ``eval_clients`` = 100 clients evaluated in rounds 2 and 4 of 4 (a seeded sample; every client
when there are 100). Round 1 also pays the start-up that grows with the clients: the server asks every
node once for its partition id (one Flower message per node). Reported per run:

* seconds of the start-up round (1), of a training round (3) and of a round that also evaluates (2, 4);
* peak driver RSS and peak tree PSS (PSS splits shared pages between processes), and the driver memory
  that ``fedpers run`` estimated before starting (its printed line);
* bytes of client state on disk per client that holds any (``client_state_spill``).

The runs (``--runs``, CLIENTS:FRACTION:STATE with STATE memory or disk): 100 clients at 100 % is the
reference for 10,000 at 1 % (100 sampled clients each), and 10,000 at 10 % is run only when
``fedpers run``'s estimate fits this machine. A finished run's measurement is kept in its directory
(``measure.json``), so the script resumes where it stopped.

    python benchmarks/scale.py --data ../shared/data/mnist.npz

Writes benchmarks/results/scale/table.md and .json (the earlier table: benchmarks/results/scale.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from proctree import run_fedpers_sampled  # noqa: E402
from report_files import write_report  # noqa: E402

RUNS = ["100:1.0:disk", "100:0.1:disk", "1000:0.1:disk", "1000:0.01:disk", "10000:0.01:disk",
        "10000:0.01:memory", "1000:0.1:memory", "10000:0.1:disk"]
ROUNDS, EVAL_EVERY, EVAL_CLIENTS = 4, 2, 100
GB = 1e9


def run_dir(out: Path, method: str, clients: int, fraction: float, state: str) -> Path:
    """Where one run's results and measurement live."""
    return out / f"{method}_k{clients}_f{fraction:g}_{state}"


def measure(method: str, run: str, args: argparse.Namespace) -> dict:
    """Run (or reuse) one CLIENTS:FRACTION:STATE run of ``method`` under the memory sampler."""
    clients, fraction, state = run.split(":")
    clients, fraction = int(clients), float(fraction)
    if state not in ("memory", "disk"):
        raise SystemExit(f"--runs {run}: STATE must be memory or disk")
    out = run_dir(Path(args.out), method, clients, fraction, state)
    if (out / "measure.json").exists():
        return json.loads((out / "measure.json").read_text())
    sets = {"method": method, "dataset": args.data, "partition": "iid", "num_clients": clients,
            "fraction_fit": fraction, "rounds": ROUNDS, "eval_every": EVAL_EVERY, "eval_clients": EVAL_CLIENTS,
            "local_epochs": 1, "aux_size": 5000 if method == "pfedkdh" else 0, "min_samples_per_client": 1,
            "device": "cpu", "client_state_spill": state == "disk"}
    if state == "disk":  # a directory of ours, so that the run leaves it for the bytes to be counted
        sets["client_state_dir"] = str(out / "client_state")
    out.mkdir(parents=True, exist_ok=True)
    rc, sampler, log, wall = run_fedpers_sampled(sets, out, cwd=HERE.parent, interval=args.interval,
                                                 timeout=args.timeout)
    base = {"method": method, "clients": clients, "fraction": fraction, "state": state}
    text = log.read_text()
    if rc != 0:
        refused = re.search(r"fedpers: error: (the run needs about .*)", text)
        return {**base, "error": refused.group(1) if refused else f"run failed ({rc}), see {log.name}"}
    estimate = re.search(r"memory estimate: host ([0-9.]+) GiB.*?\(driver ([0-9.]+) GiB", text)
    rounds = {r["round"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    state_dirs = [d for d in out.glob("client_state/partition-*") if d.is_dir()]
    state_bytes = sum(f.stat().st_size for d in state_dirs for f in d.rglob("*") if f.is_file())
    result = {**base, "sampled_per_round": len(rounds[1]["fit_clients"]),
              "evaluated_per_round": rounds[ROUNDS]["evaluated_clients"],
              "wall_seconds": wall,
              "startup_round_seconds": rounds[1]["round_seconds"],
              "training_round_seconds": rounds[3]["round_seconds"],
              "evaluation_round_seconds": (rounds[2]["round_seconds"] + rounds[4]["round_seconds"]) / 2,
              "estimated_host_gib": float(estimate.group(1)) if estimate else None,
              "estimated_driver_gib": float(estimate.group(2)) if estimate else None,
              "clients_with_state_on_disk": len(state_dirs),
              "state_bytes_per_client": state_bytes / len(state_dirs) if state_dirs else 0,
              "final_personalized_macro_acc": rounds[ROUNDS]["personalized_macro_acc"],
              **{f"peak_{k}": v for k, v in sampler.peak.items()}}
    (out / "measure.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the measured runs."""
    lines = ["| method | clients | participation | state | sampled / evaluated per round | start-up round s | "
             "training round s | evaluation round s | peak driver RSS GB | driver estimate GB | peak tree PSS GB | "
             "state on disk per client |", "|---|" + "---|" * 11]
    for r in rows:
        run = f"| {r['method']} | {r['clients']} | {r['fraction']:.0%} | {r['state']} | "
        if "error" in r:
            lines.append(run + f"{r['error']} |" + " |" * 7)
            continue
        disk = f"{r['state_bytes_per_client'] / 1e3:.0f} kB" if r["state"] == "disk" else "-"
        est = f"{r['estimated_driver_gib'] * 2**30 / GB:.2f}" if r["estimated_driver_gib"] else "?"
        lines.append(run + f"{r['sampled_per_round']} / {r['evaluated_per_round']} | "
                     f"{r['startup_round_seconds']:.1f} | {r['training_round_seconds']:.1f} | "
                     f"{r['evaluation_round_seconds']:.1f} | {r['peak_driver_rss'] / GB:.2f} | {est} | "
                     f"{r['peak_tree_pss'] / GB:.2f} | {disk} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mnist.npz"))
    p.add_argument("--runs", nargs="+", default=RUNS, help="CLIENTS:FRACTION:STATE per run (STATE: memory|disk)")
    p.add_argument("--methods", nargs="+", default=["pfedkdh", "fedeagd"])
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default=str(HERE / "results" / "scale_runs"))
    p.add_argument("--note", default="", help="a line on the conditions (e.g. what else ran) for the report")
    args = p.parse_args()
    rows = [measure(m, run, args) for m in args.methods for run in args.runs]
    lines = [f"# Scale: MNIST, IID, {ROUNDS} rounds, 1 local epoch, {EVAL_CLIENTS} clients evaluated in rounds "
             f"{EVAL_EVERY} and {ROUNDS}, CPU", "",
             "Command: `python benchmarks/scale.py`. Memory sampled every "
             f"{args.interval} s over the whole process tree. Start-up round: round 1, which also asks every node "
             "its partition id; training round: round 3; evaluation round: mean of rounds 2 and 4.", ""]
    if args.note:
        lines += [args.note, ""]
    text = "\n".join(lines + table(rows)) + "\n"
    write_report("scale/table", text, rows)


if __name__ == "__main__":
    main()
