"""JDFL on PACS setting A (JDFL paper Sec. 5.1, Table 1 and Fig. 3(b)) next to each base optimizer alone.

Rows: FedAvg, SCAFFOLD, FedDyn, FedDC, FedProc, each standalone (C-way head, standard accuracy), + JDFL
graded and + JDFL random (M x C head, class-only accuracy); the discovery's M and ARI against the true
domains; and the M sweep 2..7 of FedAvg + JDFL (graded and random). One seed. Writes
``benchmarks/results/jdfl_pacs.md`` and ``.json``; finished runs (``summary.json`` present) are reused,
so the script resumes.

Settings: configs/jdfl/pacs_A.yaml (10 clients, one domain each, E=1, all clients every round, SGD lr
0.01, GroupNorm CNN, E0=3) with ``--rounds`` rounds, evaluation only at the last round, and optionally
images downsampled (``--size``, bilinear, a derived .npz written once next to the runs) and a smaller
discovery (``--e0``) to fit a CPU budget; the table header records the exact values.

``--engine ray`` runs each experiment with ``fedpers run`` (Flower's Ray simulation); ``--engine
inprocess`` (default; no Ray start-up per run, which dominates short CPU runs) drives the same Strategy
and NumPyClient classes through Flower's own round loop (``flwr.server.Server.fit``) with in-process
client proxies, one persistent ``Context`` per client.

    python benchmarks/jdfl_pacs.py --rounds 3 --size 32 --e0 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

OPTIMIZERS = [("FedAvg", "fedavg"), ("SCAFFOLD", "scaffold"), ("FedDyn", "feddyn"), ("FedDC", "feddc"),
              ("FedProc", "fedproc")]
MODES = [("standalone", "off"), ("+JDFL graded", "graded"), ("+JDFL random", "random")]
SWEEP = [2, 3, 4, 5, 6, 7]


def resized_pacs(src: Path, size: int, out_dir: Path) -> Path:
    """PACS with images resized to size x size (same splits, labels and domain ids); written once."""
    if size <= 0:
        return src
    dst = out_dir / f"pacs{size}.npz"
    if not dst.exists():
        import torch
        import torch.nn.functional as F

        with np.load(src) as f:
            data = {k: f[k] for k in f.files if not k.startswith("paths")}
        for split in ("x_train", "x_test"):
            x = torch.as_tensor(data[split]).permute(0, 3, 1, 2).float()
            y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
            data[split] = y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
        data["resolution"] = np.array(size)
        out_dir.mkdir(parents=True, exist_ok=True)
        np.savez(dst, **data)
    return dst


class InProcessProxy:
    """A Flower ClientProxy that calls a fedpers NumPyClient in this process (a fresh client object per
    message, as Flower does, with one persistent Context per partition)."""

    def __new__(cls, *args, **kwargs):  # build the subclass lazily so flwr is imported only when used
        from flwr.server.client_proxy import ClientProxy

        class _Proxy(ClientProxy):
            def __init__(self, cfg, pid: int, num: int):
                from flwr.app import Context, RecordDict

                super().__init__(cid=str(1000 + pid))
                self.cfg, self.pid = cfg, pid
                self.context = Context(run_id=0, node_id=1000 + pid,
                                       node_config={"partition-id": pid, "num-partitions": num},
                                       state=RecordDict(), run_config={})

            def _client(self):
                from fedpers.registry.methods import client_class_for

                return client_class_for(self.cfg)(self.cfg, self.context)

            def get_properties(self, ins, timeout, group_id):
                from flwr.common import Code, GetPropertiesRes, Status

                return GetPropertiesRes(Status(Code.OK, ""), {"partition_id": self.pid})

            def get_parameters(self, ins, timeout, group_id):
                raise NotImplementedError

            def fit(self, ins, timeout, group_id):
                from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

                up, n, metrics = self._client().fit(parameters_to_ndarrays(ins.parameters), dict(ins.config))
                return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(up), n, metrics)

            def evaluate(self, ins, timeout, group_id):
                from flwr.common import Code, EvaluateRes, Status, parameters_to_ndarrays

                loss, n, metrics = self._client().evaluate(parameters_to_ndarrays(ins.parameters), dict(ins.config))
                return EvaluateRes(Status(Code.OK, ""), loss, n, metrics)

            def reconnect(self, ins, timeout, group_id):
                raise NotImplementedError

        return _Proxy(*args, **kwargs)


def run_inprocess(cfg) -> None:
    """One experiment through Flower's Server loop with in-process proxies."""
    from flwr.server import Server, SimpleClientManager

    from fedpers.core.federation import get_federation
    from fedpers.registry.methods import strategy_class_for
    from fedpers.core.results import ResultsWriter

    fed = get_federation(cfg)
    strategy = strategy_class_for(cfg)(cfg, fed, ResultsWriter(cfg.out_dir))
    manager = SimpleClientManager()
    for pid in range(fed.num_clients):
        manager.register(InProcessProxy(cfg, pid, fed.num_clients))
    Server(client_manager=manager, strategy=strategy).fit(num_rounds=cfg.rounds, timeout=None)


