"""Flower entry points: ``server_app`` and ``client_app`` (named in pyproject's ``[tool.flwr.app.components]``).

The same two objects run in Flower's Ray simulation engine (``fedpers run``, ``flwr run .``) and as real
SuperLink/SuperNode processes. The run's settings come from the Flower run-config, validated by the
fedpers schema; the method's Strategy and NumPyClient come from the registry.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from flwr.app import Context
from flwr.client import ClientApp
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fedpers.config import Config, from_run_config
from fedpers.federation import get_federation
from fedpers.partition import save_partition
from fedpers.registry import get_method
from fedpers.results import ResultsWriter


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> Config:
    return from_run_config(dict(items))


def config_of(context: Context) -> Config:
    """The validated Config of this run (parsed once per process)."""
    return _config(tuple(sorted(context.run_config.items())))


def server_fn(context: Context) -> ServerAppComponents:
    """Build the method's Strategy, its results writer and the number of rounds."""
    cfg = config_of(context)
    federation = get_federation(cfg)
    writer = ResultsWriter(cfg.out_dir, tensorboard=cfg.tensorboard)
    save_partition(writer.out_dir / "partition.npz", federation.partition, dataset=Path(cfg.dataset).name,
                   num_train=len(federation.dataset.y_train), num_test=len(federation.dataset.y_test))
    strategy = get_method(cfg.method).strategy_class()(cfg, federation, writer)
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=cfg.rounds))


@functools.lru_cache(maxsize=1)
def _limit_threads(cpus: int) -> None:
    torch.set_num_threads(cpus)


def client_fn(context: Context):
    """Build the method's NumPyClient for this node (Flower recreates it for every message)."""
    cfg = config_of(context)
    _limit_threads(max(1, int(cfg.client_cpus)))
    return get_method(cfg.method).client_class()(cfg, context).to_client()


server_app = ServerApp(server_fn=server_fn)
client_app = ClientApp(client_fn=client_fn)
