"""Seconds per round of the same run on a private local Ray (2 CPUs) and on a two-node Ray cluster on
this machine (head + worker as separate processes, 1 CPU each: the same total), in one invocation.

    python benchmarks/ray_cluster.py [--rounds 6] [--dataset digits]

Writes benchmarks/results/ray_cluster.json. Round 1 includes actor start-up and is reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from fedpers.core.cluster import LocalRayCluster
from fedpers.registry.config import build_config
from fedpers.core.results import read_metrics
from fedpers.apps.simulation import run_simulation

HERE = Path(__file__).resolve().parent


def one_run(overrides: dict, label: str) -> dict:
    out = tempfile.mkdtemp(prefix=f"fedpers-bench-{label}-")
    cfg = build_config(dict(overrides, out_dir=out))
    t0 = time.perf_counter()
    run_simulation(cfg)
    wall = time.perf_counter() - t0
    rounds = read_metrics(out)
    later = [r["round_seconds"] for r in rounds[1:]]
    nodes = {n for r in rounds for n in r["fit_nodes"].values()}
    return {"label": label, "wall_seconds": wall, "round1_seconds": rounds[0]["round_seconds"],
            "mean_round_seconds_after_round1": sum(later) / len(later), "nodes_used": len(nodes),
            "final_personalized_macro_acc": rounds[-1]["personalized_macro_acc"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--dataset", default="digits")
    args = p.parse_args()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    base = dict(method="pfedkdh", dataset=args.dataset, num_clients=10, fraction_fit=0.5, rounds=args.rounds,
                local_epochs=2, batch_size=32, lr=0.05, recal_lr=0.05, aux_size=300, device="cpu",
                client_cpus=1.0, alpha=0.5)
    results = [one_run(base, "local_ray_2cpu")]
    with LocalRayCluster(num_nodes=2, cpus_per_node=1) as cluster:
        results.append(one_run(dict(base, ray_address=cluster.address), "two_node_cluster_1+1cpu"))
    ratio = results[1]["mean_round_seconds_after_round1"] / results[0]["mean_round_seconds_after_round1"]
    report = {"command": f"python benchmarks/ray_cluster.py --rounds {args.rounds} --dataset {args.dataset}",
              "runs": results, "cluster_over_local_seconds_per_round": ratio}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "ray_cluster.json").write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        print(f"{r['label']:26s} round 1 {r['round1_seconds']:6.1f} s | later rounds "
              f"{r['mean_round_seconds_after_round1']:6.2f} s/round | nodes used {r['nodes_used']}")
    print(f"cluster / local seconds per round: {ratio:.2f}")


if __name__ == "__main__":
    main()