def run_one(name: str, sets: dict, args, data: Path) -> dict:
    """Run (or reuse) one experiment; return its summary."""
    out = Path(args.out) / name
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())
    overrides = {"dataset": str(data), "rounds": args.rounds, "eval_every": args.rounds, "seed": args.seed,
                 "jdfl_discovery_epochs": args.e0, "device": args.device, **sets}
    print(f"$ {name}: {overrides}", flush=True)
    started = time.time()
    if args.engine == "ray":
        cmd = [sys.executable, "-m", "fedpers", "run", args.config, "--out", str(out)]
        for k, v in overrides.items():
            cmd += ["--set", f"{k}={v}"]
        subprocess.run(cmd, check=True, cwd=ROOT)
    else:
        from fedpers.registry.config import load_config

        cfg = load_config(args.config, out_dir=str(out), **overrides)
        import torch

        torch.set_num_threads(args.threads)
        run_inprocess(cfg)
    print(f"  done in {time.time() - started:.0f} s", flush=True)
    return json.loads((out / "summary.json").read_text())


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "jdfl" / "pacs_A.yaml"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "pacs.npz"))
    p.add_argument("--size", type=int, default=0, help="resize images to this side (0 = PACS' 64x64)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--e0", type=int, default=3, help="discovery epochs E0 (paper: 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=("inprocess", "ray"), default="inprocess")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated run names to do (default: all)")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--out", default=str(HERE / "results" / "jdfl_pacs_runs"))
    args = p.parse_args()
    data = resized_pacs(Path(args.data), args.size, Path(args.out))
    only = set(filter(None, args.only.split(",")))

    plan = [(f"{m}_{mode}", {"method": m, "jdfl": mode}) for _, m in OPTIMIZERS for _, mode in MODES]
    if not args.skip_sweep:
        plan += [(f"fedavg_{mode}_M{k}", {"method": "fedavg", "jdfl": mode, "jdfl_m": k})
                 for mode in ("graded", "random") for k in SWEEP]
    results: dict[str, dict] = {}
    for name, sets in plan:
        if only and name not in only:
            out = Path(args.out) / name / "summary.json"
            if out.exists():
                results[name] = json.loads(out.read_text())
            continue
        results[name] = run_one(name, sets, args, data)
    write_tables(results, args, data)


