"""What keeping glibc from returning freed memory to the kernel saves, and what it costs in memory.

``fedpers.core.allocator.retain_freed_memory`` (on by default) serves every block from glibc's heaps,
trims the main heap only past 1 GiB of free memory and keeps free thread heaps. This compares it with
glibc's own settings (``FEDPERS_MALLOC=system``) in fresh processes, the two alternating (A, B, A, B, ...)
so that a change of load touches both alike:

* one SGD step of each model on the studies' shapes (as ``benchmarks/memory_format.py``: channels-last
  batches): median milliseconds, minor page faults and kernel (system) time per step, peak resident memory;
* whole runs (``fedpers run --engine inprocess``, the engine of the JDFL studies) of FedAvg on PACS at 64x64
  and 112x112: wall seconds and the process's peak resident memory.

    python benchmarks/allocator.py --repeats 3 --steps 20 --runs 2

Writes benchmarks/results/allocator.json and .md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_format import SETTINGS  # noqa: E402  (the studies' step settings, timed there too)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
# the environment of each measured choice: glibc's own settings and ours (the default)
CHOICES = {"system": {"FEDPERS_MALLOC": "system"}, "retain": {}}
# whole runs: JDFL's setting A over FedAvg (jdfl off: no discovery), a few rounds
RUN_SETTINGS = [
    ("PACS 64x64, setting A, FedAvg", "../shared/data/pacs.npz"),
    ("PACS 112x112, setting A, FedAvg", "data/pacs112.npz"),
]
RUN_KEYS = {"partition": "domain", "aux_size": 0, "num_clients": 10, "fraction_fit": 1.0, "local_epochs": 1,
            "batch_size": 32, "lr": 0.01, "momentum": 0.0, "model_kind": "gn_cnn", "dropout": 0.0,
            "feature_dim": 128, "method": "fedavg", "jdfl": "off", "alpha": 1.0, "seed": 0, "device": "cpu",
            "resume": False, "tensorboard": False}

# One training step in a fresh process: the child applies (or not) the allocator settings first, as the
# run's entry points do, then times the steps after a warm-up.
STEP_CHILD = r"""
import json, resource, sys, time
from fedpers.core.allocator import retain_freed_memory
retain_freed_memory()
import torch, torch.nn.functional as F
from fedpers.core.federation import device_layout
from fedpers.core.models import build_model
from fedpers.core.training import sgd
kind, shape, classes, feature_dim, batch, lr, threads, steps = json.loads(sys.argv[1])
torch.set_num_threads(threads)
gen = torch.Generator().manual_seed(0)
x = device_layout(torch.rand(batch, *shape, generator=gen))
y = torch.randint(0, classes, (batch,), generator=gen)
model = build_model(tuple(shape), classes, feature_dim=feature_dim, seed=0, kind=kind)
opt = sgd(model.parameters(), lr)
def step():
    model.train(); opt.zero_grad(set_to_none=True); F.cross_entropy(model(x), y).backward(); opt.step()
for _ in range(3):
    step()
before, times = resource.getrusage(resource.RUSAGE_SELF), []
for _ in range(steps):
    start = time.perf_counter(); step(); times.append(time.perf_counter() - start)
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"step_seconds": sorted(times)[len(times) // 2],
                  "minor_faults": (after.ru_minflt - before.ru_minflt) / steps,
                  "system_seconds": (after.ru_stime - before.ru_stime) / steps,
                  "peak_rss_mib": after.ru_maxrss / 1024}))
