"""``fedpers`` command line.

    fedpers run CONFIG.yaml [--set key=value ...] [--out DIR]   one experiment in Flower's Ray simulation
                                                                (--engine inprocess: the same, without Ray)
    fedpers config [CONFIG.yaml] [--set key=value ...]          print the resolved, validated config
    fedpers methods                                             list the registered methods
    fedpers sweep SWEEP.yaml --out DIR                          methods x datasets x alpha x seeds, resumable
    fedpers report DIR                                          table.md/.csv and PNG figures of a sweep
    fedpers data import-folder TREE --out FILE.npz [--size N]   an image-folder tree as a dataset .npz
    fedpers docs [--check]                                      README's generated blocks from claims.json
    fedpers deploy local [--clients N] [CONFIG.yaml] [--set ...] --out DIR SuperLink + N SuperNodes, TLS
    fedpers deploy restart-node --out DIR N                     SuperNode N of that deployment, again

Bad input (unknown key, wrong type, missing data file, impossible split) prints one line
``fedpers: error: ...`` and exits with code 2, before any training starts; a failure of the simulation
engine itself prints one line and exits with code 1. Ctrl-C ends a command with exit code 130, SIGTERM
(``kill``, Slurm, docker) the same way with 143.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time

import yaml

from fedpers.registry.config import Config, core_value, full_schema, load_config, parse_set_arguments
from fedpers.core.allocator import allocator_choice
from fedpers.core.errors import STOP_REQUESTED, EngineError, FedpersError, Interrupted, cut
from fedpers.apps.processes import kill_own_tree, own_tree  # no import inside the signal handler
from fedpers.apps.deploy import DEFAULT_CERT_DAYS, MAX_CERT_DAYS
from fedpers.apps.fleet_bodies import DEFAULT_FLEET_MAX_OBJECT_BODY, nginx_size


ENGINES = ("ray", "inprocess")
ENGINE_HELP = ("ray (default): Flower's Ray simulation engine; inprocess: the same round loop and clients in this "
               "one process, one client at a time, without Ray (no Ray start-up; a machine without Ray)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedpers", description="Personalized federated learning on Flower.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment in Flower's Ray simulation engine")
    run.add_argument("config", nargs="?", help="YAML file of config keys (default: schema defaults)")
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key (repeatable)")
    run.add_argument("--shared", action="append", default=[], metavar="KEY=VALUE",
                     help="as --set, applied first, for a key shared by runs of several methods (what a sweep "
                          "passes from its base): no warning when this run's method ignores it")
    run.add_argument("--out", help="output directory (same as --set out_dir=DIR)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the run already in --out (without it such a directory is refused)")
    run.add_argument("--verbose", action="store_true", help="show Flower's and Ray's logs")
    run.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events to OUT/tensorboard")
    run.add_argument("--engine", choices=ENGINES, default="ray", help=ENGINE_HELP)
    sweep = sub.add_parser("sweep", help="run methods x datasets x alpha x seeds (resumable)")
    sweep.add_argument("sweep", help="sweep YAML file (see fedpers/apps/sweep.py)")
    sweep.add_argument("--out", required=True, help="sweep directory")
    sweep.add_argument("--tensorboard", action="store_true", help="TensorBoard events for every run")
    sweep.add_argument("--dry-run", action="store_true", help="validate and list the runs, run nothing")
    sweep.add_argument("--report-only", action="store_true",
                       help="write sweep.json from the file (rows, paper numbers, claims) and the report of the "
                            "runs already finished in --out; run nothing")
    sweep.add_argument("--engine", choices=ENGINES, default="ray", help=ENGINE_HELP + " (for every run)")
    sweep.add_argument("--jobs", type=int, default=1,
                       help="runs at a time (default 1): one per GPU with CUDA_VISIBLE_DEVICES, else sharing the CPUs")
    sweep.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="override a key of the sweep's base config for every run (repeatable)")
    sweep.add_argument("--datasets", nargs="+", help="replace the sweep's dataset list")
    rep = sub.add_parser("report", help="paper-style table.md/table.csv and PNG figures of a sweep")
    rep.add_argument("dir", help="a `fedpers sweep` output directory")
    rep.add_argument("--value", choices=("final", "best", "last5"), default=None,
                     help="final round, best evaluated round, or mean of the last 5 evaluated rounds (default: the "
                          "study's report: value, else final)")
    rep.add_argument("--metric", help="one accuracy for every row, e.g. personalized_weighted_acc or global_acc")
    rep.add_argument("--versus", metavar="LABEL", action="append",
                     help="also write versus.md: every row against row LABEL, paired over the clients of a split "
                          "(repeatable: one section per LABEL)")
    show = sub.add_parser("config", help="print the resolved config")
    show.add_argument("config", nargs="?")
    show.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--shared", action="append", default=[], metavar="KEY=VALUE", help="as on `fedpers run`")
    show.add_argument("--keys", action="store_true", help="list every key with its help text")
    sub.add_parser("methods", help="list the registered methods")
    schema = sub.add_parser("schema", help="the pyproject.toml run-config table generated from the config schema")
    schema.add_argument("--write-pyproject", action="store_true", help="rewrite [tool.flwr.app.config] in pyproject.toml")
    schema.add_argument("--check", action="store_true", help="exit 1 when pyproject.toml's table is not the generated one")
    docs = sub.add_parser("docs", help="rewrite the generated blocks of README.md and benchmarks/README.md from the "
                          "studies' claims.json (run in the repository root)")
    docs.add_argument("--check", action="store_true", help="write nothing; exit 1 when a block is stale")
    data = sub.add_parser("data", help="datasets: turn an image-folder tree into the project's .npz layout")
    datasub = data.add_subparsers(dest="data_command", required=True)
    imp = datasub.add_parser("import-folder", help="TREE/train/[<domain>/]<class>/* and TREE/test/... as one .npz "
                             "(x_train, y_train, x_test, y_test, class_names; d_train, d_test, domain_names)")
    imp.add_argument("tree", help="the tree's root folder (holding train/ and test/)")
    imp.add_argument("--out", required=True, help="the .npz file to write (refused when it exists)")
    imp.add_argument("--size", type=int, default=None,
                     help="resize every image to SIZE x SIZE (antialiased; filter: --resample); without it all "
                          "images must have one size")
    imp.add_argument("--resample", choices=("bilinear", "bicubic", "lanczos"), default="bilinear",
                     help="Pillow's resize filter for --size (default bilinear; Pillow's own default for RGB, and "
                          "shared/data/pacs.npz's, is bicubic)")
    imp.add_argument("--domains", action="store_true",
                     help="the tree has a domain level: TREE/<split>/<domain>/<class>/*")
    imp.add_argument("--domain-order", default=None, metavar="D0,D1,...",
                     help="with --domains: the domain folders in the order of their ids (each named once; "
                          "default: sorted by name), e.g. photo,art_painting,cartoon,sketch for PACS")
    imp.add_argument("--gray", action="store_true", help="convert to one grayscale channel (default: RGB)")
    deploy = sub.add_parser("deploy", help="real Flower deployment: SuperLink + SuperNodes (TLS, node auth)")
    dsub = deploy.add_subparsers(dest="deploy_command", required=True)
    local = dsub.add_parser("local", help="run one experiment on a SuperLink and N SuperNodes on 127.0.0.1")
    local.add_argument("config", nargs="?", help="YAML file of config keys (default: schema defaults)")
    local.add_argument("--clients", type=int, default=None,
                       help="number of SuperNodes, one per client: sets num_clients over the config file's "
                            "(default: num_clients; with --set num_clients=N, N must be the same)")
    local.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    local.add_argument("--out", required=True, help="output directory (results, logs, keys, state)")
    local.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    local.add_argument("--isolation", choices=("subprocess", "process"), default="subprocess",
                       help="ClientApp isolation of the SuperNodes (default: subprocess)")
    local.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take, > 0 (default 3600)")
    local.add_argument("--fleet-max-object-body", default=DEFAULT_FLEET_MAX_OBJECT_BODY, metavar="SIZE",
                       help="the largest push-object body the Fleet proxy accepts (an nginx size; default "
                            f"{DEFAULT_FLEET_MAX_OBJECT_BODY}: "
                            "Flower's 5 MiB array chunks and 1 MiB for the rest); a run whose clients send more "
                            "is refused before anything starts")
    restart = dsub.add_parser("restart-node", help="start SuperNode N of a running `deploy local` again (e.g. after "
                              "it was killed); works at once: a refusal is retried for up to 150 s")
    restart.add_argument("--out", required=True, help="the --out directory of the running `fedpers deploy local`")
    restart.add_argument("node", type=int, help="the SuperNode's number (its partition id), 0..clients-1")
    certs = dsub.add_parser("certs", help="make a CA, a SuperLink certificate and SuperNode keys")
    certs.add_argument("--out", required=True, help="directory for ca.crt, server.pem/.key, supernode-<i>.key(.pub), "
                       "superexec.secret")
    certs.add_argument("--nodes", type=int, default=None, help="number of SuperNode key pairs (default 3)")
    certs.add_argument("--force", action="store_true", help="replace a CA already in --out")
    certs.add_argument("--days", type=int, default=DEFAULT_CERT_DAYS,
                       help=f"how long the CA and SuperLink certificates are valid (1..{MAX_CERT_DAYS}; default "
                            f"{DEFAULT_CERT_DAYS})")
    certs.add_argument("--renew", action="store_true",
                       help="new CA and SuperLink certificates for --days, signed with the CA key in --out, for the "
                            "names the current certificate holds (and any --host); SuperNode keys, their "
                            "registrations and superexec.secret are kept")
    certs.add_argument("--host", dest="hosts", action="append", default=[],
                       help="another DNS name or IP the Fleet proxy is reached at, e.g. the public name edge "
                            "SuperNodes use (repeatable); added to the names the compose stack needs: fleet-proxy, "
                            "runtime-proxy, superlink, localhost, 127.0.0.1")
    return p


def resolve(args: argparse.Namespace) -> Config:
    """Defaults <- --shared <- YAML <- --set <- --out, validated; warns about keys the method ignores."""
    extra = {"out_dir": args.out} if getattr(args, "out", None) is not None else {}  # --out "" is refused
    if getattr(args, "tensorboard", False):
        extra["tensorboard"] = True
    if getattr(args, "overwrite", False):
        extra["overwrite"] = True
    cfg = load_config(args.config, args.sets, shared=getattr(args, "shared", []), **extra)
    warn_ignored_keys(cfg, args.config, args.sets)
    return cfg


def warn_ignored_keys(cfg: Config, path: str | None, sets: list[str]) -> None:
    """One warning line naming the keys of the run's own config file and ``--set`` that its method ignores
    (another method's keys, an extension's that is off): such a run is not the experiment its command
    reads as. A sweep passes its shared base with ``--shared``, which is not looked at here."""
    from fedpers.registry.config import ignored_keys, load_yaml, parse_set_arguments

    given = {**(load_yaml(path) if path else {}), **parse_set_arguments(sets)}
    ignored = ignored_keys(cfg, given)
    if ignored:
        print(f"fedpers: warning: method {cfg.method} ignores {', '.join(ignored)}", file=sys.stderr, flush=True)


def preflight(cfg: Config, *, simulation: bool = True) -> None:
    """Everything that can fail on bad input, done before Ray starts: device, data, partition, out dir,
    client state dir and, for a simulation, memory. A refused run leaves no folder it made behind."""
    from fedpers.core.rundir import removed_if_refused

    with removed_if_refused(cfg.out_dir, cfg.client_state_dir):
        _preflight(cfg, simulation=simulation)


def _preflight(cfg: Config, *, simulation: bool) -> None:
    from fedpers.apps.server_app import check_run_dir
    from fedpers.registry.methods import federation_for
    from fedpers.core.training import resolve_device

    if cfg.ray_address:  # first: a wrong address is one line within seconds, before data is loaded
        from fedpers.core.cluster import check_reachable

        check_reachable(cfg.ray_address)
    resolve_device(cfg.device)
    if simulation and not cfg.ray_address:
        check_client_resources(cfg)
    if cfg.wandb != "off":
        from fedpers.core.results import wandb_module

        wandb_module()  # the optional extra is there, before the engine starts
    from fedpers.core.rundir import live_run_holder, writable_dir

    holder = live_run_holder(cfg.out_dir)
    if holder is not None:  # --overwrite and resume=true would both be refused by that run's lock
        raise FedpersError(f"{cfg.out_dir} is in use by a live fedpers run (pid {holder}): wait for it to end or "
                           "choose another --out (--overwrite and resume=true do not apply to a running run)")
    check_run_dir(cfg)
    if cfg.client_state_dir:  # every client writes its state there (with client_state_spill, only there)
        writable_dir(cfg.client_state_dir, "config key 'client_state_dir'")
    fed = federation_for(cfg)
    if cfg.ray_address:
        from fedpers.core.cluster import check_data_on_nodes

        nodes = check_data_on_nodes(cfg)
        print(f"fedpers | Ray cluster {cfg.ray_address}: {nodes} nodes can read the data", flush=True)
    if simulation:
        check_memory(cfg, fed)
    sizes = [len(t) for t in fed.partition.train]
    print(f"fedpers | {cfg.method} on {fed.dataset.name}: {fed.num_clients} clients "
          f"({min(sizes)}-{max(sizes)} train samples each), |Ds|={len(fed.partition.aux)}, "
          f"{cfg.rounds} rounds, results -> {cfg.out_dir}", flush=True)


def check_client_resources(cfg: Config) -> None:
    """Refuse ``client_cpus`` / ``client_gpus`` that this machine does not have: Ray would start, place no
    client actor ("ActorPool is empty") and the run would hang instead of failing."""
    import torch

    cpus = os.cpu_count() or 1
    if cfg.client_cpus > cpus:
        raise FedpersError(f"config key 'client_cpus': {cfg.client_cpus:g} CPUs per client, but this machine has "
                           f"{cpus}: no client could be placed (at most {cpus})")
    gpus = torch.cuda.device_count() if cfg.client_gpus > 0 else 0
    if cfg.client_gpus > gpus:
        have = "no CUDA GPU" if gpus == 0 else f"{gpus} GPU{'s' if gpus > 1 else ''}"
        raise FedpersError(f"config key 'client_gpus': {cfg.client_gpus:g} GPUs per client, but this machine has "
                           f"{have}: no client could be placed (client_gpus=0 trains on the CPUs)")


def check_memory(cfg: Config, fed) -> None:
    """Print the run's memory estimate; refuse a run that cannot fit in the host's (or GPU's) free memory."""
    from fedpers.apps.memory import available_host_bytes, estimate
    from fedpers.core.models import build_model
    from fedpers.registry.methods import client_class_for, model_kind_of

    if cfg.ray_address:  # another cluster's machines: nothing to compare with here
        return
    model = build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim, dropout=cfg.dropout,
                        kind=model_kind_of(cfg))
    need = estimate(cfg, fed, client_class_for(cfg), model)
    print(f"fedpers | {need.line()}", flush=True)
    free = available_host_bytes()
    if free is not None and need.host > free:
        raise FedpersError(f"the run needs about {need.host / 2**30:.1f} GiB of host memory but {free / 2**30:.1f} "
                           f"GiB are available: fewer client actors (raise client_cpus), client_state_spill=true, "
                           f"or fewer clients")
    if need.gpu:
        import torch

        gpu_free = torch.cuda.mem_get_info()[0]
        if need.gpu > gpu_free:
            raise FedpersError(f"the run needs about {need.gpu / 2**30:.1f} GiB of GPU memory but "
                               f"{gpu_free / 2**30:.1f} GiB are free: raise client_gpus (fewer actors per GPU)")


