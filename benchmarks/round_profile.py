"""Where a fedpers round's seconds go, and seconds per round in Flower's Ray simulation.

For each method it (1) runs ``--rounds`` rounds through ``run_simulation`` (2 client actors of 1 CPU) and
takes the seconds of rounds 2+ (round 1 carries Ray start-up, actor creation and data loading), then
(2) replays one round of the *same code* in this process, without Flower's engine or Ray: the method's
real NumPyClient (``fit`` of every client sampled in round 2, ``evaluate`` of every client the strategy
would ask, with one thread each as the actors have) and its real Strategy (aggregation with the server-side
steps such as pFedKDH's recalibration, and the global evaluation, with two threads as the driver has).
The sums tell how much of a round is the method's arithmetic and how much is engine, serialization and
waiting; with two actors, the client work divides by about two.

    python benchmarks/round_profile.py --rounds 3                       # both settings below
    python benchmarks/round_profile.py --only fedavg_pfllib

Before the timed round, every sampled client fits round 1 once (not timed), so that round 2 finds the state
a real round 2 finds (FedEAGD's EMA teacher exists from a client's second participation on).

Settings: ``fedavg_pfllib`` = FedAvg on PFLlib's own MNIST split (``../shared/data/pfllib_mnist_dir0.1_20c.npz``,
PFLlib's settings: 20 clients, half per round, 2 local epochs, batch 64, lr 0.015, no Ds);
``pfedkdh_table1`` = pFedKDH-EA on MNIST at the pFedKDH paper's Table 1 settings (Dirichlet 0.05, |Ds| 5,000);
``fedeagd_cifar10_practical`` and ``fedper_se_cnn_cifar10_practical`` = FedEAGD and FedPer on the same SE-CNN
at the FedEAGD summary's Practical setting on CIFAR-10 (Dirichlet 0.1, 20 clients, all every round, no Ds),
1 local epoch (ours, for the CPU), batch 64, lr 0.015 (a FedEAGD round against a FedPer round);
``fedas_se_cnn_cifar10_practical``, ``fedala_…`` and ``pfedsim_…``: the study's other baselines there.
Writes benchmarks/results/round_profile.json and prints a table.

    python benchmarks/round_profile.py --rounds 3 --only fedper_se_cnn_cifar10_practical fedeagd_cifar10_practical
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.registry.methods import client_class_for, strategy_class_for
from fedpers.core.results import read_metrics
from fedpers.apps.simulation import run_simulation
from fedpers.core.wire import SERVER_ROUND

from strategies.base import Upload

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
TABLE1 = {"num_clients": 20, "fraction_fit": 0.5, "local_epochs": 2, "batch_size": 64, "lr": 0.015}
SETTINGS = {
    "fedavg_pfllib": {"method": "fedavg", "dataset": str(DATA / "mnist.npz"), "partition": "file",
                      "partition_file": str(DATA / "pfllib_mnist_dir0.1_20c.npz"), "aux_size": 0, **TABLE1},
    "pfedkdh_table1": {"method": "pfedkdh", "variant": "ea", "dataset": str(DATA / "mnist.npz"), "alpha": 0.05,
                       "aux_size": 5000, **TABLE1},
}
PRACTICAL = {"dataset": str(DATA / "cifar10.npz"), "alpha": 0.1, "num_clients": 20, "fraction_fit": 1.0,
             "local_epochs": 1, "batch_size": 64, "lr": 0.015, "aux_size": 0}
SETTINGS["fedeagd_cifar10_practical"] = {"method": "fedeagd", **PRACTICAL}
SETTINGS["fedper_se_cnn_cifar10_practical"] = {"method": "fedper", "model_kind": "se_cnn", **PRACTICAL}
# The study's other baselines on the same SE-CNN (what one of their rounds costs against FedPer's).
for _baseline in ("fedas", "fedala", "pfedsim"):
    SETTINGS[f"{_baseline}_se_cnn_cifar10_practical"] = {"method": _baseline, "model_kind": "se_cnn", **PRACTICAL}
# The client methods whose seconds a setting's replay reports on their own (the method's additions to a
# round; the step's own extra cost, the teacher pass and the drift, is inside the training loop).
TIMED_CLIENT_PARTS = {"fedeagd_cifar10_practical": ("load_teacher", "update_teacher")}


def simulated_round_seconds(cfg) -> list[float]:
    """Seconds of every round of a real ``run_simulation`` of ``cfg``."""
    out = tempfile.mkdtemp(prefix="fedpers-profile-")
    run_simulation(cfg.replace(out_dir=out))
    return [r["round_seconds"] for r in read_metrics(out)]


def _context(cfg, pid: int):
    from flwr.app import Context, RecordDict

    return Context(run_id=0, node_id=pid, node_config={"partition-id": pid, "num-partitions": cfg.num_clients},
                   state=RecordDict(), run_config=cfg.to_dict())


class _PartTimer:
    """Seconds spent in named methods of the clients, summed (wraps them on the class for the replay)."""

    def __init__(self, client_cls, names):
        self.seconds = {name: 0.0 for name in names}
        self._originals = {name: getattr(client_cls, name) for name in names}
        self._own = {name for name in names if name in vars(client_cls)}  # the rest are inherited
        self._cls = client_cls
        for name, original in self._originals.items():
            setattr(client_cls, name, self._timed(name, original))

    def _timed(self, name, original):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
        return timed

    def restore(self) -> None:
        for name, original in self._originals.items():
            if name in self._own:
                setattr(self._cls, name, original)
            else:
                delattr(self._cls, name)


def setting_config(name: str, rounds: int = 3):
    """The config of setting ``name`` as this script runs it (CPU, one CPU per client actor)."""
    return build_config({**SETTINGS[name], "rounds": rounds, "device": "cpu", "client_cpus": 1.0})


def sampled_clients(strategy, server_round: int) -> list[int]:
    """The partition ids the strategy's own seeded draw trains in ``server_round``, every client connected."""
    return strategy.roster.fit_sample(server_round, dict.fromkeys(range(strategy.cfg.num_clients)))


