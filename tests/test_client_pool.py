"""client_layout=pool: a fixed pool of nodes serves every client, each message naming the partition it is for.

What must hold: the same run as one node per client (same samples, per-client accuracies and losses), no
message to any client before round 1, a reply for another partition is a failure of the client, a pooled
node refuses a message naming no partition (and a node of its own one that names a partition), and a
deployment refuses the layout.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict
from flwr.common import (EvaluateIns, EvaluateRes, FitIns, FitRes, GetPropertiesIns, GetPropertiesRes,
                         Parameters, Status, Code)
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from fedpers.core.errors import ConfigError, FedpersError, NodeMismatchError
from fedpers.core.federation import get_federation
from fedpers.core.results import read_metrics, read_summary
from fedpers.core.schema import POOL_ABOVE_CLIENTS, pool_size, pooled, simulated_layout
from fedpers.core.wire import PARTITION_ID, for_partition, partition_of_message
from fedpers.registry.config import build_config
from strategies.rounds import ClientRoster, PartitionProxy, pool_client_id
from tests.conftest import tiny_overrides

EMPTY = Parameters(tensors=[], tensor_type="numpy.ndarray")


def test_auto_pools_a_simulation_above_a_thousand_clients_and_keeps_its_state_on_disk():
    def resolved(**keys):
        return simulated_layout(build_config(tiny_overrides(**keys)))

    assert resolved(num_clients=3).client_layout == "auto"  # one node per client, as `flwr run` runs it
    assert resolved(num_clients=3).client_state_spill is False
    assert resolved(num_clients=POOL_ABOVE_CLIENTS, dataset="digits", min_samples_per_client=1,
                    partition="iid").client_layout == "auto"
    above = resolved(num_clients=POOL_ABOVE_CLIENTS + 1, partition="iid", min_samples_per_client=1)
    assert above.client_layout == "pool" and above.client_state_spill is True
    assert resolved(num_clients=3, client_layout="pool").client_state_spill is True
    assert resolved(num_clients=1500, client_layout="nodes", partition="iid").client_layout == "nodes"
    # a deployment's server never resolves auto: there it is one client per SuperNode
    assert not pooled(build_config(tiny_overrides(num_clients=1500, partition="iid")))


def test_the_pool_has_as_many_nodes_as_clients_per_round_unless_told():
    assert pool_size(build_config(tiny_overrides(num_clients=1000, fraction_fit=0.1, partition="iid"))) == 100
    assert pool_size(build_config(tiny_overrides(num_clients=1000, fraction_fit=0.1, pool_nodes=8,
                                                 partition="iid"))) == 8
    assert pool_size(build_config(tiny_overrides(num_clients=3, pool_nodes=50))) == 3  # never more than clients
    assert pool_size(build_config(tiny_overrides(num_clients=3, fraction_fit=0.01))) == 1


def test_a_message_names_its_partition_and_nothing_else_changes():
    config = {"server_round": 4, "lr": 0.1}
    named = for_partition(config, 17)
    assert named == {"server_round": 4, "lr": 0.1, PARTITION_ID: 17} and config == {"server_round": 4, "lr": 0.1}
    assert partition_of_message(named) == 17 and partition_of_message(config) is None


class RecordingNode(ClientProxy):
    """A pool node that answers as the partition the message names (or as ``answer_as``) and records what
    it was sent."""

    def __init__(self, cid: str, answer_as: int | None = None):
        super().__init__(cid)
        self.answer_as = answer_as
        self.sent: list[tuple[str, dict]] = []

    def _as(self, config):
        return partition_of_message(config) if self.answer_as is None else self.answer_as

    def get_properties(self, ins, timeout, group_id):
        self.sent.append(("properties", dict(ins.config)))
        return GetPropertiesRes(Status(Code.OK, ""), {"partition_id": self._as(ins.config)})

    def get_parameters(self, ins, timeout, group_id):
        raise AssertionError("not asked")

    def fit(self, ins, timeout, group_id):
        self.sent.append(("fit", dict(ins.config)))
        return FitRes(Status(Code.OK, ""), EMPTY, 5, {"partition_id": self._as(ins.config)})

    def evaluate(self, ins, timeout, group_id):
        self.sent.append(("evaluate", dict(ins.config)))
        return EvaluateRes(Status(Code.OK, ""), 0.5, 5, {"partition_id": self._as(ins.config)})

    def reconnect(self, ins, timeout, group_id):
        raise AssertionError("not asked")


def pooled_roster(num_clients=5, nodes=2):
    cfg = build_config(tiny_overrides(num_clients=num_clients, client_layout="pool", pool_nodes=nodes))
    manager = SimpleClientManager()
    pool = [RecordingNode(f"n{i}") for i in range(nodes)]
    for node in pool:
        manager.register(node)
    return ClientRoster(cfg, get_federation(cfg)), manager, pool


def test_a_pooled_roster_asks_no_node_anything_before_round_one_and_spreads_clients_over_the_pool():
    roster, manager, pool = pooled_roster(num_clients=5, nodes=2)
    proxies = roster.proxies(manager, 1)
    assert len(proxies) == 5 and 4 in proxies and 5 not in proxies and -1 not in proxies
    assert all(node.sent == [] for node in pool)  # no message per client (nor per node) at start-up
    sample = roster.fit_sample(1, proxies)
    assert sample == sorted(sample) and len(sample) == 5  # fraction_fit 1.0 of tiny_overrides
    for pid in sample:
        res = proxies[pid].fit(FitIns(EMPTY, {"server_round": 1}), None, 1)
        assert res.metrics["partition_id"] == pid
    # partition p goes to node p mod 2 (nodes in node-id order), named in the message's config
    assert [c[PARTITION_ID] for _, c in pool[0].sent] == [0, 2, 4]
    assert [c[PARTITION_ID] for _, c in pool[1].sent] == [1, 3]
    assert all(c["server_round"] == 1 for node in pool for _, c in node.sent)
    assert {roster.partition_of[pool_client_id(p)] for p in sample} == set(sample)
    assert roster.proxies(manager, 2)[3] is proxies[3]  # made once


def test_a_reply_for_another_partition_is_a_failure_of_the_client():
    node = RecordingNode("n0", answer_as=2)
    proxy = PartitionProxy(node, 3)
    with pytest.raises(FedpersError, match="client 3: the fit reply of pool node n0 is for partition 2"):
        proxy.fit(FitIns(EMPTY, {}), None, 1)
    with pytest.raises(FedpersError, match="client 3: the evaluate reply"):
        proxy.evaluate(EvaluateIns(EMPTY, {}), None, 1)
    with pytest.raises(FedpersError, match="client 3: the properties reply"):
        proxy.get_properties(GetPropertiesIns({}), None, 1)


def _fit_message(config: dict) -> Message:
    content = RecordDict({"fitins.config": ConfigRecord(config)})
    metadata = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=7, reply_to_message_id="", group_id="2",
                        created_at=0.0, ttl=60.0, message_type="train")
    return Message(content, metadata=metadata)


def _node_context(cfg, partition_id=0) -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": partition_id, "num-partitions": cfg.num_clients},
                   state=RecordDict(), run_config=cfg.changed())


def test_a_pooled_node_serves_the_partition_its_message_names_with_a_context_of_its_own():
    from fedpers.apps.client_app import pooled_partition

    cfg = build_config(tiny_overrides(num_clients=5, client_layout="pool"))
    node = _node_context(cfg, partition_id=0)
    node.state["kept"] = ConfigRecord({"x": 1})
    seen = []

    def call_next(msg, context):
        seen.append(context)
        return "reply"

    assert pooled_partition(_fit_message(for_partition({"server_round": 2}, 3)), node, call_next) == "reply"
    (context,) = seen
    assert context.node_config["partition-id"] == 3 and context.node_config["num-partitions"] == 5
    assert len(context.state) == 0  # nothing of the node's (or another client's) state reaches the client
    assert node.node_config["partition-id"] == 0 and "kept" in node.state  # the node's own context untouched
    with pytest.raises(NodeMismatchError, match="names no partition"):
        pooled_partition(_fit_message({"server_round": 2}), node, call_next)
    with pytest.raises(NodeMismatchError, match="partition 5, outside 0..4"):
        pooled_partition(_fit_message(for_partition({}, 5)), node, call_next)


def test_a_node_of_its_own_refuses_a_message_that_names_a_partition():
    from fedpers.apps.client_app import pooled_partition

    cfg = build_config(tiny_overrides(num_clients=5, client_layout="nodes"))
    node = _node_context(cfg, partition_id=1)
    assert pooled_partition(_fit_message({"server_round": 1}), node, lambda m, c: c) is node
    with pytest.raises(NodeMismatchError, match="names partition 3, but this run gives each client a node"):
        pooled_partition(_fit_message(for_partition({}, 3)), node, lambda m, c: c)


def test_a_deployment_refuses_the_pooled_layout(tmp_path):
    from fedpers.apps.deploy import deploy_config

    cfg = build_config(tiny_overrides(client_layout="pool"))
    with pytest.raises(ConfigError, match="config key 'client_layout': pool is a simulation layout"):
        deploy_config(cfg, tmp_path, resume=False)


def _same_run(a, b):
    """Two runs' records agree on everything but timings and where client state lived."""
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["round"] for r in rb] == [r["round"] for r in ra]
    for x, y in zip(ra, rb):
        for key in ("fit_clients", "per_client_acc", "train_loss", "rejected_updates", "failed_clients",
                    "bytes_up", "bytes_down", "personalized_macro_acc", "global_acc"):
            assert y.get(key) == x.get(key), key
    assert read_summary(b)["final"] == read_summary(a)["final"]


