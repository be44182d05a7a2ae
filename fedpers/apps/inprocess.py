"""Run one experiment in this process, without Ray: the one round loop with in-process clients.

The same ``server_fn``, round loop (:func:`fedpers.apps.server_app.round_loop`) and method clients as the
simulation engine; the loop's client manager holds in-process ``ClientProxy`` objects, and one worker runs
the clients one after another, so a run is deterministic and cheap enough for tests (the regression runs of
``tests/test_regression.py``). Each client keeps one ``Context`` for the whole run, as a SuperNode does, so
its persistent state survives rounds.
"""

from __future__ import annotations

from typing import Callable

from flwr.app import Context, RecordDict
from flwr.common import (DisconnectRes, EvaluateIns, EvaluateRes, FitIns, FitRes, GetParametersIns,
                         GetParametersRes, GetPropertiesIns, GetPropertiesRes, ReconnectIns)
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from fedpers.core.errors import NodeMismatchError
from fedpers.core.schema import pool_size, pooled, simulated_layout
from fedpers.core.wire import partition_of_message
from fedpers.registry.config import Config


class InProcessClientProxy(ClientProxy):
    """A Flower ClientProxy that builds the node's client for every message, as Flower's ClientApp does:
    ``make_client(config)`` gets the message's config, where a pooled run names the partition."""

    def __init__(self, cid: str, make_client: Callable[[dict], object]):
        super().__init__(cid)
        self.make_client = make_client

    def get_properties(self, ins: GetPropertiesIns, timeout, group_id) -> GetPropertiesRes:
        """The client's ``get_properties`` (its partition id)."""
        return self.make_client(ins.config).get_properties(ins)

    def get_parameters(self, ins: GetParametersIns, timeout, group_id) -> GetParametersRes:
        """The client's ``get_parameters``."""
        return self.make_client(ins.config).get_parameters(ins)

    def fit(self, ins: FitIns, timeout, group_id) -> FitRes:
        """One local training round of the client."""
        return self.make_client(ins.config).fit(ins)

    def evaluate(self, ins: EvaluateIns, timeout, group_id) -> EvaluateRes:
        """The client's personalized evaluation."""
        return self.make_client(ins.config).evaluate(ins)

    def reconnect(self, ins: ReconnectIns, timeout, group_id) -> DisconnectRes:
        """Nothing to disconnect in one process."""
        return DisconnectRes(reason="in-process")


def run_in_process(cfg: Config, *, stop_after: int | None = None) -> None:
    """Run ``cfg`` in this process (``num_clients`` in-process clients); results land in ``cfg.out_dir``.

    ``resume: true`` continues after the checkpoint's round, as the ServerApp does; ``stop_after`` ends the
    loop after that round's evaluate phase, as a server killed there would. A pooled layout and client state
    on disk as in the Ray engine (:func:`fedpers.core.schema.simulated_layout`,
    :func:`fedpers.core.state_store.run_state_dir`)."""
    from fedpers.core.state_store import run_state_dir

    with run_state_dir(simulated_layout(cfg)) as run_cfg:
        _run_rounds(run_cfg, stop_after)


def _run_rounds(cfg: Config, stop_after: int | None) -> None:
    from fedpers.apps.server_app import round_loop, server_fn
    from fedpers.registry.methods import client_for_message

    run_config = cfg.to_dict()
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    manager = SimpleClientManager()

    def client_context(pid: int, node_id: int) -> Context:
        return Context(run_id=0, node_id=node_id, state=RecordDict(), run_config=run_config,
                       node_config={"partition-id": pid, "num-partitions": cfg.num_clients})

    if pooled(cfg):
        # as a pooled node of the simulation: the client the message names, with a Context of its own and
        # its state on disk; nothing is made for a client before it is sampled
        def pooled_client(config: dict):
            pid = partition_of_message(config)
            if pid is None or not 0 <= pid < cfg.num_clients:
                raise NodeMismatchError(f"a pooled in-process node got a message for partition {pid}")
            return client_for_message(cfg, client_context(pid, node_id=1))

        for node in range(pool_size(cfg)):
            manager.register(InProcessClientProxy(f"pool-{node:06d}", pooled_client))
    else:
        for pid in range(cfg.num_clients):
            context = client_context(pid, node_id=pid + 1)
            manager.register(InProcessClientProxy(str(pid + 1), lambda _config, c=context: client_for_message(cfg, c)))
    server = round_loop(components.server.strategy, start_round=components.server.start_round,
                        client_manager=manager, stop_after=stop_after)
    server.set_max_workers(1)  # one client at a time, in the order the strategy configured them
    server.fit(components.config.num_rounds, timeout=None)
