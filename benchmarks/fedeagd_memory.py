"""Peak resident memory of a 100-client FedEAGD run (per-client EMA teachers) in Ray simulation.

Runs ``fedpers run`` on scikit-learn digits with ``--clients`` clients (Dirichlet(1.0) split, no Ds, full
participation), samples the whole process tree (driver, Ray's GCS/raylet, the client actors) from
``/proc`` every ``--interval`` seconds, and reports the peak of

* the summed RSS of the tree (shared pages counted once per process, an upper bound),
* the summed PSS of the tree (shared pages split between the processes that map them),
* the driver's RSS (Flower's simulation engine keeps every client's ``context.state`` in this process),
  split into its private heap (``RssAnon``) and shared memory (``RssShmem``: pages of Ray's object store
  that the driver wrote messages into),

next to the size of the per-client state the method keeps (EMA teacher + head + residual per client).
With ``--baseline fedper`` (default) the same run is repeated with FedPer (same data, the foundation's
CNN, a private head and no teacher), so the difference shows what the teachers cost. Writes
``benchmarks/results/fedeagd_memory.md`` and ``.json``.

    python benchmarks/fedeagd_memory.py --clients 100 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from proctree import run_sampled  # noqa: E402  (process-tree memory sampling, shared with scale.py)


def state_bytes(method: str, clients: int, feature_dim: int) -> dict[str, int]:
    """Bytes of the per-client state ``method`` keeps (fp32), per client and for all clients."""
    from fedpers.core.models import build_model, parameter_count
    from fedpers.registry.methods import get_method

    model = build_model((1, 8, 8), 10, feature_dim=feature_dim, kind=get_method(method).model)
    personal = parameter_count(model, "personal") * 4
    teacher = parameter_count(model, "backbone") * 4 if method == "fedeagd" else 0
    return {"personal_per_client": personal, "teacher_per_client": teacher,
            "state_per_client": personal + teacher, "state_all_clients": clients * (personal + teacher)}


def measure(method: str, args: argparse.Namespace) -> dict:
    out = Path(args.out) / f"{method}_k{args.clients}"
    cmd = [sys.executable, "-m", "fedpers", "run", "--out", str(out),
           "--set", f"method={method}", "--set", "dataset=digits", "--set", "partition=dirichlet", "--set", "alpha=1.0",
           "--set", f"num_clients={args.clients}", "--set", "fraction_fit=1.0", "--set", "aux_size=0",
           "--set", f"rounds={args.rounds}", "--set", f"eval_every={args.rounds}", "--set", "local_epochs=1",
           "--set", "batch_size=32", "--set", "lr=0.05", "--set", "min_samples_per_client=2",
           "--set", f"feature_dim={args.feature_dim}", "--set", "device=cpu", "--set", f"seed={args.seed}"]
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    rc, sampler = run_sampled(cmd, cwd=ROOT, interval=args.interval, timeout=args.timeout)
    if rc != 0:
        raise SystemExit(f"{method} run failed ({rc})")
    summary = json.loads((out / "summary.json").read_text())
    return {"method": method, "clients": args.clients, "rounds": args.rounds, "wall_seconds":
            time.perf_counter() - start, "samples": sampler.samples, **{f"peak_{k}": v for k, v in sampler.peak.items()},
            **state_bytes(method, args.clients, args.feature_dim),
            "final_personalized_macro_acc": summary["final"].get("personalized_macro_acc")}


def mb(n: int) -> str:
    return f"{n / 1e6:,.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--feature-dim", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", default="fedper", help="method to compare with ('' = none)")
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=str(HERE / "results" / "fedeagd_memory_runs"))
    p.add_argument("--name", default="fedeagd_memory", help="report name under benchmarks/results/")
    args = p.parse_args()

    rows = [measure("fedeagd", args)] + ([measure(args.baseline, args)] if args.baseline else [])
    cmdline = "python benchmarks/fedeagd_memory.py " + " ".join(sys.argv[1:])
    lines = [
        f"# Peak resident memory, {args.clients} clients, digits (Dirichlet 1.0), {args.rounds} rounds, Ray simulation",
        "",
        f"Command: `{cmdline.strip()}`. Sampled from /proc every {args.interval} s over the whole process tree",
        "(driver + Ray GCS/raylet + client actors). RSS sums count shared pages once per process; PSS splits",
        "them. MB = 10^6 bytes. Per-client state = what `context.state` holds for one client (fp32 arrays).",
        "",
        "| method | per-client state | all clients' state | peak driver RSS | driver heap (RssAnon) | driver shmem (RssShmem) | peak tree PSS | peak tree RSS | processes | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['method']} | {mb(r['state_per_client'])} MB | {mb(r['state_all_clients'])} MB | "
                     f"{mb(r['peak_driver_rss'])} MB | {mb(r['peak_driver_anon'])} MB | {mb(r['peak_driver_shmem'])} MB | "
                     f"{mb(r['peak_tree_pss'])} MB | {mb(r['peak_tree_rss'])} MB | "
                     f"{r['peak_processes']} | {r['wall_seconds']:.0f} |")
    if len(rows) == 2:
        a, b = rows
        lines += ["", f"Difference {a['method']} - {b['method']}: driver RSS {mb(a['peak_driver_rss'] - b['peak_driver_rss'])} MB "
                  f"(heap {mb(a['peak_driver_anon'] - b['peak_driver_anon'])} MB, shmem "
                  f"{mb(a['peak_driver_shmem'] - b['peak_driver_shmem'])} MB), "
                  f"tree PSS {mb(a['peak_tree_pss'] - b['peak_tree_pss'])} MB; difference in kept state "
                  f"{mb(a['state_all_clients'] - b['state_all_clients'])} MB."]
    text = "\n".join(lines) + "\n"
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / f"{args.name}.md").write_text(text)
    (results / f"{args.name}.json").write_text(json.dumps({"command": cmdline.strip(), "rows": rows}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
