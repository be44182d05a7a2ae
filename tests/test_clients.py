"""Client invariants without a Flower run: what is uploaded, and what persists across rounds."""

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from clients.fedper import FedPerClient
from clients.pfedkdh import PFedKDHClient
from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.core.models import build_model, get_arrays
from tests.conftest import make_context, pfedkdh_broadcast, tiny_overrides


@pytest.fixture
def cfg():
    """A pFedKDH-EA config: the client whose invariants most methods share (a head kept, a part uploaded)."""
    return build_config(tiny_overrides(method="pfedkdh", variant="ea"))


def test_fedper_uploads_backbone_only_and_keeps_head():
    cfg = build_config(tiny_overrides(method="fedper"))
    fed = get_federation(cfg)
    model = build_model(fed.input_shape, 10, feature_dim=cfg.feature_dim, seed=cfg.seed)
    backbone = get_arrays(model, "backbone")
    context = make_context(0, cfg.num_clients)
    up, _, _ = FedPerClient(cfg, context).fit(backbone, {"server_round": 1})
    assert [a.shape for a in up] == [a.shape for a in backbone]
    assert "fedpers.personal" in context.state


def test_client_rejects_malformed_broadcast(cfg):
    _, params = pfedkdh_broadcast(cfg)
    client = PFedKDHClient(cfg, make_context(0, cfg.num_clients))
    from fedpers.core.errors import ClientUpdateError

    with pytest.raises(ClientUpdateError, match="client 0: server broadcast"):
        client.fit(params[:-1], {"server_round": 1})
    bad = [a.copy() for a in params]
    bad[0][...] = np.nan
    with pytest.raises(ClientUpdateError, match="finite"):
        client.fit(bad, {"server_round": 1})


def test_missing_partition_id_is_a_clear_error(cfg):
    from fedpers.core.errors import ClientUpdateError

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ClientUpdateError, match="partition-id"):
        PFedKDHClient(cfg, ctx)


def test_a_properties_query_answers_the_partition_without_building_the_client(cfg):
    """The server asks every node its partition id once (10,000 messages at 10,000 clients): the answer
    comes from the node config, with no model or data built; a node that does not fit still says so."""
    from flwr.common import GetPropertiesIns

    from clients.base import message_client
    from fedpers.core.errors import NodeMismatchError

    class Unbuildable(PFedKDHClient):
        def __init__(self, *args, **kwargs):
            raise AssertionError("the client was built for a properties query")

    res = message_client(Unbuildable, cfg, make_context(2, cfg.num_clients)).get_properties(GetPropertiesIns({}))
    assert res.properties == {"partition_id": 2}
    with pytest.raises(NodeMismatchError, match="num-partitions=4"):
        message_client(Unbuildable, cfg, make_context(2, 4)).get_properties(GetPropertiesIns({}))


def test_fedavg_per_client_accuracy_from_the_global_evaluation_equals_each_clients_own():
    """FedAvg's personalized model is the global one: the server reads every client's accuracy off its one
    evaluation of the union test set, and it equals what each client's evaluate reports."""
    from clients.fedavg import FedAvgClient
    from flwr.common import ndarrays_to_parameters
    from strategies.fedavg import FedAvgStrategy

    cfg = build_config(tiny_overrides(method="fedavg", num_clients=4, rounds=1))
    strategy = FedAvgStrategy(cfg, get_federation(cfg))
    strategy.book.start()
    params = strategy.download_arrays()
    strategy.evaluate(1, ndarrays_to_parameters(params))
    from_server = strategy.book.current["per_client_from_global"]
    assert sorted(from_server) == list(range(4))
    for pid in range(4):
        _, n, metrics = FedAvgClient(cfg, make_context(pid, 4)).evaluate(params, {"server_round": 1})
        assert n > 0 and from_server[pid] == pytest.approx(metrics["acc"], abs=1e-6)  # float32 mean on the client


def test_state_store_keeps_the_version_before_a_lost_round(tmp_path):
    """A resumed run starts the lost round again: the store gives the newest version from a round before
    it, and saving that round again replaces the lost version without losing the earlier one."""
    from fedpers.core.state_store import ClientStateStore

    store = ClientStateStore(tmp_path, 0, "fp")
    store.save("head", [np.full(2, 1.0)], server_round=1)
    store.save("head", [np.full(2, 2.0)], server_round=2)
    assert store.load("head")[0][0] == 2.0 and store.saved_round("head") == 2
    assert store.load("head", max_round=1)[0][0] == 1.0
    assert store.load("head", max_round=0) is None
    store.save("head", [np.full(2, 2.5)], server_round=2)  # round 2 run again after a resume
    assert store.load("head")[0][0] == 2.5 and store.load("head", max_round=1)[0][0] == 1.0
    assert store.names() == ["head"]


