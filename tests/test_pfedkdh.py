"""pFedKDH (fedpers/algorithms/pfedkdh.py, strategies/pfedkdh.py, clients/pfedkdh.py): Eq. (2) and its
distillation term on known tensors, the teacher head's recalibration (Eq. 5), the EA variant's adapted head
copies, and the client's persistent private head."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.pfedkdh import PFedKDHClient
from fedpers.algorithms.pfedkdh import (adapt_head_copies, adapt_head_copy, distillation_kl, parse_adaptation_lengths,
                                       pfedkdh_objective, recalibrate_head)
from fedpers.core.federation import get_federation
from fedpers.core.models import build_model, get_arrays, parameter_names
from fedpers.core.training import backbone_features, seed_everything, train_head_on_features
from fedpers.registry.config import build_config
from tests.conftest import make_context, pfedkdh_broadcast, tiny_overrides


def test_distillation_kl_known_value():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])  # softmax -> (0.75, 0.25) at T=1
    # KL((.75,.25) || (.5,.5)) = .75 ln 1.5 + .25 ln .5
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert distillation_kl(student, teacher, 1.0).item() == pytest.approx(expected)


def test_distillation_kl_temperature_softens_and_is_zero_for_equal_logits():
    a = torch.tensor([[2.0, -1.0, 0.5]])
    assert abs(distillation_kl(a, a.clone(), 3.0).item()) < 1e-7
    b = torch.tensor([[-1.0, 2.0, 0.0]])
    assert distillation_kl(a, b, 5.0) < distillation_kl(a, b, 1.0)


def test_teacher_gets_no_gradient():
    s = torch.randn(4, 3, requires_grad=True)
    t = torch.randn(4, 3, requires_grad=True)
    distillation_kl(s, t, 2.0).backward()
    assert t.grad is None and s.grad is not None


def test_pfedkdh_objective_combines_terms_exactly():
    torch.manual_seed(0)
    s, t = torch.randn(5, 4), torch.randn(5, 4)
    y = torch.tensor([0, 1, 2, 3, 0])
    theta, theta_g = [torch.ones(3)], [torch.zeros(3)]
    T, lam, mu = 2.0, 0.3, 0.5
    got = pfedkdh_objective(s, t, y, temperature=T, lambda_kd=lam, mu=mu, backbone=theta, global_backbone=theta_g)
    kl = F.kl_div(F.log_softmax(s / T, 1), F.softmax(t / T, 1), reduction="batchmean")
    expected = (1 - lam) * F.cross_entropy(s, y) + lam * T**2 * kl + mu / 2 * 3.0
    assert got.item() == pytest.approx(expected.item())


def test_pfedkdh_objective_reduces_to_cross_entropy():
    s, t = torch.randn(6, 3), torch.randn(6, 3)
    y = torch.randint(0, 3, (6,))
    got = pfedkdh_objective(s, t, y, temperature=4.0, lambda_kd=0.0, mu=0.0, backbone=[torch.ones(2)],
                            global_backbone=[torch.zeros(2)])
    assert got.item() == pytest.approx(F.cross_entropy(s, y).item())


@pytest.fixture
def cfg():
    return build_config(tiny_overrides(method="pfedkdh", variant="ea"))


def test_pfedkdh_upload_contains_no_head_parameter(cfg):
    strategy, params = pfedkdh_broadcast(cfg)
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
    strategy, params = pfedkdh_broadcast(cfg)
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
    _, params = pfedkdh_broadcast(cfg)
    context = make_context(2, cfg.num_clients)
    PFedKDHClient(cfg, context).fit(params, {"server_round": 1})
    before = context.state["fedpers.personal"].to_numpy_ndarrays()
    _, _, metrics = PFedKDHClient(cfg, context).evaluate(params, {"server_round": 1})
    after = context.state["fedpers.personal"].to_numpy_ndarrays()
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert 0.0 <= metrics["acc"] <= 1.0 and 0.0 <= metrics["acc_fair"] <= 1.0


def test_recal_every_round_false_keeps_only_the_initial_calibration():
    """Fig. 3 '+KD' ablation: the teacher head is calibrated before round 1 (Alg. 1 line 5) and then left
    as it is; with recurrent recalibration (the default) every aggregation recalibrates it (line 16)."""
    fed_cfg = tiny_overrides(method="pfedkdh")
    initial_head = get_arrays(build_model(get_federation(build_config(fed_cfg)).input_shape, 10,
                                          feature_dim=64, seed=0), "head")
    heads = {}
    for every_round in (True, False):
        cfg = build_config({**fed_cfg, "recal_every_round": every_round})
        strategy, _ = pfedkdh_broadcast(cfg)
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
    model = build_model((1, 8, 8), 10, feature_dim=64, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(150, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (150,), generator=gen)
    sparse = adapt_head_copy(model, x, y, steps=7, lr=0.1, batch_size=32, drop_last=False,
                             generator=torch.Generator().manual_seed(3))
    dense = copy.deepcopy(model.head)
    train_head_on_features(dense, backbone_features(model, x), y, lr=0.1, batch_size=32, drop_last=False,
                           generator=torch.Generator().manual_seed(3), steps=7)
    for a, b in zip(sparse.parameters(), dense.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(sparse.weight, model.head.weight)


def test_ea_heads_at_several_lengths_from_one_run_are_the_heads_of_runs_of_those_lengths():
    """adapt_head_copies (ea_also): the copy after k steps of a longer run is the k-step run's head."""
    model = build_model((1, 8, 8), 10, feature_dim=64, seed=0)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(150, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (150,), generator=gen)
    heads = adapt_head_copies(model, x, y, steps=[0, 3, 12], lr=0.1, batch_size=32, drop_last=False,
                              generator=torch.Generator().manual_seed(3))
    assert torch.equal(heads[0].weight, model.head.weight)
    for k in (3, 12):
        alone = adapt_head_copy(model, x, y, steps=k, lr=0.1, batch_size=32, drop_last=False,
                                generator=torch.Generator().manual_seed(3))
        for a, b in zip(heads[k].parameters(), alone.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(heads[3].weight, heads[12].weight)


def test_ea_also_reports_what_the_same_ea_steps_or_ea_epochs_gives_as_the_headline():
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


def test_recalibration_trains_only_the_head_and_lowers_its_loss():
    """Eq. (5): the backbone stays fixed, the head's CE on Ds falls."""
    torch.manual_seed(0)
    m = build_model((1, 8, 8), 3, feature_dim=16, seed=0)
    x = torch.randn(90, 1, 8, 8)
    y = torch.arange(90) % 3
    x[y == 1] += 1.5
    x[y == 2] -= 1.5
    before_bb = get_arrays(m, "backbone")
    feats = backbone_features(m, x)
    loss_before = F.cross_entropy(m.head(feats), y).item()
    recalibrate_head(m, x, y, epochs=20, lr=0.5, batch_size=16, drop_last=False, generator=seed_everything(0))
    for b, a in zip(before_bb, get_arrays(m, "backbone")):
        np.testing.assert_array_equal(b, a)
    assert F.cross_entropy(m.head(backbone_features(m, x)), y).item() < loss_before
