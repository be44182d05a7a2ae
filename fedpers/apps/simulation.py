"""Run one experiment in Flower's Ray simulation engine, in this process.

``flwr run .`` starts a managed local SuperLink that outlives the command; a research CLI wants one
process that starts, runs and stops everything. This module drives the same engine that
``flwr-simulation`` uses (``flwr.simulation.run_simulation._run_simulation``, pinned flwr 1.42) with the
project's own ``server_app``/``client_app`` and one SuperNode per client (the private entry point is
wrapped in :mod:`fedpers.apps.flower_internals`). The run-config reaches the
simulated SuperNodes through a generated app directory whose ``pyproject.toml`` holds the resolved config.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

import tomli_w

from fedpers.core.schema import pool_size, pooled, simulated_layout
from fedpers.registry.config import Config

CLIENT_APP_ATTR = "fedpers.apps.client_app:client_app"
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def backend_config(cfg: Config) -> dict:
    """Ray backend settings: per-client CPU/GPU resources (fractional GPUs allowed) and, with
    ``ray_address``, the cluster to join."""
    init_args: dict = {"logging_level": "ERROR", "log_to_driver": True}
    if cfg.ray_address:
        init_args["address"] = cfg.ray_address  # join an existing cluster instead of starting Ray
    return {
        "client_resources": {"num_cpus": cfg.client_cpus, "num_gpus": cfg.client_gpus},
        "init_args": init_args,
    }


def write_app_dir(cfg: Config, directory: Path, *, code: bool = False) -> Path:
    """A minimal Flower app directory whose run-config is ``cfg`` (read by every simulated SuperNode).
    ``code=True`` (what ``flwr run`` of it submits to a deployment) also copies the app's packages into it
    and names them in ``fab-include``: the bundle is then the one ``flwr build`` makes of the repository
    (:mod:`fedpers.apps.bundle`), and the SuperLink and SuperNodes run that code."""
    app = {
        "publisher": "fedpers",
        "components": {"serverapp": "fedpers.apps.server_app:server_app", "clientapp": CLIENT_APP_ATTR},
        # only the keys that differ from the defaults (the clients fill those in): the simulation keeps
        # a context per node, each with its own copy of the run-config (~13 KB for all keys)
        "config": cfg.changed(),
    }
    if code:
        from fedpers.apps.bundle import FAB_INCLUDE, write_app_code

        app["fab-include"] = FAB_INCLUDE
        write_app_code(directory)
    project = {"project": {"name": "fedpers-run", "version": "0.1.0"}, "tool": {"flwr": {"app": app}}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(tomli_w.dumps(project))
    return directory


def run_simulation(cfg: Config, verbose: bool = False) -> None:
    """Run ``cfg`` with ``num_clients`` simulated SuperNodes, or with a pool of them (``client_layout``,
    :func:`fedpers.core.schema.simulated_layout`); results land in ``cfg.out_dir``. With
    ``client_state_spill`` and no ``client_state_dir``, client state lives in a directory made for this run
    (:func:`fedpers.core.state_store.run_state_dir`)."""
    from fedpers.core.state_store import run_state_dir

    with run_state_dir(simulated_layout(cfg)) as run_cfg:
        _run_in_engine(run_cfg, verbose)


class _NoTracebacks(logging.Filter):
    """Drops Flower's log records that hold a traceback: a failure ends the command with one line of its
    own (``fedpers: error: ...``); ``--verbose`` shows them."""

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: D102
        return "Traceback (most recent call last)" not in record.getMessage()


def start_ray(backend: dict) -> None:
    """Start (or join) Ray as Flower's Ray backend would (its ``RayBackend.init_ray``: the backend's init
    args, no dashboard, this process's ``sys.path`` as the workers' PYTHONPATH), keeping this process's
    SIGTERM handler.

    Why here and not in the backend: ``ray.init`` replaces the SIGTERM handler of the process it runs in
    with Ray's own (stop Ray, ``sys.exit(1)``: a stack dump and exit 134 in the middle of a round), and
    the backend calls it inside the engine, where the command can no longer put its own back. Started
    here, the backend finds Ray running and leaves it as it is; SIGTERM then ends the run as Ctrl-C does."""
    import signal
    import sys

    import ray

    if ray.is_initialized():
        return
    init_args = {"include_dashboard": False, **backend.get("init_args", {})}
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    handler = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)
    except Exception as exc:  # noqa: BLE001 - an unreachable cluster, a port in use: one line
        from fedpers.core.errors import EngineError, cut

        where = f"join the Ray cluster at {init_args['address']}" if "address" in init_args else "start Ray"
        raise EngineError(f"could not {where}: {type(exc).__name__}: {cut(str(exc).strip())}") from None
    finally:
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


def _run_in_engine(cfg: Config, verbose: bool) -> None:
    from flwr.app import Context, RecordDict

    from fedpers.apps.server_app import server_app
    from fedpers.apps.flower_internals import run_simulation_engine

    if not verbose:  # after Flower's imports, which set up its logger
        logging.getLogger("flwr").setLevel(logging.WARNING)
        flwr_logger = logging.getLogger("flwr")
        if not any(isinstance(f, _NoTracebacks) for f in flwr_logger.filters):
            flwr_logger.addFilter(_NoTracebacks())
    backend = backend_config(cfg)
    start_ray(backend)
    with tempfile.TemporaryDirectory(prefix="fedpers-app-") as tmp:
        app_dir = write_app_dir(cfg, Path(tmp))
        context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=cfg.changed())
        nodes = pool_size(cfg) if pooled(cfg) else cfg.num_clients
        run_simulation_engine(num_supernodes=nodes, client_app_attr=CLIENT_APP_ATTR, server_app=server_app,
                              backend_config=backend, server_app_context=context, app_dir=str(app_dir),
                              verbose=verbose)