@pytest.mark.parametrize("memory_survives", [False, True])
def test_client_rerunning_a_lost_round_starts_from_the_state_before_it(tmp_path, memory_survives):
    """Round 2 was trained and saved, then the server stopped before its checkpoint of round 2: the
    resumed run trains round 2 again, from the head saved in round 1, whether the client's memory was
    lost too (simulation) or survived (a SuperNode outliving its SuperLink)."""
    cfg = build_config(tiny_overrides(method="pfedkdh", client_state_dir=str(tmp_path)))
    _, params = pfedkdh_broadcast(cfg)
    context = make_context(1, cfg.num_clients)
    PFedKDHClient(cfg, context).fit(params, {"server_round": 1})
    after_round1 = context.state["fedpers.personal"].to_numpy_ndarrays()
    PFedKDHClient(cfg, context).fit(params, {"server_round": 2})
    after_round2 = context.state["fedpers.personal"].to_numpy_ndarrays()
    assert not all(np.array_equal(a, b) for a, b in zip(after_round1, after_round2))
    resumed_context = context if memory_survives else make_context(1, cfg.num_clients)
    client = PFedKDHClient(cfg, resumed_context)
    client.begin_message(2, training=False)  # evaluating round 2: the round-2 state is the valid one
    assert all(np.array_equal(a, b) for a, b in zip(client.personal_arrays(), after_round2))
    client = PFedKDHClient(cfg, resumed_context)
    client.begin_message(2, training=True)  # training round 2 again: from the round-1 state
    assert all(np.array_equal(a, b) for a, b in zip(client.personal_arrays(), after_round1))


def test_lost_round_state_without_a_state_directory_is_a_clear_error():
    from fedpers.core.errors import ClientUpdateError

    cfg = build_config(tiny_overrides(method="pfedkdh"))
    _, params = pfedkdh_broadcast(cfg)
    context = make_context(0, cfg.num_clients)
    PFedKDHClient(cfg, context).fit(params, {"server_round": 3})
    client = PFedKDHClient(cfg, context)
    client.begin_message(3, training=True)
    with pytest.raises(ClientUpdateError, match="saved in round 3.*no earlier version"):
        client.personal_arrays()


def test_minibatches_drop_only_the_short_last_batch():
    """``drop_last``: the same permutation, cut after the last full batch; a set smaller than one batch is
    kept whole (ours)."""
    import torch

    from fedpers.core.training import batches_per_epoch, minibatches

    def batches(n, drop):
        return [b.tolist() for b in minibatches(n, 4, torch.Generator().manual_seed(7), torch.device("cpu"),
                                                 drop_last=drop)]

    kept, dropped = batches(10, False), batches(10, True)
    assert [len(b) for b in kept] == [4, 4, 2] and dropped == kept[:2]
    assert sorted(sum(kept, [])) == list(range(10))
    assert batches(8, True) == batches(8, False) and [len(b) for b in batches(8, True)] == [4, 4]
    assert batches(3, True) == batches(3, False) and [len(b) for b in batches(3, True)] == [3]
    assert [batches_per_epoch(n, 4, drop_last=d) for n, d in [(10, False), (10, True), (8, True), (3, True)]] \
        == [3, 2, 2, 1]


def test_with_drop_last_the_short_batch_samples_do_not_train():
    """What the dropped tail holds changes nothing with ``drop_last`` and changes the model without it."""
    import torch
    import torch.nn.functional as F

    from fedpers.core.training import sgd, train_epochs

    x, y = torch.randn(22, 5, generator=torch.Generator().manual_seed(0)), torch.arange(22) % 3
    tail = torch.randperm(22, generator=torch.Generator().manual_seed(1))[20:]  # the epoch's last 2 (22 = 2*10+2)
    y_other = y.clone()
    y_other[tail] = (y[tail] + 1) % 3

    def trained(labels, drop):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 3)
        train_epochs(model, x, labels, epochs=1, batch_size=10, optimizer=sgd(model.parameters(), 0.5),
                     batch_loss=lambda xb, yb: F.cross_entropy(model(xb), yb),
                     generator=torch.Generator().manual_seed(1), drop_last=drop)
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(trained(y, True), trained(y_other, True)))
    assert not all(torch.equal(a, b) for a, b in zip(trained(y, False), trained(y_other, False)))


def test_drop_last_batch_reaches_the_clients_training():
    """The config key changes a client's local training when its train split is not a multiple of the
    batch, and nothing when it is."""
    def personal(drop, batch_size):
        cfg = build_config(tiny_overrides(method="fedper", drop_last_batch=drop, batch_size=batch_size))
        fed = get_federation(cfg)
        model = build_model(fed.input_shape, 10, feature_dim=cfg.feature_dim, seed=cfg.seed)
        up, n, _ = FedPerClient(cfg, make_context(0, cfg.num_clients)).fit(get_arrays(model, "backbone"),
                                                                         {"server_round": 1})
        return up, n

    (kept, n), (dropped, _) = personal(False, 32), personal(True, 32)
    assert n % 32 != 0 and not all(np.array_equal(a, b) for a, b in zip(kept, dropped))
    (kept, _), (dropped, _) = personal(False, n), personal(True, n)  # one full batch: nothing to drop
    assert all(np.array_equal(a, b) for a, b in zip(kept, dropped))