def cmd_run(args: argparse.Namespace) -> int:
    """Run one experiment and print where its results are."""
    from fedpers.core.schema import simulated_layout

    cfg = simulated_layout(resolve(args))  # the memory estimate and the run record see the layout that runs
    in_process = args.engine == "inprocess"
    if in_process and cfg.ray_address:
        raise FedpersError(f"config key 'ray_address' names a Ray cluster ({cfg.ray_address}), but --engine "
                           "inprocess runs without Ray: drop one of them")
    preflight(cfg, simulation=not in_process)
    from fedpers.core.results import read_summary
    from fedpers.apps.inprocess import run_in_process
    from fedpers.apps.simulation import run_simulation

    from fedpers.core.rundir import RunLock

    t0 = time.perf_counter()
    with RunLock(cfg.out_dir):
        try:
            if in_process:
                run_in_process(cfg)
            else:
                run_simulation(cfg, verbose=args.verbose)
        except FedpersError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the engine raises ends the command in one line
            raise EngineError(f"the simulation engine failed ({_root_cause(exc)}); finished rounds are in "
                              f"{cfg.out_dir}/metrics.jsonl, --verbose shows Flower's and Ray's logs") from None
    try:
        summary = read_summary(cfg.out_dir)
    except FileNotFoundError:
        raise FedpersError(f"the run ended without writing {cfg.out_dir}/summary.json (see the log above)") from None
    metric = summary["metric"]
    print(f"fedpers | done in {time.perf_counter() - t0:.1f} s: final {metric} = "
          f"{summary['final'].get(metric)} | {cfg.out_dir}/metrics.jsonl, {cfg.out_dir}/summary.json", flush=True)
    return 0


