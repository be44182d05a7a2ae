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

from fedpers.registry.config import Config


class InProcessClientProxy(ClientProxy):
    """A Flower ClientProxy that builds the node's client for every message, as Flower's ClientApp does."""

    def __init__(self, cid: str, make_client: Callable):
        super().__init__(cid)
        self.make_client = make_client

    def get_properties(self, ins: GetPropertiesIns, timeout, group_id) -> GetPropertiesRes:
        """The client's ``get_properties`` (its partition id)."""
        return self.make_client().get_properties(ins)

    def get_parameters(self, ins: GetParametersIns, timeout, group_id) -> GetParametersRes:
        """The client's ``get_parameters``."""
        return self.make_client().get_parameters(ins)

    def fit(self, ins: FitIns, timeout, group_id) -> FitRes:
        """One local training round of the client."""
        return self.make_client().fit(ins)

    def evaluate(self, ins: EvaluateIns, timeout, group_id) -> EvaluateRes:
        """The client's personalized evaluation."""
        return self.make_client().evaluate(ins)

    def reconnect(self, ins: ReconnectIns, timeout, group_id) -> DisconnectRes:
        """Nothing to disconnect in one process."""
        return DisconnectRes(reason="in-process")


def run_in_process(cfg: Config, *, stop_after: int | None = None) -> None:
    """Run ``cfg`` in this process (``num_clients`` in-process clients); results land in ``cfg.out_dir``.

    ``resume: true`` continues after the checkpoint's round, as the ServerApp does; ``stop_after`` ends the
    loop after that round's evaluate phase, as a server killed there would. With ``client_state_spill`` and
    no ``client_state_dir``, client state lives in a directory made for this run, as in the Ray engine
    (:func:`fedpers.core.state_store.run_state_dir`)."""
    from fedpers.core.state_store import run_state_dir

    with run_state_dir(cfg) as run_cfg:
        _run_rounds(run_cfg, stop_after)


def _run_rounds(cfg: Config, stop_after: int | None) -> None:
    from fedpers.apps.server_app import round_loop, server_fn
    from fedpers.registry.methods import client_for_message

    run_config = cfg.to_dict()
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    manager = SimpleClientManager()
    for pid in range(cfg.num_clients):
        context = Context(run_id=0, node_id=pid + 1, state=RecordDict(), run_config=run_config,
                          node_config={"partition-id": pid, "num-partitions": cfg.num_clients})
        manager.register(InProcessClientProxy(str(pid + 1), lambda c=context: client_for_message(cfg, c)))
    server = round_loop(components.server.strategy, start_round=components.server.start_round,
                        client_manager=manager, stop_after=stop_after)
    server.set_max_workers(1)  # one client at a time, in the order the strategy configured them
    server.fit(components.config.num_rounds, timeout=None)
