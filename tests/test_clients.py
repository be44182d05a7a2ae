"""Client invariants without a Flower run: what is uploaded, and what persists across rounds."""

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from clients.fedper import FedPerClient
from clients.pfedkdh import PFedKDHClient
from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.core.models import build_model, get_arrays, parameter_names
from strategies.pfedkdh import PFedKDHStrategy
from tests.conftest import make_context, tiny_overrides



@pytest.fixture
def cfg():
    return build_config(tiny_overrides(method="pfedkdh", variant="ea"))


def server_broadcast(cfg):
    fed = get_federation(cfg)
    strategy = PFedKDHStrategy(cfg, fed)
    return strategy, strategy.download_arrays()


def test_pfedkdh_upload_contains_no_head_parameter(cfg):
    strategy, params = server_broadcast(cfg)
    client = PFedKDHClient(cfg, make_context(0, cfg.num_clients))
    uploaded, n, metrics = client.fit(params, {"server_round": 1})
    model = build_model(strategy.federation.input_shape, 10, feature_dim=cfg.feature_dim, seed=cfg.seed)
    backbone_shapes = [a.shape for a in get_arrays(model, "backbone")]
    head_shapes = [a.shape for a in get_arrays(model, "head")]
    assert [a.shape for a in uploaded] == backbone_shapes
    assert len(uploaded) == len(parameter_names(model, "backbone"))
    # no uploaded array equals the trained private head
    trained_head = get_arrays(client.model, "head")
    for arr in uploaded:
        assert all(arr.shape != h or not np.array_equal(arr, th) for h, th in zip(head_shapes, trained_head))
    assert n == len(client.data.train) and metrics["partition_id"] == 0


def test_persistent_head_is_the_one_trained_in_last_participation(cfg):
    strategy, params = server_broadcast(cfg)
    context = make_context(1, cfg.num_clients)
    # round 1: the client trains; its head is stored
    PFedKDHClient(cfg, context).fit(params, {"server_round": 1})
    stored_r1 = context.state["fedpers.personal"].to_numpy_ndarrays()
    # rounds 2-3: a new client object each message (as Flower does); the server's teacher head changes
    teacher_changed = [a + 1.0 for a in params]
    c = PFedKDHClient(cfg, context)
    c.evaluate(teacher_changed, {"server_round": 2})
    for a, b in zip(get_arrays(c.model, "head"), stored_r1):
        np.testing.assert_array_equal(a, b)  # the evaluated head is the stored one, not the teacher's
    # the broadcast teacher head differs from the stored head (so the test can fail)
    assert not np.array_equal(get_arrays(c.model, "head")[0], teacher_changed[-2])
    c2 = PFedKDHClient(cfg, context)
    c2.fit(params, {"server_round": 3})
    stored_r3 = context.state["fedpers.personal"].to_numpy_ndarrays()
    assert not np.array_equal(stored_r1[0], stored_r3[0])  # trained again -> new head persisted
    c3 = PFedKDHClient(cfg, context)
    c3.evaluate(params, {"server_round": 4})
    for a, b in zip(get_arrays(c3.model, "head"), stored_r3):
        np.testing.assert_array_equal(a, b)


def test_ea_does_not_change_the_persistent_head(cfg):
    _, params = server_broadcast(cfg)
    context = make_context(2, cfg.num_clients)
    PFedKDHClient(cfg, context).fit(params, {"server_round": 1})
    before = context.state["fedpers.personal"].to_numpy_ndarrays()
    _, _, metrics = PFedKDHClient(cfg, context).evaluate(params, {"server_round": 1})
    after = context.state["fedpers.personal"].to_numpy_ndarrays()
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert 0.0 <= metrics["acc"] <= 1.0 and 0.0 <= metrics["acc_fair"] <= 1.0


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
    _, params = server_broadcast(cfg)
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


def test_recal_every_round_false_keeps_only_the_initial_calibration():
    """Fig. 3 '+KD' ablation: the teacher head is calibrated before round 1 (Alg. 1 line 5) and then left
    as it is; with recurrent recalibration (the default) every aggregation recalibrates it (line 16)."""
    fed_cfg = tiny_overrides(method="pfedkdh")
    initial_head = get_arrays(build_model(get_federation(build_config(fed_cfg)).input_shape, 10,
                                          feature_dim=64, seed=0), "head")
    heads = {}
    for every_round in (True, False):
        cfg = build_config({**fed_cfg, "recal_every_round": every_round})
        strategy, _ = server_broadcast(cfg)
        calibrated = get_arrays(strategy.model, "head")
        assert not all(np.array_equal(a, b) for a, b in zip(calibrated, initial_head))  # line 5 ran
        backbone = [a + 0.01 for a in get_arrays(strategy.model, "backbone")]
        strategy.apply_aggregate(1, backbone)
        heads[every_round] = (calibrated, get_arrays(strategy.model, "head"))
    before, after = heads[False]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    before, after = heads[True]
    assert not all(np.array_equal(a, b) for a, b in zip(before, after))


