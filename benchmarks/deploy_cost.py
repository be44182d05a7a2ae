"""Seconds per round of the same small run in Flower's Ray simulation and as a real deployment.

    python benchmarks/deploy_cost.py [--rounds 3] [--clients 3] [--out benchmarks/results/deploy_cost.json]

Run: pFedKDH-EA on scikit-learn digits, 3 clients, all sampled every round, 1 local epoch, feature_dim 64,
evaluation of every client every round (tests/conftest.py's tiny config). Modes:

* ``simulation``: ``fedpers run`` (Ray, one process starts and stops everything);
* ``deployment/subprocess``: ``fedpers deploy local`` machinery: SuperLink + 3 SuperNodes on 127.0.0.1,
  TLS, SuperNode auth; each SuperNode starts the ClientApp in a subprocess (via its SuperExec);
* ``deployment/process``: the same with ``--isolation process``: a separate ``flower-superexec`` per
  SuperNode starts the ClientApp processes.

Per mode: ``round_seconds`` from metrics.jsonl (configure_fit to the end of the round's evaluation),
their mean, the mean without round 1 (round 1 includes asking every node its partition id), the wall
time of the whole command and the setup time (wall minus the rounds). Also the cost of one fresh Python
process importing the ClientApp (torch + fedpers), which Flower 1.42 pays for every message in both
isolation modes. Figures go to stdout and ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

from fedpers.config import build_config  # noqa: E402
from fedpers.results import read_metrics  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402


def small_config(out: Path, rounds: int, clients: int):
    return build_config(tiny_overrides(method="pfedkdh", variant="ea", rounds=rounds, num_clients=clients,
                                       out_dir=str(out)))


def figures(out: Path, wall: float) -> dict:
    secs = [r["round_seconds"] for r in read_metrics(out)]
    return {"round_seconds": [round(s, 2) for s in secs], "mean_round_s": round(sum(secs) / len(secs), 2),
            "mean_round_s_after_first": round(sum(secs[1:]) / max(1, len(secs) - 1), 2),
            "wall_s": round(wall, 1), "setup_and_teardown_s": round(wall - sum(secs), 1)}


def run_simulation(cfg) -> float:
    import yaml

    config_file = Path(cfg.out_dir).with_suffix(".yaml")
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedpers.cli", "run", str(config_file)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def run_deployment(cfg, isolation: str) -> float:
    from fedpers.deploy import LocalDeployment, deploy_config

    out = Path(cfg.out_dir)
    cfg = deploy_config(cfg, out, resume=False)
    t0 = time.perf_counter()
    with LocalDeployment(out / "deploy", cfg.num_clients, isolation=isolation) as dep:
        dep.run(cfg, timeout=3600)
    return time.perf_counter() - t0


def clientapp_start_seconds(repeats: int = 3) -> float:
    """Wall time of a fresh interpreter importing the ClientApp (what every message pays)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import fedpers.app"], check=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return round(min(times), 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--modes", default="simulation,deployment/subprocess,deployment/process")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "deploy_cost.json"))
    args = ap.parse_args()
    results: dict = {"run": f"pfedkdh-ea, digits, {args.clients} clients, {args.rounds} rounds, fraction_fit 1.0, "
                            "local_epochs 1, feature_dim 64, eval every round",
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f} at start",
                     "clientapp_process_start_s": clientapp_start_seconds(), "modes": {}}
    with tempfile.TemporaryDirectory(prefix="fedpers-cost-") as tmp:
        for mode in args.modes.split(","):
            out = Path(tmp) / mode.replace("/", "-")
            cfg = small_config(out, args.rounds, args.clients)
            wall = run_simulation(cfg) if mode == "simulation" else run_deployment(cfg, mode.split("/")[1])
            results["modes"][mode] = figures(out, wall)
            print(f"{mode:24s} {json.dumps(results['modes'][mode])}", flush=True)
    results["load_avg_at_end"] = round(os.getloadavg()[0], 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"clientapp process start: {results['clientapp_process_start_s']} s | written {args.out}")


if __name__ == "__main__":
    main()
