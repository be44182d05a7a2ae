"""JDFL's pseudo-domain discovery (Phase 1, paper Sec. 4.2) checked against PACS' true domains, without
any federated round: per setting and seed, the M the elbow picks, and how the K-means clusters match the
clients' true domains (adjusted Rand index and purity, scikit-learn), at the elbow's M and at the true
M = 4 (the paper's Table 2 / Fig. 2 diagnostics).

What runs is the discovery phase of a real run, through fedpers' own objects: the ServerApp's
``server_fn`` builds the run (federation, seeded theta^0, the JDFL strategy), the in-process engine's
client proxies carry the messages, and the round loop's ``run_phase(1)`` sends theta^0 to every client
(``jdfl_phase=discovery``: E0 epochs of cross-entropy SGD, the update of ``jdfl_layers`` returned) and
clusters the updates (``aggregate_phase``: l2-normalise, K-means, elbow), exactly as round 1 of
``fedpers run`` does before it trains; then it stops. The update vectors the strategy clusters are kept
(``discover_domains`` is wrapped, not changed) to re-cluster them at M = 4 with the same function.

Settings are configs/jdfl/pacs_{A,B,C}.yaml at the paper's E0 = 3 (their values otherwise: lr 0.01,
batch 32, gn_cnn, last conv block + head, elbow over M = 1..10). The discovery reads none of the keys in
which A and B differ (``local_epochs``, ``fraction_fit``): both have the same 10 clients of the same
partition at a seed, so B's discovery is A's (the script checks the two configs differ only there and
reports B from A's run; ``--verify-shared`` runs B too and compares the update vectors bit for bit).

Purity: the share of clients whose cluster's most frequent true domain is their own (the contingency
matrix's column maxima over the number of clients); with more clusters than domains it rises towards 1
whatever the clustering, which the ARI does not.

    python benchmarks/jdfl_discovery.py --dataset ../shared/data/pacs.npz --size-label 64 --seeds 0 1 2
    python benchmarks/jdfl_discovery.py --dataset data/pacs112.npz --size-label 112 --seeds 0

Results are merged into benchmarks/results/jdfl_discovery.json (one record per size, setting and seed;
a record already there is kept unless ``--force``) and the Markdown table is rewritten from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

SETTINGS = ("A", "B", "C")
# keys in which settings A and B differ and which the discovery phase does not read (clients/jdfl.py
# discovery_fit: E0, batch, lr, momentum, weight decay, drop_last_batch, seed; strategies/jdfl.py: every
# client is sent theta^0, whatever the round's sampling)
NOT_READ_BY_DISCOVERY = {"local_epochs", "fraction_fit"}
TRUE_M = 4


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def setting_config(setting: str, seed: int, dataset: str, out_dir: str):
    """configs/jdfl/pacs_<setting>.yaml at ``seed`` on ``dataset``, with the paper's E0 = 3."""
    from fedpers.registry.config import load_config

    return load_config(ROOT / "configs" / "jdfl" / f"pacs_{setting}.yaml", dataset=dataset, seed=seed,
                       jdfl_discovery_epochs=3, out_dir=out_dir, checkpoint_dir="", resume=False,
                       tensorboard=False, device="cpu")


def experiment_keys(cfg) -> dict:
    """The config as a dict without where the run writes."""
    d = dict(cfg.to_dict())
    for key in ("out_dir", "checkpoint_dir", "client_state_dir", "resume", "tensorboard"):
        d.pop(key, None)
    return d


