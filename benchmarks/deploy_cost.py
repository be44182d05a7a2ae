"""Seconds per round of a small deployed run, and where each message's seconds go.

    python benchmarks/deploy_cost.py --label after [--rounds 4] [--modes deployment/subprocess,...]
    python benchmarks/deploy_cost.py --label before --tree /path/to/an/older/checkout
    python benchmarks/deploy_cost.py --label no-carry --set evaluate_with_next_fit=false

Run: pFedKDH-EA on scikit-learn digits, 3 SuperNodes, all trained every round and all evaluated every
round (fraction_fit 1, eval_every 1), 1 local epoch, batch 32, feature_dim 64. Modes:

* ``simulation``: ``fedpers run`` (Ray; one process starts and stops everything);
* ``deployment/subprocess``: ``fedpers deploy local`` machinery: SuperLink + 3 SuperNodes on 127.0.0.1
  (TLS, SuperNode auth; from commit 5cf32ed on behind the nginx Fleet proxy), each SuperNode starting a fresh
  ClientApp process for every message;
* ``deployment/process``: the same with a separate ``flower-superexec`` per SuperNode.

Figures per mode: ``round_seconds`` from metrics.jsonl, their mean without round 1 (round 1 also asks
every node for its partition id), the wall time and the setup time. With ``evaluate_with_next_fit`` (the
default from commit 038c541 on) round t's evaluations run inside round t + 1's fit messages, and only the last
round sends evaluate messages: ``mean_round_s_after_first`` (rounds 2..R, the last round's evaluate
phase included) is what rounds 2..R cost together, per round; ``mean_round_s_between`` (rounds 2..R-1)
is a round in the middle of a longer run. The per-message breakdown:

* measured in fresh interpreters of the tree under test (works for any checkout): Python + Flower +
  fedpers + torch imports of the ClientApp module, and that plus loading the client's data (the
  federation: dataset + partition), i.e. what every message pays before it trains;
* where the tree has a ClientApp module of its own (``fedpers.client_app``, commit 7f4716d on;
  ``fedpers.apps.client_app`` from commit 70842b6 on), every ClientApp process of the run logs its
  own timeline (``FEDPERS_MESSAGE_TIMING``): process start -> message handed over (interpreter and
  imports) -> client built (data, model, state) -> reply ready (training or evaluation), per message
  type; the rest of a round (``round - fit phase - evaluate phase``) is polling, transfers and the
  server's own work.

Existing output files are never overwritten: a new ``--label`` (or ``--out``) is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", required=True, help="names the output file: deploy_cost_<label>.json")
    ap.add_argument("--tree", default=str(ROOT), help="checkout whose fedpers is measured (default: this one)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--modes", default="deployment/subprocess,deployment/process")
    ap.add_argument("--out", default="", help="default: benchmarks/results/deploy_cost_<label>.json")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config key of the run on top of the benchmark's (repeatable)")
    return ap.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None
TREE = Path(ARGS.tree).resolve() if ARGS else ROOT
sys.path.insert(0, str(TREE))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ["PYTHONPATH"] = str(TREE) + os.pathsep + os.environ.get("PYTHONPATH", "")

RUN = dict(method="pfedkdh", variant="ea", dataset="digits", fraction_fit=1.0, eval_every=1, local_epochs=1,
           batch_size=32, lr=0.05, recal_lr=0.05, ea_lr=0.05, aux_size=100, alpha=1.0, feature_dim=64,
           ea_steps=3, device="cpu")


def small_config(out: Path, rounds: int, clients: int, sets: list[str]):
    from fedpers.registry.config import build_config, parse_set_arguments

    return build_config({**RUN, "rounds": rounds, "num_clients": clients, "out_dir": str(out),
                         **parse_set_arguments(sets)})


def round_figures(out: Path, wall: float) -> dict:
    from fedpers.core.results import read_metrics

    secs = [r["round_seconds"] for r in read_metrics(out)]
    return {"round_seconds": [round(s, 2) for s in secs],
            "mean_round_s_after_first": round(statistics.mean(secs[1:]), 2) if len(secs) > 1 else None,
            "mean_round_s_between": round(statistics.mean(secs[1:-1]), 2) if len(secs) > 2 else None,
            "wall_s": round(wall, 1), "setup_and_teardown_s": round(wall - sum(secs), 1)}


def run_simulation(cfg) -> float:
    import yaml

    config_file = Path(cfg.out_dir).with_suffix(".yaml")
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    t0 = time.perf_counter()
    # `python -m fedpers` from commit 70842b6 on; the trees before it have only fedpers/cli.py
    entry = "fedpers" if (TREE / "fedpers" / "__main__.py").is_file() else "fedpers.cli"
    subprocess.run([sys.executable, "-m", entry, "run", str(config_file)], check=True, cwd=TREE,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def run_deployment(cfg, isolation: str) -> float:
    from fedpers.apps.deploy import LocalDeployment, deploy_config

    out = Path(cfg.out_dir)
    cfg = deploy_config(cfg, out, resume=False)
    t0 = time.perf_counter()
    with LocalDeployment(out / "deploy", cfg.num_clients, isolation=isolation) as dep:
        dep.run(cfg, timeout=3600)
    return time.perf_counter() - t0


def clientapp_module() -> str:
    """The ClientApp's module as the tree's pyproject names it (``fedpers.app`` before commit 7f4716d)."""
    import tomllib

    components = tomllib.loads((TREE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    return components["clientapp"].split(":")[0]


def fresh_process_seconds(code: str, repeats: int = 3) -> float:
    """Best-of-``repeats`` wall time of a fresh interpreter running ``code`` in the tree under test."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=TREE)
        times.append(time.perf_counter() - t0)
    return round(min(times), 2)