def fit_round_before(cfg, client_cls, contexts: dict, pids: list[int], broadcast, config: dict,
                     server_round: int) -> None:
    """Round ``server_round - 1``'s fit of clients ``pids`` (not timed): the state a real ``server_round``
    finds (FedEAGD's EMA teacher, every method's persistent head)."""
    for pid in pids:
        client_cls(cfg, contexts[pid]).fit(broadcast, {**config, SERVER_ROUND: server_round - 1})


def replay_round(cfg, server_round: int = 2, timed_parts: tuple[str, ...] = ()) -> dict[str, float]:
    """Seconds of each part of one round, run in this process with the method's own classes."""
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    fed = get_federation(cfg)
    timings: dict[str, float] = {}
    torch.set_num_threads(2)
    t = time.perf_counter()
    strategy = strategy_class_for(cfg)(cfg, fed, None)
    timings["server set-up (incl. initial calibration)"] = time.perf_counter() - t
    strategy.book.start()
    broadcast = strategy.download_arrays()
    config = strategy.message_config(server_round)  # with the broadcast's section counts
    k = fed.num_clients
    chosen = sampled_clients(strategy, server_round)
    client_cls = client_class_for(cfg)
    contexts = {pid: _context(cfg, pid) for pid in range(k)}
    torch.set_num_threads(1)  # as one client actor
    fit_round_before(cfg, client_cls, contexts, chosen, broadcast, config, server_round)
    parts = _PartTimer(client_cls, ("train", *timed_parts))
    fit_s, build_s, ser_s, updates = 0.0, 0.0, 0.0, {}
    for pid in chosen:
        t = time.perf_counter()
        client = client_cls(cfg, contexts[pid])
        build_s += time.perf_counter() - t
        t = time.perf_counter()
        arrays, n, _ = client.fit(broadcast, config)
        fit_s += time.perf_counter() - t
        t = time.perf_counter()
        received = parameters_to_ndarrays(ndarrays_to_parameters(arrays))
        updates[pid] = Upload(received, n, {})
        ser_s += time.perf_counter() - t
    timings["client fit (sum over sampled clients, 1 thread)"] = fit_s
    timings["  of which the training loop"] = parts.seconds["train"]
    for name in timed_parts:
        timings[f"  of which {name}"] = parts.seconds[name]
    timings["  of which the rest (download, state, upload)"] = fit_s - sum(parts.seconds.values())
    parts.restore()
    torch.set_num_threads(2)  # the driver
    t = time.perf_counter()
    strategy.apply_aggregate(server_round, strategy.aggregate(server_round, updates))
    timings["server aggregate + server-side steps"] = time.perf_counter() - t
    t = time.perf_counter()
    strategy.evaluate(server_round, ndarrays_to_parameters(strategy.download_arrays()))
    timings["server global evaluation"] = time.perf_counter() - t
    broadcast = strategy.download_arrays()
    torch.set_num_threads(1)
    eval_s = 0.0
    evaluated = [] if strategy.personalized_is_global else list(range(k))
    for pid in evaluated:
        t = time.perf_counter()
        client = client_cls(cfg, contexts[pid])
        build_s += time.perf_counter() - t
        t = time.perf_counter()
        client.evaluate(broadcast, config)
        eval_s += time.perf_counter() - t
    timings["clients asked to evaluate"] = len(evaluated)
    timings["client evaluate (sum over the clients asked, 1 thread)"] = eval_s
    timings["client construction (sum)"] = build_s
    timings["serialization of the uploads (sum)"] = ser_s
    client_work = fit_s + eval_s + build_s
    timings["model: client work / 2 actors + server work"] = (
        client_work / 2 + timings["server aggregate + server-side steps"] + timings["server global evaluation"])
    return timings