def write_tables(results: dict[str, dict], args, data: Path) -> None:
    """benchmarks/results/jdfl_pacs.md and .json from the finished runs."""
    def acc(name):
        s = results.get(name)
        return None if s is None else s["final"].get("global_acc")

    size = args.size or 64
    head = (f"# JDFL on PACS setting A: 10 clients (one domain each), E=1, all clients every round, "
            f"{args.rounds} rounds, seed {args.seed}\n\n"
            f"Exact settings: `{Path(args.config).relative_to(ROOT)}` (SGD lr 0.01, batch 32, GroupNorm CNN with "
            f"feature_dim 128, no dropout) with rounds={args.rounds}, eval only at the last round, images "
            f"{size}x{size}{' (bilinear, downsampled from 64x64 for the CPU budget)' if args.size else ''}, "
            f"discovery E0={args.e0} (paper: 3), M by elbow (max 10), graded alpha by M (0.55 if M<=5), tau 0.1, "
            f"random phi 1.0; engine `{args.engine}`; device {args.device}. Paper: 112x112 images and many more "
            f"rounds, so absolute numbers are not comparable with its Table 1.\n\n"
            f"Command: `python benchmarks/jdfl_pacs.py --rounds {args.rounds} --size {args.size} --e0 {args.e0}"
            f"{' --engine ray' if args.engine == 'ray' else ''}`\n")
    lines = [head, "Global accuracy (%) on the union of the clients' test splits (= PACS test split): standard "
             "accuracy standalone, class-only accuracy with JDFL.\n",
             "| optimizer | standalone | + JDFL graded | + JDFL random | M (graded / random) | ARI | wall s (standalone) |",
             "|---|---|---|---|---|---|---|"]
    table = {}
    for label, m in OPTIMIZERS:
        row = {mode: acc(f"{m}_{mode}") for _, mode in MODES}
        js = [results.get(f"{m}_{mode}", {}).get("jdfl", {}) for mode in ("graded", "random")]
        ms = " / ".join(str(j.get("M", "-")) for j in js)
        ari = js[0].get("ari") if js[0] else (js[1].get("ari") if js[1] else None)
        wall = results.get(f"{m}_off", {}).get("wall_seconds")
        table[m] = {**row, "M": [j.get("M") for j in js], "ari": ari}
        lines.append(f"| {label} | {pct(row['off'])} | {pct(row['graded'])} | {pct(row['random'])} | {ms} | "
                     f"{'-' if ari is None else f'{ari:.3f}'} | {'-' if wall is None else f'{wall:.0f}'} |")
    domains = ["photo", "art_painting", "cartoon", "sketch"]
    lines += ["", "Per-domain class-only accuracy (%) of the JDFL runs:", "",
              "| run | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for name, s in results.items():
        if s.get("jdfl") and not name.split("_")[-1].startswith("M"):
            lines.append(f"| {name} | " + " | ".join(pct(s["final"].get(f"global_acc_domain_{d}")) for d in domains)
                         + " |")
    sweep = {k: {mode: acc(f"fedavg_{mode}_M{k}") for mode in ("graded", "random")} for k in SWEEP}
    if any(v for row in sweep.values() for v in row.values()):
        lines += ["", "M sweep, FedAvg + JDFL (M fixed, discovery still assigns clients), class-only accuracy (%); "
                  f"FedAvg standalone (M = 1): {pct(acc('fedavg_off'))}", "",
                  "| M | " + " | ".join(map(str, SWEEP)) + " |", "|---|" + "---|" * len(SWEEP)]
        for mode in ("graded", "random"):
            lines.append(f"| {mode} | " + " | ".join(pct(sweep[k][mode]) for k in SWEEP) + " |")
    text = "\n".join(lines) + "\n"
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "jdfl_pacs.md").write_text(text)
    (HERE / "results" / "jdfl_pacs.json").write_text(json.dumps(
        {"settings": {"config": str(Path(args.config).relative_to(ROOT)), "rounds": args.rounds, "size": size,
                      "e0": args.e0, "seed": args.seed, "engine": args.engine, "data": str(data.name)},
         "table": table, "sweep": sweep,
         "runs": {n: {"final": s["final"], "jdfl": s.get("jdfl"), "wall_seconds": s.get("wall_seconds")}
                  for n, s in results.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