def _root_cause(exc: BaseException) -> str:
    """``Type: message`` of the innermost cause of ``exc`` (Flower wraps the engine's errors in a
    RuntimeError saying only that the simulation ended), cut for an error line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {cut(text[0])}" if text else type(exc).__name__


def cmd_config(args: argparse.Namespace) -> int:
    """Print the resolved config (or the key list)."""
    if args.keys:
        schema = full_schema()
        for k in schema.keys:
            print(f"{k.name:24s} {schema.owner_of[k.name]:9s} {k.type.__name__:6s} default={k.default!r:18s} {k.help}")
        return 0
    print(yaml.safe_dump(resolve(args).to_dict(), sort_keys=False), end="")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run a sweep (skipping finished runs), then write its report."""
    from fedpers.apps.report import report
    from fedpers.apps.sweep import load_sweep, plan, run_sweep

    if not args.out.strip():
        raise FedpersError("--out must name a directory, not be empty")
    sweep = load_sweep(args.sweep, args.sets, args.datasets)
    if not args.report_only:
        from fedpers.apps.sweep import check_datasets

        check_datasets(sweep, args.sweep)
    if args.dry_run:
        for run in plan(sweep, args.out):
            print(run.run_dir)
        return 0
    from fedpers.core.rundir import RunLock, removed_if_refused, writable_dir
    from fedpers.apps.sweep import check_finished_runs, check_jobs, move_legacy_run_dirs, report_moves, write_plan

    check_jobs(args.jobs)  # before the directory is made: a refused sweep leaves none behind
    with removed_if_refused(args.out):
        writable_dir(args.out, "--out")
    with RunLock(args.out):  # a second sweep on the same directory would run the same runs twice
        if args.report_only:
            report_moves(move_legacy_run_dirs(sweep, args.out), args.out, "sweep")
            check_finished_runs(plan(sweep, args.out), "sweep")  # before sweep.json is rewritten
            write_plan(sweep, args.out)
            failed = []
        else:
            failed = run_sweep(sweep, args.out, tensorboard=args.tensorboard, jobs=args.jobs, engine=args.engine)
    for path in report(args.out):
        print(f"sweep | wrote {path}")
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    """Table and figures of a sweep directory."""
    from fedpers.apps.report import report

    for path in report(args.dir, value=args.value, metric=args.metric, versus=args.versus):
        print(f"report | wrote {path}")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    """``docs``: rewrite (or, with ``--check``, compare) the generated blocks of the results pages."""
    from pathlib import Path

    from fedpers.apps.results_pages import stale_pages, write_pages

    root = Path.cwd()
    if args.check:
        stale = stale_pages(root)
        for page in stale:
            print(f"docs | {page}: generated blocks are stale (run `fedpers docs`)")
        return 1 if stale else 0
    for page in write_pages(root):
        print(f"docs | rewrote {page}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """``data import-folder``: read the tree, write the .npz (never over an existing file), print its shape."""
    from pathlib import Path

    import numpy as np

    from fedpers.core.image_folder import import_image_folder

    out = Path(args.out)
    if out.suffix != ".npz":
        raise FedpersError(f"--out {cut(str(out))}: must name a .npz file")
    if out.exists() or out.is_symlink():
        raise FedpersError(f"--out {cut(str(out))}: exists; a dataset file is never overwritten (remove it first)")
    if not out.parent.is_dir():
        raise FedpersError(f"--out {cut(str(out))}: its folder does not exist")
    order = None
    if args.domain_order is not None:
        if not args.domains:
            raise FedpersError("--domain-order needs --domains (a tree with a domain level)")
        order = [d.strip() for d in args.domain_order.split(",")]
    arrays = import_image_folder(Path(args.tree), size=args.size, domains=args.domains, gray=args.gray,
                                 domain_order=order, resample=args.resample)
    partial = out.with_name(out.name + ".partial.npz")
    try:
        np.savez_compressed(partial, **arrays)
        partial.replace(out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise FedpersError(f"--out {cut(str(out))}: cannot be written ({exc.strerror})") from None
    x_train, x_test = arrays["x_train"], arrays["x_test"]
    domains = f", {len(arrays['domain_names'])} domains" if "domain_names" in arrays else ""
    print(f"fedpers | {out}: {len(x_train)} train / {len(x_test)} test images of "
          f"{x_train.shape[2]}x{x_train.shape[1]}x{x_train.shape[3]}, {len(arrays['class_names'])} classes{domains}",
          flush=True)
    return 0


def cmd_methods(_: argparse.Namespace) -> int:
    """List the registry."""
    from fedpers.registry.methods import METHODS

    for spec in METHODS.values():
        print(f"{spec.name:10s} metric={spec.metric:24s} {spec.paper}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Print, write (``--write-pyproject``) or check (``--check``) the generated run-config table."""
    from fedpers.apps.run_config_table import ROOT, pyproject_in_sync, run_config_table, write_pyproject

    if args.write_pyproject:
        changed = write_pyproject()
        print(f"fedpers | {ROOT / 'pyproject.toml'}: run-config table {'rewritten' if changed else 'already up to date'}")
        return 0
    if args.check:
        if pyproject_in_sync():
            return 0
        print("fedpers: pyproject.toml's [tool.flwr.app.config] is not the generated table: run "
              "`fedpers schema --write-pyproject`", file=sys.stderr)
        return 1
    print(run_config_table(), end="")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """``deploy local``: one experiment on a loopback deployment; ``deploy restart-node``: one of its
    SuperNodes started again; ``deploy certs``: TLS material and keys."""
    from fedpers.apps import deploy

    if args.deploy_command == "certs":
        if args.renew and (args.force or args.nodes is not None):
            raise FedpersError("--renew keeps the CA key and the SuperNode keys: leave out --force and --nodes")
        if args.renew:
            pki = deploy.renew_certs(args.out, args.hosts, days=args.days)
            made = f"renewed: CA {pki.ca_cert} (same key), SuperLink certificate {pki.server_cert} (new key)"
        else:
            pki = deploy.make_certs(args.out, 3 if args.nodes is None else args.nodes, deploy.cert_hosts(args.hosts),
                                    force=args.force, days=args.days)
            made = f"CA {pki.ca_cert}, SuperLink certificate {pki.server_cert}"
        names = ", ".join(deploy.certificate_names(pki.server_cert))
        until = deploy.certificate_expiry(pki.server_cert).strftime("%Y-%m-%d %H:%M UTC")
        print(f"fedpers | {made} for {names}, {len(pki.node_keys)} SuperNode keys in {pki.dir}; valid until {until} "
              f"({args.days} days): renew before then with `fedpers deploy certs --renew --out {pki.dir}`")
        return 0
    if args.deploy_command == "restart-node":
        record = deploy.restart_node(args.out, args.node)
        print(f"fedpers | SuperNode {args.node} started again (pid {record['node']['pid']}, log "
              f"{record['node']['log']}); it rejoins once the SuperLink lets its key in (retried for up to "
              f"{deploy.DEFAULT_RETRY_FOR:.0f} s)", flush=True)
        return 0
    # every argument is checked before anything starts: the CA, nginx and the SuperNodes are not made or
    # started for a run that is refused afterwards
    if args.clients is not None and args.clients < 1:
        raise FedpersError("--clients must be >= 1")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise FedpersError(f"--timeout must be a number of seconds > 0, got {args.timeout:g}")
    nginx_size(args.fleet_max_object_body, "--fleet-max-object-body")
    sets = list(args.sets)
    if args.clients is not None:
        given = parse_set_arguments(args.sets).get("num_clients")
        if given is None:
            sets.append(f"num_clients={args.clients}")  # over the config file's, as a --set would be
        elif core_value("num_clients", given) != args.clients:
            raise FedpersError(f"--clients {args.clients} and --set num_clients={core_value('num_clients', given)} "
                               "disagree: each SuperNode is one client; give one of them")
    cfg = load_config(args.config, sets, out_dir=args.out, **({"overwrite": True} if args.overwrite else {}))
    warn_ignored_keys(cfg, args.config, args.sets)
    preflight(cfg, simulation=False)
    t0 = time.perf_counter()
    summary = deploy.deploy_local(cfg, cfg.num_clients, args.out, isolation=args.isolation, timeout=args.timeout,
                                  max_object_body=args.fleet_max_object_body)
    metric = summary["metric"]
    print(f"fedpers | deploy done in {time.perf_counter() - t0:.1f} s: final {metric} = "
          f"{summary['final'].get(metric)} | {args.out}/metrics.jsonl, {args.out}/summary.json", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedpers`` script."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    args = _parser().parse_args(argv)
    handler = {"run": cmd_run, "config": cmd_config, "methods": cmd_methods, "sweep": cmd_sweep, "report": cmd_report,
               "schema": cmd_schema, "data": cmd_data, "docs": cmd_docs, "deploy": cmd_deploy}[args.command]
    # only where the signal has its default action: a SIGINT ignored by the shell (a background job) stays so
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    _forward_signals_to_main_thread()
    global _ray_before_command
    _ray_before_command = "ray" in sys.modules
    STOP_REQUESTED.clear()  # a process that calls main() again (a test suite) starts each command unstopped
    try:
        if args.command in ("run", "sweep", "deploy"):
            allocator_choice()  # a bad FEDPERS_MALLOC is one line here, not an error inside every client
        return handler(args)
    except FedpersError as exc:
        print(f"fedpers: error: {exc}", file=sys.stderr, flush=True)
        # the engine's threads may still wait for replies: do not join them
        if _simulating() or isinstance(exc, EngineError):
            exit_now(exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        _say_interrupted()
        exit_now(_exit_code)
    return _exit_code  # not reached


# After Ctrl-C, this long for the run to unwind (Flower stops its Ray actors, Ray shuts down) before the
# command ends anyway (ours): nothing on that path has a timeout (Flower's engine calls ray.shutdown()),
# and on one CI machine the exit took 48.5 s where it takes 1.5 s here.
INTERRUPT_GRACE_S = 10.0
# The exit code and the word of each signal that ends a command: the shell's 128 + signal number.
SIGNAL_EXITS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
_interrupted = False
_said_interrupted = False
_exit_code, _ended_word = SIGNAL_EXITS[signal.SIGINT]
# The processes this command had started when the signal came (pid -> start time): Flower's engine stops
# Ray as the interrupt unwinds, and Ray's shutdown stops the raylet first, which leaves its workers (a
# client actor in the middle of a fit) to init, no longer in this process's tree; they are ended too.
_tree_at_signal: dict[int, str | None] = {}
# Whether Ray was imported before this command began: only a command that imported it itself ran a
# simulation whose threads may hang the exit. (A process that calls main() more than once, a test suite,
# may hold Ray from earlier: ending it with os._exit on a refused input would end that process.)
_ray_before_command = False


def _simulating() -> bool:
    """Whether this command has started Flower's simulation engine (it imported Ray)."""
    return "ray" in sys.modules and not _ray_before_command


def _interrupt(signum, frame) -> None:
    """Ctrl-C or SIGTERM: silence Flower's logger, make sure a simulation ends within
    :data:`INTERRUPT_GRACE_S`, then stop the way Python does on Ctrl-C (a KeyboardInterrupt, here
    :class:`fedpers.core.errors.Interrupted` naming the signal); the command exits with 130 or 143.

    SIGTERM (what ``kill``, Slurm and docker send) takes the same path as Ctrl-C: its default action would
    end the process without unwinding, and Ray's own handler dumps its stacks. Flower's simulation engine
    stops its Ray actors as the interrupt unwinds through it, and its worker threads log every message the
    stopped actors drop with a full traceback. The run is ending on purpose and says so in one line
    (``fedpers: interrupted`` / ``fedpers: terminated``). In a simulation a second signal (a sweep's run
    gets the terminal's Ctrl-C and then the sweep's) changes nothing: the first one's deadline and exit code
    stand; in a deployment it cuts the graceful stop of its processes short, as before."""
    global _interrupted, _exit_code, _ended_word
    STOP_REQUESTED.set()  # first: the replies the stop cuts short must find it set (fedpers.core.errors)
    simulating = _simulating()  # only a simulation has Ray to wait for; a deployment stops its own
    if _interrupted and simulating:
        return
    if not _interrupted:
        _exit_code, _ended_word = SIGNAL_EXITS.get(signum, SIGNAL_EXITS[signal.SIGINT])
        _tree_at_signal.update(own_tree())
    _interrupted = True
    logging.getLogger("flwr").disabled = True
    if simulating:
        threading.Thread(target=_end_after, args=(INTERRUPT_GRACE_S,), name="fedpers-interrupt-deadline",
                         daemon=True).start()
    raise Interrupted(signum)


def _forward_signals_to_main_thread() -> None:
    """Make sure a SIGINT / SIGTERM reaches :func:`_interrupt`, which Python runs in the main thread only.

    The kernel hands a process's signal to any one of its threads. Delivered to one of Ray's or Flower's
    threads, it only marks the signal as pending, and a main thread blocked in a lock (joining Flower's
    worker threads) is not woken up: the command went on as if nothing had come (1 run in about 20 on a
    busy machine). Python's wakeup fd says that a signal came; a thread of ours then sends it to the main
    thread itself unless the handler has run already."""
    if threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not in the main thread of the main interpreter
        return
    threading.Thread(target=_forwarder, args=(read_fd, threading.main_thread().ident),
                     name="fedpers-signal-forwarder", daemon=True).start()


def _forwarder(read_fd: int, main_thread: int) -> None:
    """Read the signal numbers of the wakeup fd; resend SIGINT / SIGTERM to the main thread while its
    handler has not run (after a moment, in which a signal that reached the main thread is handled there)."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        for signum in data:
            if signum in SIGNAL_EXITS:
                time.sleep(0.5)
                if not _interrupted:
                    signal.pthread_kill(main_thread, signum)


def _end_after(seconds: float) -> None:
    """The interrupt's deadline: if the command is still unwinding after ``seconds``, end it and all it
    started now (every results file is written line by line, every checkpoint atomically)."""
    time.sleep(seconds)
    if not _said_interrupted:
        print(f"fedpers: {_ended_word} (ended after {seconds:.0f} s of shutting down)", file=sys.stderr, flush=True)
    _end(_exit_code, dict(_tree_at_signal))


def _say_interrupted() -> None:
    global _said_interrupted
    _said_interrupted = True
    print(f"fedpers: {_ended_word}", file=sys.stderr, flush=True)


def exit_now(code: int) -> None:
    """End the process at once with ``code``, after stopping the Ray cluster this process started.

    A plain return would make the interpreter join Flower's threads at exit (the ServerApp thread and its
    thread pool wait for replies that never come once the engine has stopped), which hangs for minutes.
    Every results file is written line by line with a flush, so nothing half-written is left behind."""
    started = {**_tree_at_signal, **own_tree()}  # before Ray's shutdown leaves its workers to init
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        stopper = threading.Thread(target=ray.shutdown, daemon=True)
        stopper.start()
        stopper.join(timeout=5)
    _end(code, started)


def _end(code: int, started: dict[int, str | None] | None = None) -> None:
    """Kill whatever this process started that is still alive (Ray's processes when its shutdown did not
    finish, and those of ``started`` that its shutdown orphaned), flush and exit with ``code``."""
    kill_own_tree(started)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