def interleaved_fits(names: list[str], server_round: int = 2) -> dict:
    """Seconds of each sampled client's round-``server_round`` fit under each setting of ``names``, one
    thread, the settings taking turns client by client (A, B, A, B, ...), so that a change of load on the
    machine touches them alike; after an untimed round-1 fit of every client. The settings must sample the
    same clients (the same seed, clients and fraction). Returns per setting the per-client seconds and their
    sum, and each sum's ratio to the first setting's."""
    torch.set_num_threads(1)
    runs, samples = {}, []
    for name in names:
        cfg = setting_config(name)
        strategy = strategy_class_for(cfg)(cfg, get_federation(cfg), None)
        strategy.book.start()
        runs[name] = (cfg, strategy.download_arrays(), strategy.message_config(server_round), client_class_for(cfg))
        samples.append(sampled_clients(strategy, server_round))
    if any(sample != samples[0] for sample in samples):
        raise SystemExit(f"--interleave: the settings {names} do not sample the same clients in round {server_round}")
    chosen = samples[0]
    contexts = {name: {pid: _context(runs[name][0], pid) for pid in chosen} for name in names}
    for name, (cfg, broadcast, config, client_cls) in runs.items():
        fit_round_before(cfg, client_cls, contexts[name], chosen, broadcast, config, server_round)
    spare = {name: copy.deepcopy(contexts[name][chosen[0]]) for name in names}  # for the op profile below
    seconds = {name: {} for name in names}
    for pid in chosen:
        for name, (cfg, broadcast, config, client_cls) in runs.items():
            client = client_cls(cfg, contexts[name][pid])
            start = time.perf_counter()
            client.fit(broadcast, config)
            seconds[name][str(pid)] = time.perf_counter() - start
    total = {name: sum(seconds[name].values()) for name in names}
    # Where the difference goes: torch's functions by own time in one client's fit (cProfile; its overhead
    # is on the Python calls, not inside the operators).
    ops = {}
    for name, (cfg, broadcast, config, client_cls) in runs.items():
        client = client_cls(cfg, spare[name])
        profile = cProfile.Profile()
        profile.runcall(client.fit, broadcast, config)
        stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, _, own s, cumulative s, _)
        ops[name] = {function: round(own, 4) for (_, _, function), (_, _, own, _, _) in stats.items()
                     if function.startswith(("<built-in method torch", "<method 'run_backward'"))}
    return {"clients": chosen, "seconds": seconds, "sum": total,
            "ratio_to_first": {name: total[name] / total[names[0]] for name in names},
            "op_seconds_client": chosen[0], "op_seconds": ops}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS))
    p.add_argument("--tag", default="", help="label of this measurement (e.g. before / after)")
    p.add_argument("--interleave", nargs="+", choices=sorted(SETTINGS), metavar="SETTING",
                   help="instead: time every sampled client's round-2 fit under these settings taking turns "
                        "(one thread), and their sums' ratio to the first's")
    args = p.parse_args()
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    path = HERE / "results" / "round_profile.json"
    report = json.loads(path.read_text()) if path.is_file() else {}
    if args.interleave:
        result = interleaved_fits(args.interleave)
        result["command"] = f"python benchmarks/round_profile.py --interleave {' '.join(args.interleave)}"
        result["settings"] = args.interleave
        result["tag"] = args.tag or "latest"
        key = " vs ".join(args.interleave) + (f" ({args.tag})" if args.tag else "")
        report.setdefault("interleaved", {})[key] = result
        for name in args.interleave:
            print(f"{name}: client fits {result['sum'][name]:.2f} s in all, "
                  f"{result['ratio_to_first'][name]:.2f}x the first")
        path.write_text(json.dumps(report, indent=2) + "\n")
        path.with_suffix(".md").write_text(markdown(report))
        return
    for name in args.only:
        cfg = setting_config(name, args.rounds)
        seconds = simulated_round_seconds(cfg)
        parts = replay_round(cfg, timed_parts=TIMED_CLIENT_PARTS.get(name, ()))
        later = float(np.mean(seconds[1:])) if len(seconds) > 1 else float("nan")
        entry = {"settings": SETTINGS[name], "rounds": args.rounds, "round_seconds": seconds,
                 "mean_seconds_rounds_2_plus": later, "replayed_round_2": parts,
                 "command": f"python benchmarks/round_profile.py --rounds {args.rounds} --only {name}"}
        report.setdefault(name, {})[args.tag or "latest"] = entry
        print(f"\n{name}: simulated s/round (rounds 2+) {later:.2f}; all rounds "
              f"{', '.join(f'{s:.1f}' for s in seconds)}")
        for part, sec in parts.items():
            print(f"  {part:58s} {sec:7.2f} s")
        print(f"  {'engine, messages and waiting (simulated - modelled)':58s} "
              f"{later - parts['model: client work / 2 actors + server work']:7.2f} s")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The profile as tables: one per setting, one column per measurement tag (e.g. before / after)."""
    lines = ["# Where a round's seconds go (benchmarks/round_profile.py)", "",
             "Seconds of round 2 replayed in one process with the method's own classes (client parts with 1 thread,",
             "summed over clients; server parts with 2 threads), and the simulated seconds per round (rounds 2+,",
             "2 Ray actors) of the same settings. 'engine, messages, waiting' = simulated minus modelled.", ""]
    for name, tags in report.items():
        if name == "interleaved":
            continue
        order = sorted(tags, key=lambda t: (t != "before", t))
        parts = list(next(iter(tags.values()))["replayed_round_2"])
        lines += [f"## {name}", "", f"`{next(iter(tags.values()))['command']}`", "",
                  "| part | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]
        for part in parts:
            lines.append(f"| {part} | " + " | ".join(
                f"{tags[t]['replayed_round_2'].get(part, float('nan')):.2f}" for t in order) + " |")
        lines.append("| **simulated s/round, rounds 2+** | " + " | ".join(
            f"**{tags[t]['mean_seconds_rounds_2_plus']:.2f}**" for t in order) + " |")
        lines.append("| engine, messages, waiting | " + " | ".join(
            f"{tags[t]['mean_seconds_rounds_2_plus'] - tags[t]['replayed_round_2']['model: client work / 2 actors + server work']:.2f}"
            for t in order) + " |")
        lines.append("")
    for names, result in report.get("interleaved", {}).items():
        settings = result["settings"]
        lines += [f"## Client fits taking turns: {names}", "",
                  f"`{result['command']}`", "",
                  f"Round 2's fit of each of the {len(result['clients'])} sampled clients (after an untimed round 1), "
                  "one thread, the settings taking turns client by client; seconds summed over the clients.", "",
                  "Beside them, the simulated seconds per round (rounds 2+) of the same settings and tag, each its "
                  "own `--rounds` run (above), when measured.", "",
                  "| setting | client fits, s | x the first | simulated s/round | x the first |",
                  "|---|---|---|---|---|"]
        simulated = {name: report.get(name, {}).get(result.get("tag", ""), {}).get("mean_seconds_rounds_2_plus")
                     for name in settings}
        first = simulated[settings[0]]
        for name in settings:
            sim = simulated[name]
            sim_text = (f"{sim:.2f} | {sim / first:.2f}" if sim is not None and first else "– | –")
            lines.append(f"| {name} | {result['sum'][name]:.2f} | {result['ratio_to_first'][name]:.2f} | {sim_text} |")
        ops = result["op_seconds"]
        names_by_cost = sorted({op for name in settings for op in ops[name]},
                               key=lambda op: -max(ops[name].get(op, 0.0) for name in settings))[:8]
        lines += ["", f"Torch functions by own seconds in client {result['op_seconds_client']}'s fit (cProfile; tensor "
                  "methods such as the layout copies `.contiguous()` are not among them), the 8 costliest:", "",
                  "| operator | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
        lines += [f"| `{op}` | " + " | ".join(f"{ops[name].get(op, 0.0):.3f}" for name in settings) + " |"
                  for op in names_by_cost]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