"""


def child_env(choice: str, threads: int) -> dict:
    """The environment of a measured process: the choice's variables and no other malloc settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "FEDPERS_MALLOC")}
    return {**env, **CHOICES[choice], "OMP_NUM_THREADS": str(threads), "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def measure_steps(threads: int, repeats: int, steps: int) -> list[dict]:
    """Each setting's training step under both choices, ``repeats`` fresh processes each, alternating."""
    rows = []
    for name, kind, shape, classes, feature_dim, batch, lr in SETTINGS:
        arg = json.dumps([kind, shape, classes, feature_dim, batch, lr, threads, steps])
        got: dict[str, list[dict]] = {c: [] for c in CHOICES}
        for _ in range(repeats):
            for choice in CHOICES:
                res = subprocess.run([sys.executable, "-c", STEP_CHILD, arg], capture_output=True, text=True,
                                     env=child_env(choice, threads), cwd=ROOT, check=True)
                got[choice].append(json.loads(res.stdout.strip().splitlines()[-1]))
        med = {c: {k: float(np.median([g[k] for g in got[c]])) for k in got[c][0]} for c in CHOICES}
        rows.append({"setting": name, "input": list(shape), "batch": batch, "threads": threads, "median": med,
                     "ratio": med["retain"]["step_seconds"] / med["system"]["step_seconds"], "all": got})
        print(f"{threads} thread(s) | {name}: system {med['system']['step_seconds'] * 1e3:.1f} ms "
              f"({med['system']['minor_faults']:.0f} faults), retain {med['retain']['step_seconds'] * 1e3:.1f} ms "
              f"({med['retain']['minor_faults']:.0f} faults)", flush=True)
    return rows


def run_once(choice: str, dataset: str, rounds: int, out: Path) -> dict:
    """One ``fedpers run --engine inprocess``: wall seconds and the process's peak resident memory."""
    argv = [sys.executable, "-m", "fedpers", "run", "--engine", "inprocess"]
    for key, value in {**RUN_KEYS, "dataset": dataset, "rounds": rounds, "eval_every": rounds,
                       "out_dir": str(out), "checkpoint_dir": str(out / "checkpoint"),
                       "client_state_dir": str(out / "client_state")}.items():
        argv += ["--set", f"{key}={json.dumps(value)}"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=child_env(choice, threads=2), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"fedpers run failed ({choice}, {dataset}): {proc.stderr.read()[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_seconds": wall, "peak_rss_mib": usage.ru_maxrss / 1024, "minor_faults": usage.ru_minflt,
            "system_seconds": usage.ru_stime, "final": summary["final"]}


def measure_runs(runs: int, rounds: int) -> list[dict]:
    """Each whole run under both choices, ``runs`` times each, alternating; same numbers both ways."""
    rows = []
    for name, dataset in RUN_SETTINGS:
        if not (ROOT / dataset).exists():
            print(f"skipped {name}: {dataset} is missing (docs/data.md says how to build it)", flush=True)
            continue
        got: dict[str, list[dict]] = {c: [] for c in CHOICES}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(runs):
                for choice in CHOICES:
                    got[choice].append(run_once(choice, dataset, rounds, Path(tmp) / f"{choice}{i}"))
        finals = {json.dumps(g["final"], sort_keys=True) for c in CHOICES for g in got[c]}
        med = {c: {k: float(np.median([g[k] for g in got[c]])) for k in ("wall_seconds", "peak_rss_mib",
                                                                       "minor_faults", "system_seconds")}
               for c in CHOICES}
        rows.append({"setting": name, "dataset": dataset, "rounds": rounds, "median": med,
                     "ratio": med["retain"]["wall_seconds"] / med["system"]["wall_seconds"],
                     "same_results": len(finals) == 1, "all": got})
        print(f"run | {name}: system {med['system']['wall_seconds']:.1f} s / {med['system']['peak_rss_mib']:.0f} "
              f"MiB, retain {med['retain']['wall_seconds']:.1f} s / {med['retain']['peak_rss_mib']:.0f} MiB; "
              f"same results: {len(finals) == 1}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per setting and choice")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=2, help="whole runs per setting and choice (0: none)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each whole run")
    args = parser.parse_args()
    steps = [row for threads in args.threads for row in measure_steps(threads, args.repeats, args.steps)]
    runs = measure_runs(args.runs, args.rounds) if args.runs else []
    OUT.mkdir(exist_ok=True)
    import torch

    result = {"torch": torch.__version__, "glibc": os.confstr("CS_GNU_LIBC_VERSION"), "args": vars(args),
              "steps": steps, "runs": runs}
    (OUT / "allocator.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# glibc's allocator: freed memory retained against returned (benchmarks/allocator.py)", "",
             f"`python benchmarks/allocator.py --repeats {args.repeats} --steps {args.steps} --threads "
             f"{' '.join(map(str, args.threads))} --runs {args.runs} --rounds {args.rounds}` "
             f"({result['glibc']}, torch {result['torch']}): `system` is glibc's own settings "
             "(`FEDPERS_MALLOC=system`), `retain` ours (the default); fresh processes, the two alternating; medians.",
             "", "One SGD step (channels-last batches): milliseconds, minor page faults and kernel milliseconds per "
             "step, the process's peak resident MiB.", "",
             "| setting | threads | system ms | retain ms | retain / system | faults system / retain | "
             "kernel ms system / retain | peak MiB system / retain |", "|---|---|---|---|---|---|---|---|"]
    for r in steps:
        s, k = r["median"]["system"], r["median"]["retain"]
        lines.append(f"| {r['setting']} (batch {r['batch']}) | {r['threads']} | {s['step_seconds'] * 1e3:.1f} | "
                     f"{k['step_seconds'] * 1e3:.1f} | {r['ratio']:.2f} | {s['minor_faults']:.0f} / "
                     f"{k['minor_faults']:.0f} | {s['system_seconds'] * 1e3:.1f} / {k['system_seconds'] * 1e3:.1f} | "
                     f"{s['peak_rss_mib']:.0f} / {k['peak_rss_mib']:.0f} |")
    if runs:
        lines += ["", f"Whole runs (`fedpers run --engine inprocess`, 2 threads, {args.rounds} rounds, "
                  "10 clients, 1 local epoch, every client every round, data loading and evaluation included): "
                  "wall seconds and the process's peak resident MiB; `same results`: the final accuracies of "
                  "every run agree.", "",
                  "| run | system s | retain s | retain / system | peak MiB system / retain | same results |",
                  "|---|---|---|---|---|---|"]
        for r in runs:
            s, k = r["median"]["system"], r["median"]["retain"]
            same = "yes" if r["same_results"] else "no"
            lines.append(f"| {r['setting']} | {s['wall_seconds']:.1f} | {k['wall_seconds']:.1f} | {r['ratio']:.2f} "
                         f"| {s['peak_rss_mib']:.0f} / {k['peak_rss_mib']:.0f} | {same} |")
    text = "\n".join(lines) + "\n"
    (OUT / "allocator.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
