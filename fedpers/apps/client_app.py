"""Flower ClientApp entry point (``clientapp`` in pyproject's ``[tool.flwr.app.components]``).

Kept apart from the ServerApp (``fedpers.apps.server_app``) because a deployed SuperNode starts a fresh ClientApp
process for every message: this module imports only what a client needs (no ``flwr.server``, no
results writer, no plotting), and the method's client class is imported from the registry by name.

With a state directory (node config ``state-dir`` or ``client_state_dir``) every message after a node's
first reads only that client's own samples (:func:`fedpers.core.federation.use_client_slice`), not the whole
dataset and its split.

``FEDPERS_MESSAGE_TIMING=<file>`` in a ClientApp's environment appends one JSON line per message to
``<file>``: when the process started, when Flower handed it the message (imports done), when the client
was built (data and model loaded) and when the reply was ready; ``benchmarks/deploy_cost.py`` reads it.
"""

from __future__ import annotations

import functools
import json
import os
import time

import torch
from flwr.app import Context, Message, RecordDict
from flwr.client import ClientApp

from clients.base import partition_id_of
from fedpers.core.allocator import retain_freed_memory
from fedpers.registry.config import Config, from_run_config
from fedpers.core.federation import use_client_slice
from fedpers.registry.methods import client_for_message
from fedpers.core.errors import NodeMismatchError
from fedpers.core.schema import pooled
from fedpers.core.state_store import state_dir_of
from fedpers.core.wire import partition_of_message

TIMING_ENV = "FEDPERS_MESSAGE_TIMING"
_client_built_at: list[float] = []  # one slot: set by client_fn, read by the timing mod of the same message


@functools.lru_cache(maxsize=8)
def _config(items: tuple) -> Config:
    return from_run_config(dict(items))


def config_of(context: Context) -> Config:
    """The validated Config of this run (parsed once per process)."""
    return _config(tuple(sorted(context.run_config.items())))


@functools.lru_cache(maxsize=1)
def _limit_threads(cpus: int) -> None:
    torch.set_num_threads(cpus)


def client_fn(context: Context):
    """Build the method's NumPyClient for this node (Flower recreates it for every message)."""
    cfg = config_of(context)
    _limit_threads(max(1, int(cfg.client_cpus)))
    retain_freed_memory()
    client = client_for_message(cfg, context)
    _client_built_at[:] = [time.time()]  # a Ray actor serves many messages: keep only this one's
    return client


def process_start_time() -> float | None:
    """Wall-clock time this process started (Linux ``/proc``; None elsewhere)."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def message_timing(msg: Message, context: Context, call_next) -> Message:
    """ClientApp mod: with ``FEDPERS_MESSAGE_TIMING`` set, log where this message's seconds went."""
    path = os.environ.get(TIMING_ENV)
    if not path:
        return call_next(msg, context)
    handed_over = time.time()
    _client_built_at.clear()  # a message that builds no client must not report the previous one's time
    reply = call_next(msg, context)
    record = {"pid": os.getpid(), "partition_id": context.node_config.get("partition-id"),
              "type": msg.metadata.message_type, "group": msg.metadata.group_id,
              "process_start": process_start_time(), "handed_over": handed_over,
              "client_built": _client_built_at[0] if _client_built_at else None, "reply_ready": time.time()}
    with open(path, "a") as f:  # one short line per message: appends from several processes stay whole
        f.write(json.dumps(record) + "\n")
    return reply


def message_config(msg: Message) -> dict:
    """The config entries the server sent with ``msg`` (the ``<ins>.config`` record of Flower's legacy
    messages: fit, evaluate, get_properties, get_parameters)."""
    for name, record in msg.content.config_records.items():
        if name.endswith("ins.config"):
            return dict(record)
    return {}


def pooled_partition(msg: Message, context: Context, call_next) -> Message:
    """ClientApp mod: on a node of a pooled run (``client_layout=pool``), serve the partition the message
    names, as a node of its own would: a Context whose node config holds that ``partition-id`` and whose
    state is empty (a pooled client's state is on disk, found by its partition id, because its next
    message may go to another node). A message that names no partition on a pooled node, or names one on a
    node of its own, is refused (NodeMismatchError)."""
    cfg = config_of(context)
    pid = partition_of_message(message_config(msg))
    if not pooled(cfg):
        if pid is not None:
            raise NodeMismatchError(f"the message names partition {pid}, but this run gives each client a node of "
                                    "its own (client_layout is not pool)")
        return call_next(msg, context)
    if pid is None:
        raise NodeMismatchError("a node of a pooled run (client_layout=pool) got a message that names no partition")
    if not 0 <= pid < cfg.num_clients:
        raise NodeMismatchError(f"the message names partition {pid}, outside 0..{cfg.num_clients - 1}")
    client_context = Context(run_id=context.run_id, node_id=context.node_id,
                             node_config={**context.node_config, "partition-id": pid, "num-partitions": cfg.num_clients},
                             state=RecordDict(), run_config=context.run_config)
    return call_next(msg, client_context)


def own_samples_only(msg: Message, context: Context, call_next) -> Message:
    """ClientApp mod: while this message is handled, the client's data comes from its saved slice."""
    pid = context.node_config.get("partition-id")
    if not isinstance(pid, int) and not str(pid).isdigit():
        return call_next(msg, context)  # the client reports a missing or bad partition id itself
    cfg = config_of(context)
    # A node that does not fit the run says so (NodeMismatchError, which the server counts as a refusal)
    # before its partition id is used to slice another run's data (an IndexError).
    partition_id_of(context, cfg.num_clients)
    with use_client_slice(cfg, int(pid), state_dir_of(context.node_config, cfg.client_state_dir)):
        return call_next(msg, context)


client_app = ClientApp(client_fn=client_fn, mods=[message_timing, pooled_partition, own_samples_only])