def per_process_costs() -> dict:
    module = clientapp_module()
    run = json.dumps(dict(RUN, num_clients=3))
    # the trees before commit 70842b6 keep these modules at fedpers' top level
    load = (f"import {module}\ntry:\n from fedpers.registry.config import build_config\n"
            f" from fedpers.core.federation import get_federation\nexcept ImportError:\n"
            f" from fedpers.config import build_config\n from fedpers.federation import get_federation\n"
            f"get_federation(build_config({run}))")
    return {"clientapp_module": module,
            "bare_python_s": fresh_process_seconds("pass"),
            "python_and_clientapp_imports_s": fresh_process_seconds(f"import {module}"),
            "imports_and_client_data_s": fresh_process_seconds(load)}


def message_breakdown(timing_file: Path, rounds: list[float]) -> dict | None:
    """Per message type: mean seconds from process start to hand-over, to client built, to reply;
    per round: the fit and evaluate phases' spans (first process start to last reply)."""
    if not timing_file.is_file():
        return None
    records = [json.loads(line) for line in timing_file.read_text().splitlines() if line.strip()]
    out: dict = {"messages": len(records)}
    for kind in sorted({r["type"] for r in records}):
        rs = [r for r in records if r["type"] == kind and r["process_start"] and r["client_built"]]
        if rs:
            out[kind] = {"count": len(rs),
                         "process_start_to_handover_s": _mean(r["handed_over"] - r["process_start"] for r in rs),
                         "handover_to_client_built_s": _mean(r["client_built"] - r["handed_over"] for r in rs),
                         "client_built_to_reply_s": _mean(r["reply_ready"] - r["client_built"] for r in rs)}
    phases = []
    for group in sorted({r["group"] for r in records if r["group"]}, key=lambda g: int(g)):
        phase = {}
        for kind in ("train", "evaluate"):
            rs = [r for r in records if r["group"] == group and r["type"] == kind and r["process_start"]]
            if rs:
                phase[kind] = round(max(r["reply_ready"] for r in rs) - min(r["process_start"] for r in rs), 2)
        phases.append({"round": int(group), **phase})
    for phase, secs in zip(phases, rounds):
        phase["rest_s"] = round(secs - phase.get("train", 0.0) - phase.get("evaluate", 0.0), 2)
    out["phases"] = phases
    later = phases[1:] or phases
    out["mean_after_first"] = {k: _mean(p[k] for p in later if k in p) for k in ("train", "evaluate", "rest_s")}
    return out


def _mean(values) -> float:
    values = list(values)
    return round(statistics.mean(values), 3) if values else 0.0


def main() -> None:
    args = ARGS
    out_file = Path(args.out or ROOT / "benchmarks" / "results" / f"deploy_cost_{args.label}.json")
    if out_file.exists():
        raise SystemExit(f"{out_file} exists: results are never overwritten (choose another --label or --out)")
    results: dict = {"label": args.label, "tree": str(TREE),
                     "commit": subprocess.run(["git", "-C", str(TREE), "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip(),
                     # the commit's code, or changes on top of it (the figures are then of the working tree)
                     "uncommitted_changes": bool(subprocess.run(
                         ["git", "-C", str(TREE), "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True).stdout.strip()),
                     "run": f"pfedkdh-ea, digits, {args.clients} SuperNodes, {args.rounds} rounds, all trained "
                            "and evaluated every round, local_epochs 1, feature_dim 64",
                     "set": args.sets,
                     "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                                f"load avg {os.getloadavg()[0]:.1f} at start",
                     "per_process": per_process_costs(), "modes": {}}
    print(json.dumps(results["per_process"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="fedpers-cost-") as tmp:
        for mode in args.modes.split(","):
            out = Path(tmp) / mode.replace("/", "-")
            timing = Path(tmp) / f"{mode.replace('/', '-')}-messages.jsonl"
            os.environ["FEDPERS_MESSAGE_TIMING"] = str(timing)
            cfg = small_config(out, args.rounds, args.clients, args.sets)
            wall = run_simulation(cfg) if mode == "simulation" else run_deployment(cfg, mode.split("/")[1])
            figures = round_figures(out, wall)
            figures["breakdown"] = message_breakdown(timing, figures["round_seconds"])
            results["modes"][mode] = figures
            print(f"{mode:24s} {json.dumps(figures)}", flush=True)
    results["load_avg_at_end"] = round(os.getloadavg()[0], 1)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written {out_file}")


if __name__ == "__main__":
    main()
