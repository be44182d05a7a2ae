"""Nodes that do not fit the run (strategies/refusals.py): what a refusal looks like to the
server, how a round records it, and when it stops the run. The deployed case is in tests/test_deploy.py."""

from __future__ import annotations

import pytest

from clients.base import partition_id_of
from fedpers.core.errors import FedpersError, NodeMismatchError
from strategies.refusals import note_refusal, refusal_reason, require_fitting_nodes, required_fitting_nodes


def _flower_error(exc: BaseException) -> ValueError:
    """The exception Flower's GridClientProxy raises for a ClientApp that raised ``exc`` (flwr 1.42:
    run_clientapp's reason format inside grid_client_proxy's message)."""
    reason = str(type(exc)) + ":<'" + str(exc) + "'>"
    return ValueError(f"Message contains an Error (reason: {reason}). It originated during client-side "
                      "execution of a message.")


class _Ctx:
    def __init__(self, node_config):
        self.node_config = node_config


def test_a_node_config_that_does_not_fit_is_a_node_mismatch():
    with pytest.raises(NodeMismatchError, match="^node config num-partitions=3 but the run has num_clients=4$"):
        partition_id_of(_Ctx({"partition-id": 0, "num-partitions": 3}), 4)
    with pytest.raises(NodeMismatchError, match=r"^partition-id 4 outside 0\.\.3$"):
        partition_id_of(_Ctx({"partition-id": 4, "num-partitions": 4}), 4)
    assert partition_id_of(_Ctx({"partition-id": 3, "num-partitions": 4}), 4) == 3


def test_refusal_reason_reads_flowers_error_reply():
    exc = _flower_error(NodeMismatchError("node config num-partitions=3 but the run has num_clients=4"))
    assert refusal_reason(exc) == "node config num-partitions=3 but the run has num_clients=4"
    assert refusal_reason(_flower_error(ValueError("client 2: server broadcast: bad"))) is None
    assert refusal_reason(TimeoutError("no reply")) is None


def test_a_refusal_counts_once_per_node_and_round():
    round_state = {"failures": 1}
    exc = _flower_error(NodeMismatchError("node config num-partitions=3 but the run has num_clients=4"))
    assert note_refusal(round_state, 1, "77", exc) is True
    assert note_refusal(round_state, 1, "77", exc) is True  # asked again by configure_evaluate
    assert note_refusal(round_state, 1, "78", exc) is True
    assert note_refusal(round_state, 1, "79", RuntimeError("lost")) is False
    assert round_state == {"failures": 3, "extras": {"refused_nodes": [
        {"node": "77", "reason": "node config num-partitions=3 but the run has num_clients=4"},
        {"node": "78", "reason": "node config num-partitions=3 but the run has num_clients=4"}]}}


def test_fewer_fitting_nodes_than_needed_stop_the_run_in_one_line():
    assert required_fitting_nodes(4, 0.5, 1) == 2
    assert required_fitting_nodes(4, 0.1, 1) == 1
    assert required_fitting_nodes(4, 0.5, 3) == 3
    refused = {"extras": {"refused_nodes": [{"node": str(n), "reason": "node config num-partitions=3 but the run "
                                             "has num_clients=4"} for n in (1, 2, 3)]}}
    with pytest.raises(FedpersError) as info:
        require_fitting_nodes(refused, 1, fitting=1, num_clients=4, fraction_fit=0.5, min_fit_updates=1)
    assert str(info.value) == (
        "round 1: 1 of num_clients=4 clients have a SuperNode that fits the run, fewer than the 2 it needs (max of "
        "min_fit_updates=1 and the 2 sampled per round); 3 node(s) refused: node config num-partitions=3 but the "
        "run has num_clients=4 (start each SuperNode with --node-config \"partition-id=N num-partitions=4\")")
    assert "\n" not in str(info.value)
    require_fitting_nodes(refused, 1, fitting=2, num_clients=4, fraction_fit=0.5, min_fit_updates=1)  # enough
    require_fitting_nodes({"failures": 0}, 1, fitting=0, num_clients=4, fraction_fit=0.5, min_fit_updates=1)  # none refused
