"""Flower ServerApp entry point: ``server_app`` (``serverapp`` in pyproject's ``[tool.flwr.app.components]``;
the ClientApp is ``fedpers.apps.client_app:client_app``).

The same objects run in Flower's Ray simulation engine (``fedpers run``, ``flwr run .``) and as real
SuperLink/SuperNode processes. The run's settings come from the Flower run-config, validated by the
fedpers schema; the method's Strategy and NumPyClient come from the registry. The legacy round loop
(``flwr.server.compat.start_grid``) runs on a :class:`~fedpers.apps.prompt_grid.PromptReplyGrid`, so a
deployed round does not wait for Flower's 3-s reply checks.
"""

from __future__ import annotations

import os
from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.compat import start_grid
from flwr.serverapp import Grid

from fedpers.core.allocator import retain_freed_memory
from fedpers.core.checkpoint import checkpoint_path, load_checkpoint
from fedpers.apps.client_app import config_of
from fedpers.registry.config import Config
from fedpers.core.errors import ConfigError, FedpersError
from fedpers.apps.prompt_grid import PromptReplyGrid
from fedpers.registry.methods import federation_for, strategy_class_for
from fedpers.core.results import ResultsWriter
from fedpers.core.run_figures import label_distribution_png
from fedpers.core.rundir import check_out_dir


def server_fn(context: Context) -> ServerAppComponents:
    """Build the method's Strategy, its results writer and the number of rounds."""
    retain_freed_memory()  # the in-process engine's clients and the server's own evaluations run here
    cfg = config_of(context)
    federation = federation_for(cfg)  # checked to hold Ds when the method needs it
    state = check_run_dir(cfg)  # before the results writer touches out_dir
    writer = ResultsWriter(cfg.out_dir, tensorboard=cfg.tensorboard, wandb=cfg.wandb,
                           wandb_project=cfg.wandb_project, config=cfg.to_dict())
    federation.save_partition(writer.out_dir / "partition.npz", dataset=Path(cfg.dataset).name)
    label_distribution_png(federation.client_label_counts(), writer.out_dir / "partition.png")
    strategy = strategy_class_for(cfg)(cfg, federation, writer)  # method (+ JDFL wrapper)
    config = ServerConfig(num_rounds=cfg.rounds, round_timeout=cfg.round_timeout or None)
    if state is not None:
        return _resume(cfg, strategy, config, state)
    if cfg.resume:  # INFO: every sweep run starts this way (resumable by default)
        log(INFO, "fedpers: resume=true but no checkpoint in %s yet: starting at round 1", cfg.checkpoint_dir)
    return ServerAppComponents(server=round_loop(strategy), config=config)


def round_loop(strategy, *, start_round: int = 1, client_manager=None, stop_after: int | None = None):
    """The one round loop every engine runs (:class:`fedpers.apps.flower_internals.ResumableServer`), for
    ``strategy`` from ``start_round`` on; ``client_manager``: Flower's ``SimpleClientManager`` unless the
    engine brings its own (the in-process engine's proxies)."""
    from flwr.server import SimpleClientManager

    from fedpers.apps.flower_internals import ResumableServer

    return ResumableServer(start_round=start_round, stop_after=stop_after, strategy=strategy,
                           client_manager=client_manager or SimpleClientManager())


def check_run_dir(cfg: Config) -> dict | None:
    """The output directory (:func:`fedpers.core.rundir.check_out_dir`), then the checkpoint a resume continues
    from: both checked before anything is written (by the CLI before the engine starts, by the ServerApp
    before its results writer opens a file). Returns the checkpoint to resume from, or None."""
    check_out_dir(cfg.out_dir, overwrite=cfg.overwrite, resume=cfg.resume,
                  checkpoint_file=checkpoint_path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None)
    return checkpoint_to_resume(cfg)


