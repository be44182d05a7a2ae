"""Flower entry points: ``server_app`` and ``client_app`` (named in pyproject's ``[tool.flwr.app.components]``).

The same two objects run in Flower's Ray simulation engine (``fedpers run``, ``flwr run .``) and as real
SuperLink/SuperNode processes. The run's settings come from the Flower run-config, validated by the
fedpers schema; the method's Strategy and NumPyClient come from the registry.
"""

from __future__ import annotations

import functools
from logging import INFO
from pathlib import Path

import torch
from flwr.app import Context
from flwr.client import ClientApp
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fedpers.checkpoint import checkpoint_path, load_checkpoint
from fedpers.config import Config, from_run_config
from fedpers.errors import FedpersError
from fedpers.partition import save_partition
from fedpers.registry import client_class_for, federation_for, strategy_class_for
from fedpers.results import ResultsWriter
from fedpers.run_figures import label_distribution_png
from fedpers.rundir import check_out_dir


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> Config:
    return from_run_config(dict(items))


def config_of(context: Context) -> Config:
    """The validated Config of this run (parsed once per process)."""
    return _config(tuple(sorted(context.run_config.items())))


def server_fn(context: Context) -> ServerAppComponents:
    """Build the method's Strategy, its results writer and the number of rounds."""
    cfg = config_of(context)
    federation = federation_for(cfg)  # checked to hold Ds when the method needs it
    state = check_run_dir(cfg)  # before the results writer touches out_dir
    writer = ResultsWriter(cfg.out_dir, tensorboard=cfg.tensorboard, wandb=cfg.wandb,
                           wandb_project=cfg.wandb_project, config=cfg.to_dict())
    save_partition(writer.out_dir / "partition.npz", federation.partition, dataset=Path(cfg.dataset).name,
                   num_train=len(federation.dataset.y_train), num_test=len(federation.dataset.y_test))
    label_distribution_png(federation.client_label_counts(), writer.out_dir / "partition.png")
    strategy = strategy_class_for(cfg)(cfg, federation, writer)  # method (+ JDFL wrapper)
    config = ServerConfig(num_rounds=cfg.rounds, round_timeout=cfg.round_timeout or None)
    if state is not None:
        return _resume(cfg, strategy, config, state)
    if cfg.resume:  # INFO: every sweep run starts this way (resumable by default)
        from flwr.common import log

        log(INFO, "fedpers: resume=true but no checkpoint in %s yet: starting at round 1", cfg.checkpoint_dir)
    return ServerAppComponents(strategy=strategy, config=config)


def check_run_dir(cfg: Config) -> dict | None:
    """The output directory (:func:`fedpers.rundir.check_out_dir`), then the checkpoint a resume continues
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
    return load_checkpoint(cfg.checkpoint_dir, cfg.to_dict())


def _resume(cfg: Config, strategy, config: ServerConfig, state: dict) -> ServerAppComponents:
    """Load the checkpoint ``state`` into ``strategy`` and start the round loop after its round."""
    from flwr.common import log
    from flwr.server import SimpleClientManager

    from fedpers.flower_internals import ResumableServer

    strategy.load_state_dict(state)
    done = int(state["round"])
    log(INFO, "fedpers: resuming from %s after round %d of %d", checkpoint_path(cfg.checkpoint_dir), done, cfg.rounds)
    if done >= cfg.rounds and strategy.history:
        strategy._write_summary()  # nothing left to run; the summary reflects the checkpoint
    server = ResumableServer(start_round=done + 1, client_manager=SimpleClientManager(), strategy=strategy)
    return ServerAppComponents(server=server, config=config)


@functools.lru_cache(maxsize=1)
def _limit_threads(cpus: int) -> None:
    torch.set_num_threads(cpus)


def client_fn(context: Context):
    """Build the method's NumPyClient for this node (Flower recreates it for every message)."""
    cfg = config_of(context)
    _limit_threads(max(1, int(cfg.client_cpus)))
    return client_class_for(cfg)(cfg, context).to_client()


server_app = ServerApp(server_fn=server_fn)
client_app = ClientApp(client_fn=client_fn)
