"""Run one experiment in this process, without Ray: the Strategy's round loop with in-process clients.

The same ``server_fn`` and method clients as the simulation engine, driven through Flower's public
``Strategy``/``ClientProxy`` API; clients are handled one after another in partition order, so a run is
deterministic and cheap enough for tests (the regression runs of ``tests/test_regression.py``). Each client
keeps one ``Context`` for the whole run, as a SuperNode does, so its persistent state survives rounds.
"""

from __future__ import annotations

import math
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

    The round loop of Flower's ``Server.fit`` (fit, central evaluate, federated evaluate), with the
    results of a round in partition order: ``Server`` hands them over in completion order, which makes
    float sums (and FedAS's weight list) differ between two runs of the same arithmetic. ``resume: true``
    continues after the checkpoint's round (``fedpers.apps.flower_internals.ResumableServer``'s first round);
    ``stop_after`` ends the loop after that round's evaluate phase, as a server killed there would."""
    from fedpers.apps.server_app import server_fn
    from fedpers.registry.methods import client_for_message

    run_config = cfg.to_dict()
    components = server_fn(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    strategy = components.strategy if components.server is None else components.server.strategy
    first = 1 if components.server is None else components.server.start_round
    manager = SimpleClientManager()
    for pid in range(cfg.num_clients):
        context = Context(run_id=0, node_id=pid + 1, state=RecordDict(), run_config=run_config,
                          node_config={"partition-id": pid, "num-partitions": cfg.num_clients})
        manager.register(InProcessClientProxy(str(pid + 1), lambda c=context: client_for_message(cfg, c)))
    parameters = strategy.initialize_parameters(manager)
    strategy.evaluate(0, parameters)
    for server_round in range(first, min(components.config.num_rounds, stop_after or math.inf) + 1):
        fit = _in_order(strategy.configure_fit(server_round, parameters, manager))
        results = [(proxy, proxy.fit(ins, None, server_round)) for proxy, ins in fit]
        aggregated, _ = strategy.aggregate_fit(server_round, results, [])
        if aggregated is not None:
            parameters = aggregated
        strategy.evaluate(server_round, parameters)
        evaluate = _in_order(strategy.configure_evaluate(server_round, parameters, manager))
        if evaluate:
            results = [(proxy, proxy.evaluate(ins, None, server_round)) for proxy, ins in evaluate]
            strategy.aggregate_evaluate(server_round, results, [])


def _in_order(instructions: list) -> list:
    """Instructions sorted by node id (node ids follow partition ids here)."""
    return sorted(instructions, key=lambda pair: int(pair[0].cid))