def checkpoint_to_resume(cfg: Config) -> dict | None:
    """The checkpoint a ``resume=true`` run continues from, loaded and checked against ``cfg`` (None: a
    fresh run, also when resume=true finds no checkpoint yet); a corrupt checkpoint or one of another
    experiment is a FedpersError."""
    if not cfg.resume:
        return None
    if not cfg.checkpoint_dir:
        raise FedpersError("config key 'resume': resume=true needs checkpoint_dir")
    if not checkpoint_path(cfg.checkpoint_dir).is_file():
        return None
    state = load_checkpoint(cfg.checkpoint_dir, cfg)
    done = int(state["round"])
    if done > cfg.rounds:  # the summary would say rounds=cfg.rounds and hold the checkpoint's later rounds
        raise ConfigError(f"config key 'rounds': the checkpoint {checkpoint_path(cfg.checkpoint_dir)} holds "
                          f"{done} rounds, more than rounds={cfg.rounds}; resume with rounds >= {done}")
    return state


def _resume(cfg: Config, strategy, config: ServerConfig, state: dict) -> ServerAppComponents:
    """Load the checkpoint ``state`` into ``strategy`` and start the round loop after its round."""
    strategy.load_state_dict(state)
    done = int(state["round"])
    log(INFO, "fedpers: resuming from %s after round %d of %d", checkpoint_path(cfg.checkpoint_dir), done, cfg.rounds)
    if done >= cfg.rounds and strategy.book.history:
        strategy.book.write_summary()  # nothing left to run; the summary reflects the checkpoint
    return ServerAppComponents(server=round_loop(strategy, start_round=done + 1), config=config)


# round_timeout=0 on Flower's Deployment Engine: a round waits at most this long for its replies. A SuperNode
# whose ClientApp runner stopped stays online and never answers, and without a bound its round, and the run,
# would wait for it for as long as Flower keeps the message (12 h); 30 min leaves a slow client's round
# room (a round of `make compose-check`'s 2-round digits run took 170 s on 2 cores).
DEPLOYMENT_ROUND_TIMEOUT = 1800.0


def on_deployment_engine(grid: Grid) -> bool:
    """Whether the ServerApp runs on Flower's Deployment Engine (SuperLink and SuperNodes), not in a
    simulation (whose in-memory grid's clients cannot vanish)."""
    from flwr.superlink.grid import InMemoryGrid

    return not isinstance(grid, InMemoryGrid)


def with_deployment_defaults(run_config: dict) -> dict:
    """``run_config`` with the Deployment Engine's defaults: ``round_timeout`` 0 (the schema's "the
    engine's default") becomes :data:`DEPLOYMENT_ROUND_TIMEOUT`; a value the run sets is kept."""
    if float(run_config.get("round_timeout", 0.0) or 0.0) > 0:
        return dict(run_config)
    return {**run_config, "round_timeout": DEPLOYMENT_ROUND_TIMEOUT}


def check_fleet_proxy_bound(cfg: Config) -> None:
    """Refuse a run (one line, before round 1) whose clients would send Fleet requests larger than the
    proxy in front of the SuperLink accepts: the deployment tells the ServerApp the proxy's bound in
    ``FEDPERS_FLEET_MAX_OBJECT_BODY`` (``fedpers deploy local``, docker-compose.yml); unset: nothing to check."""
    from fedpers.apps.fleet_bodies import FLEET_BOUND_ENV, check_fleet_bound, nginx_size

    bound = os.environ.get(FLEET_BOUND_ENV)
    if bound:
        limit = nginx_size(bound, FLEET_BOUND_ENV)
        log(INFO, "fedpers: %s", check_fleet_bound(cfg, limit).line(limit))


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """The run: :func:`server_fn`'s components in the one round loop (:func:`round_loop`), replies collected
    every ``reply_poll_interval`` seconds. On the Deployment Engine, its defaults apply first
    (:func:`with_deployment_defaults`) and the run is checked against the Fleet proxy's body bound."""
    if on_deployment_engine(grid):
        context.run_config = with_deployment_defaults(context.run_config)
        check_fleet_proxy_bound(config_of(context))
    components = server_fn(context)
    start_grid(grid=PromptReplyGrid(grid, config_of(context).reply_poll_interval), server=components.server,
               config=components.config, strategy=components.strategy, client_manager=components.client_manager)