def run_discovery(cfg) -> dict:
    """The discovery phase of ``cfg``'s run (module docstring): the strategy's record and the clustered
    update vectors."""
    from flwr.app import Context, RecordDict
    from flwr.server import SimpleClientManager

    import strategies.jdfl as sjdfl
    from fedpers.apps.inprocess import InProcessClientProxy
    from fedpers.apps.server_app import round_loop, server_fn
    from fedpers.registry.methods import client_for_message

    seen: dict[str, np.ndarray] = {}
    original = sjdfl.discover_domains

    def recording(updates, **kwargs):
        seen["updates"] = np.array(updates, copy=True)
        return original(updates, **kwargs)

    run_config = cfg.to_dict()
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    strategy = components.server.strategy
    manager = SimpleClientManager()
    for pid in range(cfg.num_clients):
        context = Context(run_id=0, node_id=pid + 1, state=RecordDict(), run_config=run_config,
                          node_config={"partition-id": pid, "num-partitions": cfg.num_clients})
        manager.register(InProcessClientProxy(str(pid + 1), lambda _config, c=context: client_for_message(cfg, c)))
    server = round_loop(strategy, client_manager=manager)
    server.set_max_workers(1)
    sjdfl.discover_domains = recording
    try:
        server.run_phase(1, timeout=None)
    finally:
        sjdfl.discover_domains = original
    info = dict(strategy.jdfl_info)
    return {"info": info, "updates": seen["updates"], "domain_names": list(strategy.federation.dataset.domain_names)}


def agreement(true: list[int], found: list[int]) -> dict:
    """ARI and purity of ``found`` clusters against ``true`` domains, and their contingency matrix."""
    from sklearn.metrics import adjusted_rand_score
    from sklearn.metrics.cluster import contingency_matrix

    cm = contingency_matrix(true, found)
    return {"ari": float(adjusted_rand_score(true, found)), "purity": float(cm.max(axis=0).sum() / cm.sum()),
            "contingency": cm.tolist()}


def measure(setting: str, seed: int, dataset: str, size_label: str) -> tuple[dict, np.ndarray]:
    """One discovery: its record (module docstring) and the update vectors."""
    from fedpers.algorithms.jdfl import discover_domains

    with tempfile.TemporaryDirectory(prefix="jdfl-discovery-") as tmp:
        cfg = setting_config(setting, seed, dataset, str(Path(tmp) / "run"))
        started, cpu0 = time.perf_counter(), cpu_seconds()
        out = run_discovery(cfg)
        wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu0
    info, updates = out["info"], out["updates"]
    true = [int(d) for d in info["true_domains"]]
    clustered = [int(p) for p in info["clustered_clients"]]
    true_of_clustered = [true[p] for p in clustered]
    elbow = [int(info["assignments"][p]) for p in clustered]
    fixed = discover_domains(updates, num_domains=TRUE_M, seed=cfg.seed)  # the strategy's call with M fixed
    record = {
        "size": size_label, "setting": setting, "seed": seed, "dataset": dataset,
        "num_clients": cfg.num_clients, "local_epochs": cfg.local_epochs, "fraction_fit": cfg.fraction_fit,
        "e0": cfg.jdfl_discovery_epochs, "batch": cfg.jdfl_discovery_batch or cfg.batch_size, "lr": cfg.lr,
        "layers": cfg.jdfl_layers, "select": cfg.jdfl_select, "max_m": cfg.jdfl_max_m,
        "domain_names": out["domain_names"], "true_domains": true, "clustered_clients": clustered,
        "M": int(info["M"]), "criterion": info.get("criterion"), "inertia": info.get("scores"),
        "assignments": elbow, "ari_strategy": info.get("ari"),
        "elbow": agreement(true_of_clustered, elbow),
        "m4": {"assignments": [int(z) for z in fixed.assignments], **agreement(true_of_clustered, fixed.assignments)},
        "update_dim": int(updates.shape[1]), "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
        "shared_from": None,
    }
    return record, updates