@pytest.mark.parametrize("method", ["fedeagd", "pfedkdh", "ditto", "jdfl_fedavg"])
def test_a_pool_of_two_nodes_gives_one_node_per_clients_run(method, tmp_path):
    """In-process, six clients (JDFL: four domains' clients), half trained per round, two pool nodes: the same samples, per-client
    accuracies and losses as one node per client, for methods whose clients keep state between rounds
    (EMA teachers and residuals, private heads, personal models, JDFL's joint head) and a pooled client's
    state lives on disk in the run's own directory, gone afterwards."""
    from fedpers.apps.inprocess import run_in_process

    if method == "jdfl_fedavg":  # pseudo-domain discovery before round 1 asks every client, pooled too
        extra = dict(method="fedavg", jdfl="graded", dataset="digits_domains", partition="domain", aux_size=0,
                     num_clients=4, model_kind="gn_cnn", feature_dim=32)
    else:
        extra = dict(method=method, num_clients=6)
    base = tiny_overrides(**{**extra, "variant": "ea", "fraction_fit": 0.5, "rounds": 3,
                             "fedeagd_fusion_start": 1, "fedeagd_fusion_ramp": 1})
    run_in_process(build_config({**base, "out_dir": str(tmp_path / "nodes"), "client_layout": "nodes"}))
    run_in_process(build_config({**base, "out_dir": str(tmp_path / "pool"), "client_layout": "pool",
                                 "pool_nodes": 2}))
    _same_run(tmp_path / "nodes", tmp_path / "pool")
    assert read_summary(tmp_path / "pool")["config"]["client_layout"] == "pool"
    assert not list((tmp_path / "pool").glob("client_state*"))


