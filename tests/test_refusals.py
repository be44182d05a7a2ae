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


# --- a partition held by another node, a partition that never trains ----------------------------------------
class _Proxy:
    """A connected node as the roster sees it: its id and the partition id it reports."""

    def __init__(self, cid: str, partition_id: int):
        self.cid, self.partition_id = cid, partition_id

    def get_properties(self, ins, timeout, group_id):
        from flwr.common import Code, GetPropertiesRes, Status

        return GetPropertiesRes(Status(Code.OK, ""), {"partition_id": self.partition_id})


class _Manager:
    def __init__(self, proxies):
        self.nodes = {p.cid: p for p in proxies}

    def wait_for(self, num_clients, timeout=86400):
        return True

    def all(self):
        return dict(self.nodes)


def _roster(num_clients: int = 3):
    from fedpers.core.federation import get_federation
    from fedpers.registry.config import build_config
    from strategies.rounds import ClientRoster
    from tests.conftest import tiny_overrides

    cfg = build_config(tiny_overrides(num_clients=num_clients))
    return ClientRoster(cfg, get_federation(cfg))


def test_a_node_claiming_a_held_partition_is_refused_and_the_holder_keeps_it():
    roster = _roster()
    manager = _Manager([_Proxy("11", 0), _Proxy("12", 1), _Proxy("13", 2), _Proxy("14", 1)])
    round_state: dict = {}
    proxies = roster.proxies(manager, 1, round_state)
    assert {p: proxy.cid for p, proxy in proxies.items()} == {0: "11", 1: "12", 2: "13"}
    assert round_state == {"failures": 1, "extras": {"refused_nodes": [
        {"node": "14", "reason": "partition-id 1 is held by node 12 (each SuperNode needs its own partition-id)"}]}}
    # the next round asks the refused node again: refused while the holder is connected ...
    round_state = {}
    roster.proxies(manager, 2, round_state)
    assert round_state["extras"]["refused_nodes"][0]["node"] == "14"
    # ... and given the partition once the holder is gone
    del manager.nodes["12"]
    round_state = {}
    assert {p: proxy.cid for p, proxy in roster.proxies(manager, 3, round_state).items()} == {0: "11", 1: "14", 2: "13"}
    assert round_state == {}


def test_a_sampled_partition_that_never_answered_a_fit_ends_the_run_in_one_line():
    from strategies.refusals import require_trained_partitions

    require_trained_partitions({0, 1, 2}, {0, 1, 2}, 5)
    require_trained_partitions({0, 2}, {0, 2}, 5)  # partition 1 never sampled: never asked, not a failure
    with pytest.raises(FedpersError) as info:
        require_trained_partitions({0, 1, 2}, {0}, 5)
    assert str(info.value) == (
        "partition(s) 1, 2 never trained in 5 rounds: each fit sent to them failed or got no reply (failed_clients "
        "in metrics.jsonl; their SuperNode's and ClientApp's logs say why, e.g. a stopped ClientApp runner or a "
        "full state directory); no summary.json is written")


def test_a_partition_whose_state_dir_is_full_fails_the_run_instead_of_completing_it(tmp_path, monkeypatch):
    """Partition 2 cannot save its state (ENOSPC) in any round: the rounds go on with the other two
    (min_fit_updates=1), every round records its failure, and the run ends failed without a summary."""
    import errno
    import json

    from fedpers.apps.inprocess import run_in_process
    from fedpers.core.state_store import ClientStateStore
    from fedpers.registry.config import build_config
    from tests.conftest import tiny_overrides

    save = ClientStateStore.save

    def full_for_partition_2(self, name, arrays, **kwargs):
        if self.partition_id == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(self, name, arrays, **kwargs)

    monkeypatch.setattr(ClientStateStore, "save", full_for_partition_2)
    cfg = build_config(tiny_overrides(rounds=2, out_dir=str(tmp_path / "run"), client_state_dir=str(tmp_path / "state"),
                                      checkpoint_dir=str(tmp_path / "ckpt")))
    with pytest.raises(FedpersError, match=r"^partition\(s\) 2 never trained in 2 rounds: "):
        run_in_process(cfg)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and all(r["failed_clients"] >= 1 for r in rounds)
    assert not (tmp_path / "run" / "summary.json").exists()
    # a resume of the finished rounds keeps the verdict (the checkpoint holds who trained)
    with pytest.raises(FedpersError, match=r"^partition\(s\) 2 never trained"):
        run_in_process(cfg.replace(resume=True))
    assert not (tmp_path / "run" / "summary.json").exists()