def test_ea_head_from_visited_samples_equals_head_from_all_features():
    """adapt_head_copy passes only the samples its steps visit through the backbone; the adapted head is
    the one train_head_on_features gives with every train sample's features and the same generator."""
    import copy

    import torch

    from fedpers.core.training import adapt_head_copy, backbone_features, train_head_on_features

    model = build_model((1, 8, 8), 10, feature_dim=64, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(150, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (150,), generator=gen)
    sparse = adapt_head_copy(model, x, y, steps=7, lr=0.1, batch_size=32, generator=torch.Generator().manual_seed(3))
    dense = copy.deepcopy(model.head)
    train_head_on_features(dense, backbone_features(model, x), y, lr=0.1, batch_size=32,
                           generator=torch.Generator().manual_seed(3), steps=7)
    for a, b in zip(sparse.parameters(), dense.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(sparse.weight, model.head.weight)


def test_ea_heads_at_several_lengths_from_one_run_are_the_heads_of_runs_of_those_lengths():
    """adapt_head_copies (ea_also): the copy after k steps of a longer run is the k-step run's head."""
    import torch

    from fedpers.core.training import adapt_head_copies, adapt_head_copy

    model = build_model((1, 8, 8), 10, feature_dim=64, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(150, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (150,), generator=gen)
    heads = adapt_head_copies(model, x, y, steps=[0, 3, 12], lr=0.1, batch_size=32,
                              generator=torch.Generator().manual_seed(3))
    assert torch.equal(heads[0].weight, model.head.weight)
    for k in (3, 12):
        alone = adapt_head_copy(model, x, y, steps=k, lr=0.1, batch_size=32, generator=torch.Generator().manual_seed(3))
        for a, b in zip(heads[k].parameters(), alone.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(heads[3].weight, heads[12].weight)


def test_ea_also_reports_what_the_same_ea_steps_or_ea_epochs_gives_as_the_headline():
    from fedpers.algorithms.pfedkdh import parse_adaptation_lengths

    def reply(**keys):
        cfg = build_config(tiny_overrides(method="pfedkdh", variant="ea", **keys))
        fed = get_federation(cfg)
        model = build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim, seed=cfg.seed)
        return PFedKDHClient(cfg, make_context(0, 3)).evaluate(get_arrays(model, "all"), {"server_round": 1})[2]

    both = reply(ea_steps=3, ea_also="7,1ep")
    assert both["acc"] == reply(ea_steps=3)["acc"]
    assert both["acc_ea7"] == reply(ea_steps=7)["acc"]
    assert both["acc_ea1ep"] == reply(ea_epochs=1)["acc"]
    assert parse_adaptation_lengths(" 50, 1ep ,") == [("50", 50, "steps"), ("1ep", 1, "epochs")]
    for bad in ("0", "ep", "1.5", "-3", "2eps"):
        with pytest.raises(Exception, match="ea_also"):
            build_config(tiny_overrides(method="pfedkdh", ea_also=bad))


def test_fedavg_per_client_accuracy_from_the_global_evaluation_equals_each_clients_own():
    """FedAvg's personalized model is the global one: the server reads every client's accuracy off its one
    evaluation of the union test set, and it equals what each client's evaluate reports."""
    from clients.fedavg import FedAvgClient
    from flwr.common import ndarrays_to_parameters
    from strategies.fedavg import FedAvgStrategy

    cfg = build_config(tiny_overrides(method="fedavg", num_clients=4, rounds=1))
    strategy = FedAvgStrategy(cfg, get_federation(cfg))
    strategy.start_round()
    params = strategy.download_arrays()
    strategy.evaluate(1, ndarrays_to_parameters(params))
    from_server = strategy._round["per_client_from_global"]
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
    _, params = server_broadcast(cfg)
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
    _, params = server_broadcast(cfg)
    context = make_context(0, cfg.num_clients)
    PFedKDHClient(cfg, context).fit(params, {"server_round": 3})
    client = PFedKDHClient(cfg, context)
    client.begin_message(3, training=True)
    with pytest.raises(ClientUpdateError, match="saved in round 3.*no earlier version"):
        client.personal_arrays()