@pytest.mark.simulation
def test_the_ray_simulation_with_a_pool_gives_one_node_per_clients_run(tmp_path):
    """Flower's Ray simulation with two SuperNodes serving five clients (a stateful method) gives the
    in-process engine's run with one node per client: same samples and per-client accuracies, losses to
    float precision (a Ray actor's torch runs on one thread)."""
    from fedpers.apps.inprocess import run_in_process
    from fedpers.apps.simulation import run_simulation

    base = tiny_overrides(method="fedeagd", num_clients=5, fraction_fit=0.6, rounds=2,
                          fedeagd_fusion_start=1, fedeagd_fusion_ramp=1)
    run_in_process(build_config({**base, "out_dir": str(tmp_path / "nodes"), "client_layout": "nodes"}))
    run_simulation(build_config({**base, "out_dir": str(tmp_path / "pool"), "client_layout": "pool",
                                 "pool_nodes": 2}))
    nodes, pool = read_metrics(tmp_path / "nodes"), read_metrics(tmp_path / "pool")
    assert [r["fit_clients"] for r in pool] == [r["fit_clients"] for r in nodes]
    assert [r["per_client_acc"] for r in pool] == [r["per_client_acc"] for r in nodes]
    assert [r["train_loss"] for r in pool] == pytest.approx([r["train_loss"] for r in nodes], rel=1e-6)
    assert all(r["failed_clients"] == 0 for r in pool)
    assert not list((tmp_path / "pool").glob("client_state*"))