def write_markdown(records: list[dict], path: Path) -> None:
    """The table of every record (by size, setting, seed), headed by the commands that made them."""
    order = {s: i for i, s in enumerate(SETTINGS)}
    rows = sorted(records, key=lambda r: (int(r["size"]), order.get(r["setting"], 9), r["seed"]))
    commands = list(dict.fromkeys(r.get("command", "") for r in rows if r.get("command")))
    lines = [
        "# JDFL discovery against PACS' true domains",
        "",
        *[f"    {c}" for c in commands],
        "",
        "Generated by the commands above (run from the repository root; each record in the .json names its "
        "own). Only the discovery phase runs: the round loop's phase before round 1 of a real run "
        "(`server_fn`, in-process client proxies, `run_phase(1)`), no federated round. Settings: "
        "configs/jdfl/pacs_{A,B,C}.yaml at the paper's E0 = 3 (lr 0.01, batch 32, gn_cnn, update of the "
        "last conv block + head, K-means on the "
        "l2-normalised updates, M by the elbow over 1..10). ARI and purity (scikit-learn; purity = the "
        "contingency matrix's column maxima / clients) of the clusters against each client's true domain, "
        "at the elbow's M and at the true M = 4 (the same K-means, M fixed). Setting B reads the same 10 "
        "clients, theta^0 and discovery keys as A at a seed, so its discovery is A's (`shared_from`; "
        "checked bit for bit where `verified`).",
        "",
        "| size | setting | clients | seed | elbow M | ARI (elbow M) | purity (elbow M) | ARI (M=4) | purity (M=4) "
        "| clusters at M=4 by true domain | CPU s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        names = r["domain_names"]
        by_cluster = []
        cm = np.asarray(r["m4"]["contingency"])
        for k in range(cm.shape[1]):
            parts = [f"{names[d][:2]}{int(cm[d, k])}" for d in range(cm.shape[0]) if cm[d, k]]
            by_cluster.append("+".join(parts))
        shared = r.get("shared_from")
        cost = (f"(= {shared}{', verified' if r.get('verified') else ''})" if shared
                else f"{r['cpu_seconds']:.0f}")
        wall = "" if shared else f"{r['wall_seconds']:.0f}"
        lines.append(f"| {r['size']}x{r['size']} | {r['setting']} | {r['num_clients']} | {r['seed']} | {r['M']} | "
                     f"{r['elbow']['ari']:.3f} | {r['elbow']['purity']:.3f} | {r['m4']['ari']:.3f} | "
                     f"{r['m4']['purity']:.3f} | {' / '.join(by_cluster)} | {cost} | {wall} |")
    picked = [r["M"] for r in rows]
    lines += [
        "",
        f"Elbow picked M = 4 in {sum(m == TRUE_M for m in picked)} of {len(picked)} rows (B rows are A's discoveries) "
        f"({', '.join(f'M={m}: {picked.count(m)}' for m in sorted(set(picked)))}). "
        "Domains abbreviated: ph photo, ar art_painting, ca cartoon, sk sketch; the counts are clients.",
        "",
        "CPU s / wall s: one discovery (10 or 40 clients x E0 = 3 epochs over PACS' 8,977 training images, "
        "then K-means for M = 1..10) on one torch and one BLAS thread, on a 2-core machine where other "
        "studies ran at a lower priority. With two BLAS threads on that busy machine the K-means alone took "
        "8 times the wall time and 10 times the CPU time (117 s / 47 CPU s against 15 s / 4.6 CPU s for "
        "40 random vectors of 75,015 values, the shape of setting C's updates), so `--threads` defaults to 1.",
        "",
    ]
    lines += ["K-means inertia for M = 1..10 (the curve the elbow reads; kneedle rule, fedpers/algorithms/jdfl.py "
              "`elbow_choice`):", "", "| size | setting | seed | " + " | ".join(f"M={k}" for k in range(1, 11)) + " |",
              "|---|---|---|" + "---|" * 10]
    for r in rows:
        if r.get("shared_from") or not r.get("inertia"):
            continue
        curve = [r["inertia"].get(str(k)) for k in range(1, 11)]
        lines.append(f"| {r['size']}x{r['size']} | {r['setting']} | {r['seed']} | "
                     + " | ".join("" if v is None else f"{v:.2f}" for v in curve) + " |")
    lines.append("")
    missing = [n for n in ("64", "112") if n not in {str(r["size"]) for r in rows}]
    for n in missing:
        data = "../shared/data/pacs.npz" if n == "64" else f"data/pacs{n}.npz"
        lines += [f"Not run at {n}x{n} (CPU budget of this check: about 3 times the 64x64 cost per discovery "
                  f"at 112x112, roughly 7-8 CPU min each): `python benchmarks/jdfl_discovery.py --dataset {data} "
                  f"--size-label {n} --seeds 0`" + (" (build data/pacs112.npz first: benchmarks/build_pacs.py)"
                                                    if n != "64" else "") + ".", ""]

    path.write_text("\n".join(lines))


def commands(records: list[dict]) -> list[str]:
    """The distinct commands that made ``records``, in order of first appearance."""
    return list(dict.fromkeys(r["command"] for r in records if r.get("command")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="../shared/data/pacs.npz", help="a PACS .npz (path from the repo root)")
    p.add_argument("--size-label", required=True, help="the images' side, for the table (64, 112)")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=1,
                   help="torch and BLAS / OpenMP threads (default 1: on a busy 2-core machine two BLAS threads "
                        "made the K-means of one discovery 8x slower in wall time and 10x in CPU time)")
    p.add_argument("--verify-shared", action="store_true", help="run B too and compare it with A bit for bit")
    p.add_argument("--force", action="store_true", help="redo records already in the JSON")
    p.add_argument("--table-only", action="store_true", help="rewrite the .md from the .json; run nothing")
    p.add_argument("--out", default=str(HERE / "results" / "jdfl_discovery"), help="path stem of .json / .md")
    args = p.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)  # OpenBLAS (scikit-learn's K-means) and OpenMP
    os.chdir(ROOT)  # the configs' dataset paths are relative to the repository root
    out_json, out_md = Path(args.out + ".json"), Path(args.out + ".md")
    command = "python benchmarks/jdfl_discovery.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    records: list[dict] = json.loads(out_json.read_text())["records"] if out_json.is_file() else []

    def key(r):
        return (str(r["size"]), r["setting"], int(r["seed"]))

    have = {key(r): r for r in records}
    if args.table_only:
        write_markdown(records, out_md)
        return 0
    for seed in args.seeds:
        done: dict[str, tuple[dict, np.ndarray | None]] = {}
        for setting in [s for s in SETTINGS if s in args.settings or (s == "A" and "B" in args.settings)]:
            k = (args.size_label, setting, seed)
            if k in have and not args.force and not (setting == "A" and args.verify_shared and "B" in args.settings):
                done[setting] = (have[k], None)
                continue
            if setting == "B" and "A" in done and not args.verify_shared:
                a_cfg = setting_config("A", seed, args.dataset, "x")
                b_cfg = setting_config("B", seed, args.dataset, "x")
                differ = {n for n, v in experiment_keys(a_cfg).items() if experiment_keys(b_cfg).get(n) != v}
                if differ <= NOT_READ_BY_DISCOVERY:
                    rec = {**done["A"][0], "setting": "B", "local_epochs": b_cfg.local_epochs,
                           "fraction_fit": b_cfg.fraction_fit, "shared_from": f"A seed {seed}",
                           "verified": have.get(k, {}).get("verified", False)}
                    have[k] = rec
                    done["B"] = (rec, None)
                    print(f"jdfl_discovery: {args.size_label} B seed {seed}: = A's discovery (differs only in "
                          f"{', '.join(sorted(differ))})", flush=True)
                    continue
            print(f"jdfl_discovery: {args.size_label} setting {setting} seed {seed} ...", flush=True)
            rec, updates = measure(setting, seed, args.dataset, args.size_label)
            rec["command"] = command
            if setting == "B" and "A" in done and done["A"][1] is not None:
                same = np.array_equal(updates, done["A"][1])
                print(f"jdfl_discovery: B's update vectors {'equal' if same else 'DIFFER FROM'} A's", flush=True)
                if same:
                    done["A"][0]["verified_B"] = True
                    rec["verified"] = True
                    rec["shared_from"] = f"A seed {seed}"
            done[setting] = (rec, updates)
            if setting in args.settings:
                have[k] = rec
            print(f"jdfl_discovery: M={rec['M']} ARI={rec['elbow']['ari']:.3f} purity={rec['elbow']['purity']:.3f}; "
                  f"M=4: ARI={rec['m4']['ari']:.3f} purity={rec['m4']['purity']:.3f}; "
                  f"{rec['cpu_seconds']:.0f} CPU s, {rec['wall_seconds']:.0f} s", flush=True)
            records = list(have.values())
            out_json.write_text(json.dumps({"commands": commands(records), "records": records}, indent=1) + "\n")
            write_markdown(records, out_md)
    records = list(have.values())
    out_json.write_text(json.dumps({"commands": commands(records), "records": records}, indent=1) + "\n")
    write_markdown(records, out_md)
    print(f"jdfl_discovery: {out_md} and {out_json.name} written ({len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
