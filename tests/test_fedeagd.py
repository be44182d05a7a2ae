"""FedEAGD: the pure math (drift, coefficient, distillation, fusion schedule, EMA), the SE-CNN and its
split, the client (teacher without gradients, upload, ablations) and one Ray simulation with the
communication accounting."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.fedeagd import TEACHER_STATE, FedEAGDClient
from fedpers.registry.config import build_config
from fedpers.algorithms.fedeagd import (FIT_STATISTICS, distillation_coefficient, ema_update,
                                        fedeagd_coefficients, fusion_coefficient, historical_distillation,
                                        mechanism_statistics, per_sample_distillation, representation_drift)
from fedpers.core.federation import get_federation
from fedpers.core.models import array_shapes, build_model, get_arrays, parameter_count, parameter_names, set_arrays
from fedpers.core.training import EVAL_BATCH, frozen_copy
from strategies.fedeagd import FedEAGDStrategy
from tests.conftest import tiny_overrides
from tests.test_clients import make_context

PAPER_SHARED_PARAMS = 2_153_216  # summary: shared extractor on CIFAR-100


# --- pure math -------------------------------------------------------------------------------------
def test_drift_identical_is_zero_orthogonal_is_one_opposite_is_two():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0], [1.0, 1.0]])
    t = torch.tensor([[5.0, 0.0], [7.0, 0.0], [3.0, 4.0], [-2.0, -2.0]])
    d = representation_drift(z, t)
    assert d.shape == (4,)
    torch.testing.assert_close(d, torch.tensor([0.0, 1.0, 0.0, 2.0]), atol=1e-6, rtol=0)


def test_mechanism_statistics_exact_values():
    # ten samples: drifts 0.0, 0.1, ..., 0.9; coefficient min(0.5 (1 + d), 0.9) clips the last three
    drift = torch.arange(10, dtype=torch.float64) / 10
    coef = distillation_coefficient(drift, 0.5, 0.9).double()
    stats = mechanism_statistics(drift, coef, upper=0.9, ce_total=3.0, kd_total=1.0)
    assert stats["mean_drift"] == pytest.approx(0.45)
    assert stats["max_drift"] == pytest.approx(0.9)
    # coefficients 0.50 0.55 ... 0.85, then 0.90 (d = 0.8 gives exactly the bound) 0.90 0.90
    assert stats["mean_kd_coef"] == pytest.approx((0.5 * sum(1 + d / 10 for d in range(8)) + 0.9 * 2) / 10)
    assert stats["kd_coef_p10"] == pytest.approx(0.545)  # position 0.9 between 0.50 and 0.55
    assert stats["kd_coef_p50"] == pytest.approx(0.725)  # between 0.70 and 0.75
    assert stats["kd_coef_p90"] == pytest.approx(0.9)
    assert stats["kd_coef_at_bound"] == pytest.approx(0.2)
    assert stats["kd_loss_share"] == pytest.approx(0.25)
    assert set(stats) == set(FIT_STATISTICS)
    assert mechanism_statistics(drift, coef, 0.9, 0.0, 0.0)["kd_loss_share"] == 0.0


def test_drift_is_per_sample_on_flattened_maps():
    z = torch.randn(3, 2, 2, 2)
    t = z.clone()
    t[1] = -t[1]
    torch.testing.assert_close(representation_drift(z, t), torch.tensor([0.0, 2.0, 0.0]), atol=1e-6, rtol=0)


def test_coefficient_is_base_times_one_plus_drift_clipped():
    d = torch.tensor([0.0, 0.2, 0.5, 1.0, 2.0])
    c = distillation_coefficient(d, base=0.5, upper=0.8)
    torch.testing.assert_close(c, torch.tensor([0.5, 0.6, 0.75, 0.8, 0.8]))
    # the bound never raises a coefficient, and without clipping it is exactly base (1 + d)
    torch.testing.assert_close(distillation_coefficient(d, base=0.5, upper=10.0), 0.5 * (1 + d))


def test_coefficient_carries_no_gradient():
    z = torch.randn(4, 3, requires_grad=True)
    t = torch.randn(4, 3)
    drift, coef = fedeagd_coefficients(z, t, adaptive=True, base=0.5, upper=1.0, fixed=0.5)
    assert not coef.requires_grad and not drift.requires_grad


def test_fixed_weighting_gives_every_sample_the_fixed_value():
    z, t = torch.randn(5, 3), torch.randn(5, 3)
    _, adaptive = fedeagd_coefficients(z, t, adaptive=True, base=0.5, upper=1.0, fixed=0.5)
    _, fixed = fedeagd_coefficients(z, t, adaptive=False, base=0.5, upper=1.0, fixed=0.5)
    torch.testing.assert_close(fixed, torch.full((5,), 0.5))
    assert (adaptive > 0.5).all()  # random vectors drift, so adaptive > base


def test_weighted_historical_distillation_known_values():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    t = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    coef = torch.tensor([0.5, 2.0])
    # cosine: per-sample losses (0, 1) -> mean(0.5*0, 2*1) = 1
    assert historical_distillation(z, t, coef, "cosine").item() == pytest.approx(1.0)
    # mse: per-sample mean squared differences (0, 1) -> same
    torch.testing.assert_close(per_sample_distillation(z, t, "mse"), torch.tensor([0.0, 1.0]))
    assert historical_distillation(z, t, coef, "mse").item() == pytest.approx(1.0)


def test_distillation_gradient_reaches_the_student_only():
    z = torch.randn(4, 3, requires_grad=True)
    t = torch.randn(4, 3, requires_grad=True)
    historical_distillation(z, t, torch.ones(4), "cosine").backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    assert t.grad is None


@pytest.mark.parametrize("t, expected", [(0, 0.0), (1, 0.0), (4, 0.0), (5, 0.25), (6, 0.5), (8, 1.0),
                                         (9, 1.0), (100, 1.0)])
def test_fusion_schedule_at_boundary_rounds(t, expected):
    # activation round 5, ramp 4: 0 before 5, 1/4 at 5, linear, 1 from 5 + 4 - 1 = 8 on
    assert fusion_coefficient(t, start=5, ramp=4) == pytest.approx(expected)


def test_fusion_schedule_step_and_ablations():
    assert fusion_coefficient(4, start=5, ramp=0) == 0.0
    assert fusion_coefficient(5, start=5, ramp=0) == 1.0
    assert fusion_coefficient(0, start=5, ramp=4, mode="always") == 1.0
    assert fusion_coefficient(100, start=5, ramp=4, mode="off") == 0.0
    with pytest.raises(ValueError):
        fusion_coefficient(1, 1, 1, mode="sometimes")


def test_ema_update_arithmetic():
    teacher = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    student = [np.array([3.0, 6.0], np.float32), np.array([[4.0]], np.float32)]
    out = ema_update(teacher, student, 0.75)  # 0.75 T + 0.25 S
    np.testing.assert_allclose(out[0], [1.5, 3.0])
    np.testing.assert_allclose(out[1], [[1.0]])
    assert out[0].dtype == np.float32
    for a, b in zip(ema_update(teacher, student, 1.0), teacher):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(ema_update(teacher, student, 0.0), student):
        np.testing.assert_array_equal(a, b)
    # two updates = geometric weighting of the history
    two = ema_update(ema_update(teacher, student, 0.5), [np.array([5.0, 10.0], np.float32), student[1]], 0.5)
    np.testing.assert_allclose(two[0], 0.25 * np.array([1, 2]) + 0.25 * np.array([3, 6]) + 0.5 * np.array([5, 10]))
    with pytest.raises(ValueError):
        ema_update(teacher, student[:1], 0.5)


# --- model and split ----------------------------------------------------------------------------------
def test_se_cnn_shared_extractor_size_on_cifar100_shapes():
    m = build_model((3, 32, 32), 100, kind="se_cnn", seed=0)
    n = parameter_count(m, "backbone")
    assert n == 2_152_748
    assert abs(n - PAPER_SHARED_PARAMS) / PAPER_SHARED_PARAMS < 0.001  # within 0.1% of the summary's count


def test_se_cnn_split_covers_the_model_once():
    m = build_model((1, 8, 8), 10, feature_dim=16, kind="se_cnn", seed=0)
    bb, res, head = (parameter_names(m, p) for p in ("backbone", "residual", "head"))
    assert sorted(bb + res + head) == sorted(parameter_names(m, "all"))
    assert set(bb).isdisjoint(res) and set(bb).isdisjoint(head) and set(res).isdisjoint(head)
    assert parameter_names(m, "personal") == [k for k in parameter_names(m, "all") if k in set(res + head)]
    assert all(k.startswith("backbone.") for k in bb)
    # the foundation's CNN: personal == head, no residual, backbone unchanged
    c = build_model((1, 8, 8), 10, feature_dim=16, seed=0)
    assert parameter_names(c, "personal") == parameter_names(c, "head") == ["head.weight", "head.bias"]
    assert parameter_names(c, "residual") == []


def test_fusion_gate_changes_the_output_only_when_the_residual_is_on():
    m = build_model((1, 8, 8), 10, feature_dim=16, kind="se_cnn", seed=0).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        base = m(x)
        m.fusion = 1.0
        torch.testing.assert_close(m(x), base)  # zero-initialised last residual layer: no jump at activation
        torch.nn.init.normal_(m.residual[2].weight)
        assert not torch.allclose(m(x), base)
        m.fusion = 0.0
        torch.testing.assert_close(m(x), base)


# --- client -------------------------------------------------------------------------------------------
def fedeagd_cfg(**extra):
    return build_config(tiny_overrides(method="fedeagd", **extra))


def broadcast(cfg):
    strategy = FedEAGDStrategy(cfg, get_federation(cfg))
    return strategy, strategy.download_arrays()


def test_strategy_broadcasts_and_aggregates_the_shared_extractor_only():
    cfg = fedeagd_cfg()
    strategy, params = broadcast(cfg)
    assert [a.shape for a in params] == array_shapes(strategy.model, "backbone")
    assert strategy.upload_shapes == array_shapes(strategy.model, "backbone")
    assert strategy.shared_params == parameter_count(strategy.model, "backbone")


def test_upload_contains_only_shared_extractor_arrays():
    cfg = fedeagd_cfg(fedeagd_fusion="always")
    strategy, params = broadcast(cfg)
    ctx = make_context(0, cfg.num_clients)
    FedEAGDClient(cfg, ctx).fit(params, {"server_round": 1})
    client = FedEAGDClient(cfg, ctx)
    up, n, metrics = client.fit(params, {"server_round": 2})
    names = parameter_names(client.model, "backbone")
    assert len(up) == len(names) and all(n.startswith("backbone.") for n in names)
    assert [a.shape for a in up] == array_shapes(client.model, "backbone")
    for a, b in zip(up, get_arrays(client.model, "backbone")):
        np.testing.assert_array_equal(a, b)  # the trained extractor, not the EMA teacher
    teacher = ctx.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays()
    assert any(not np.array_equal(a, t) for a, t in zip(up, teacher))
    # head and residual are persisted, not uploaded
    personal = ctx.state["fedpers.personal"].to_numpy_ndarrays()
    assert [p.shape for p in personal] == array_shapes(client.model, "personal")
    assert n == len(client.data.train) and metrics["fusion"] == 1.0


def test_ema_teacher_receives_no_gradient_and_changes_only_by_ema():
    cfg = fedeagd_cfg(fedeagd_ema_decay=0.75)
    _, params = broadcast(cfg)
    ctx = make_context(1, cfg.num_clients)
    first, _, _ = FedEAGDClient(cfg, ctx).fit(params, {"server_round": 1})
    t1 = ctx.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays()
    for a, b in zip(t1, first):
        np.testing.assert_array_equal(a, b)  # first participation: the teacher starts as the trained extractor

    client = FedEAGDClient(cfg, ctx)
    client.set_round(2)
    client.prepare(params)
    client.teacher = client.load_teacher()
    assert client.teacher is not None
    teacher_params = list(client.teacher.parameters())
    assert all(not p.requires_grad for p in teacher_params)
    train = client.data.train
    loss = client.batch_loss(train.x[:16], train.y[:16])
    loss.backward()
    assert all(p.grad is None for p in teacher_params)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in client.model.backbone.parameters())

    second, _, metrics = FedEAGDClient(cfg, ctx).fit(params, {"server_round": 2})
    t2 = ctx.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays()
    for a, old, new in zip(t2, t1, second):
        np.testing.assert_allclose(a, 0.75 * old + 0.25 * new, rtol=1e-6, atol=1e-7)
    assert metrics["mean_drift"] >= 0 and metrics["mean_kd_coef"] >= cfg.fedeagd_kd_base
    # every declared statistic, each consistent with the others
    assert set(FIT_STATISTICS) <= set(metrics)
    assert cfg.fedeagd_kd_base <= metrics["kd_coef_p10"] <= metrics["kd_coef_p50"] <= metrics["kd_coef_p90"]
    assert metrics["kd_coef_p90"] <= cfg.fedeagd_kd_max
    assert 0 < metrics["kd_loss_share"] < 1


def test_received_teacher_source_averages_the_broadcast_extractor_not_the_trained_one():
    cfg = fedeagd_cfg(fedeagd_ema_decay=0.75, fedeagd_teacher_source="received")
    _, params = broadcast(cfg)
    ctx = make_context(1, cfg.num_clients)
    first, _, _ = FedEAGDClient(cfg, ctx).fit(params, {"server_round": 1})
    t1 = ctx.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays()
    for a, b in zip(t1, params):
        np.testing.assert_array_equal(a, b)  # first participation: the teacher starts as the broadcast
    assert any(not np.array_equal(a, b) for a, b in zip(first, params))  # training moved the extractor

    # round 2 broadcasts another extractor (round 1's trained one, as a server aggregating this client alone)
    second, _, metrics = FedEAGDClient(cfg, ctx).fit(first, {"server_round": 2})
    t2 = ctx.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays()
    for a, old, new in zip(t2, t1, first):
        np.testing.assert_allclose(a, 0.75 * old + 0.25 * new, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, 0.75 * old + 0.25 * trained, rtol=1e-6, atol=1e-7)
               for a, old, trained in zip(t2, t1, second))
    assert metrics["mean_drift"] > 0  # the round-2 student starts away from the teacher (the round-1 broadcast)


def _batch_loss(cfg, ctx, server_round=2):
    """The client's loss on one fixed batch (dropout seeded), with the stored teacher."""
    client = FedEAGDClient(cfg, ctx)
    client.set_round(server_round)
    _, params = broadcast(cfg)
    client.prepare(params)
    client.teacher = client.load_teacher()
    train = client.data.train
    torch.manual_seed(0)
    client.model.train()
    return client, client.batch_loss(train.x[:32], train.y[:32]).item()


def _trained_context(cfg, pid=0):
    _, params = broadcast(cfg)
    ctx = make_context(pid, cfg.num_clients)
    FedEAGDClient(cfg, ctx).fit(params, {"server_round": 1})
    return ctx


def test_teacher_features_computed_once_a_round_train_as_the_per_batch_teacher(monkeypatch):
    """FedEAGDClient.train computes the frozen teacher's features of every sample once for the round; the
    per-batch teacher (the base class's training on batch_loss) gives the same round up to rounding: same
    batches, extractor, teacher update and mechanism statistics, with a third of the teacher's passes
    at 3 local epochs."""
    import copy

    from clients.base import FedPersClient

    cfg = fedeagd_cfg(local_epochs=3, fedeagd_ema_decay=0.5)
    ctx = _trained_context(cfg, pid=1)
    ctx_batch = make_context(1, cfg.num_clients)
    ctx_batch.state = copy.deepcopy(ctx.state)  # the same teacher, head and residual
    _, params = broadcast(cfg)
    passes: list[int] = []  # samples in each forward pass of the teacher's extractor
    load_teacher = FedEAGDClient.load_teacher

    def counted_teacher(client):
        teacher = load_teacher(client)
        teacher.backbone.register_forward_hook(lambda module, inputs, output: passes.append(len(inputs[0])))
        return teacher

    monkeypatch.setattr(FedEAGDClient, "load_teacher", counted_teacher)
    once_client = FedEAGDClient(cfg, ctx)
    once = once_client.fit(params, {"server_round": 2})
    once_passes, passes[:] = list(passes), []
    monkeypatch.setattr(FedEAGDClient, "train", FedPersClient.train)  # the teacher inside batch_loss
    per_batch = FedEAGDClient(cfg, ctx_batch).fit(params, {"server_round": 2})
    n = len(once_client.data.train)
    assert sum(once_passes) == n and len(once_passes) == -(-n // EVAL_BATCH)  # one eval-mode pass
    assert sum(passes) == cfg.local_epochs * n  # every sample in every epoch
    for a, b in zip(once[0], per_batch[0]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for name in FIT_STATISTICS:
        assert once[2][name] == pytest.approx(per_batch[2][name], rel=1e-4, abs=1e-7), name
    for a, b in zip(ctx.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays(),
                    ctx_batch.state["fedpers." + TEACHER_STATE].to_numpy_ndarrays()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_no_teacher_ablation_is_plain_cross_entropy_and_keeps_no_teacher():
    on = fedeagd_cfg()
    ctx = _trained_context(on)
    client, with_teacher = _batch_loss(on, ctx)
    off = fedeagd_cfg(fedeagd_teacher=False)
    client_off, without = _batch_loss(off, ctx)
    assert client_off.teacher is None and client.teacher is not None
    train = client_off.data.train
    torch.manual_seed(0)
    ce = F.cross_entropy(client_off.model(train.x[:32]), train.y[:32]).item()
    assert without == pytest.approx(ce, rel=1e-6)
    assert with_teacher > without
    fresh = make_context(2, off.num_clients)
    FedEAGDClient(off, fresh).fit(broadcast(off)[1], {"server_round": 1})
    assert "fedpers." + TEACHER_STATE not in fresh.state


def test_fixed_coefficient_ablation_changes_the_loss():
    adaptive = fedeagd_cfg(fedeagd_kd_base=0.5, fedeagd_kd_max=5.0)
    ctx = _trained_context(adaptive)
    _, a = _batch_loss(adaptive, ctx)
    _, f = _batch_loss(fedeagd_cfg(fedeagd_kd_base=0.5, fedeagd_kd_max=5.0, fedeagd_kd_weighting="fixed"), ctx)
    assert a > f  # adaptive >= base = fixed on every sample, > where drift > 0


def test_fusion_ablations_change_the_model_used():
    progressive = fedeagd_cfg(fedeagd_fusion_start=20, fedeagd_fusion_ramp=20)
    ctx = _trained_context(progressive)
    # give the persistent residual non-zero weights so that the gate matters
    client = FedEAGDClient(progressive, ctx)
    personal = [a + 0.1 for a in client.personal_arrays()]
    client.save_state("personal", personal)
    losses = {}
    for mode in ("progressive", "always", "off"):
        cfg = fedeagd_cfg(fedeagd_fusion_start=20, fedeagd_fusion_ramp=20, fedeagd_fusion=mode)
        c, losses[mode] = _batch_loss(cfg, ctx, server_round=2)
        assert c.model.fusion == {"progressive": 0.0, "always": 1.0, "off": 0.0}[mode]
    assert losses["progressive"] == pytest.approx(losses["off"])  # round 2 < activation round 20
    assert losses["always"] != pytest.approx(losses["progressive"])
    c, late = _batch_loss(fedeagd_cfg(fedeagd_fusion_start=20, fedeagd_fusion_ramp=20), ctx, server_round=30)
    assert c.model.fusion == pytest.approx(0.55) and late != pytest.approx(losses["progressive"])


def test_residual_is_trained_and_persisted_once_the_gate_is_open():
    cfg = fedeagd_cfg(fedeagd_fusion="always")
    _, params = broadcast(cfg)
    ctx = make_context(0, cfg.num_clients)
    client = FedEAGDClient(cfg, ctx)
    initial = get_arrays(client.model, "residual")
    client.fit(params, {"server_round": 1})
    stored = ctx.state["fedpers.personal"].to_numpy_ndarrays()
    model = build_model(get_federation(cfg).input_shape, 10, feature_dim=cfg.feature_dim, kind="se_cnn")
    set_arrays(model, stored, "personal")
    assert any(not np.array_equal(a, b) for a, b in zip(get_arrays(model, "residual"), initial))


def test_fedeagd_keys_reject_bad_values():
    from fedpers.core.errors import ConfigError

    with pytest.raises(ConfigError, match="fedeagd_fusion"):
        fedeagd_cfg(fedeagd_fusion="sometimes")
    with pytest.raises(ConfigError, match="fedeagd_ema_decay"):
        fedeagd_cfg(fedeagd_ema_decay=1.5)
    with pytest.raises(ConfigError, match="fedeagd_kd_form"):
        fedeagd_cfg(fedeagd_kd_form="kl")
    with pytest.raises(ConfigError, match="fedeagd_teacher_source"):
        fedeagd_cfg(fedeagd_teacher_source="global")


def test_ready_configs_resolve():
    from fedpers.registry.config import load_config
    from tests.conftest import ROOT

    prac = load_config(ROOT / "configs" / "fedeagd_practical.yaml")
    path = load_config(ROOT / "configs" / "fedeagd_pathological.yaml")
    for c in (prac, path):
        assert (c.method, c.num_clients, c.fraction_fit, c.rounds) == ("fedeagd", 20, 1.0, 100)
    assert prac.partition == "dirichlet" and prac.alpha == 0.1
    assert path.partition == "pathological"


# --- end to end ---------------------------------------------------------------------------------------
@pytest.mark.simulation
def test_fedeagd_simulation_counts_shared_extractor_bytes(tmp_path):
    from fedpers.core.results import read_metrics, read_summary
    from fedpers.apps.inprocess import run_in_process

    # in-process: the server counts the bytes of the serialized messages, which every engine sends alike
    # (FedEAGD in Ray: tests/test_simulation.py)
    cfg = fedeagd_cfg(out_dir=str(tmp_path), fedeagd_fusion_start=2, fedeagd_fusion_ramp=1)
    run_in_process(cfg)
    rounds, summary = read_metrics(tmp_path), read_summary(tmp_path)
    shared = summary["shared_params"]
    model = build_model(get_federation(cfg).input_shape, 10, feature_dim=cfg.feature_dim, kind="se_cnn")
    assert shared == parameter_count(model, "backbone")
    n_arrays = len(parameter_names(model, "backbone"))
    assert summary["shared_bytes_fp32"] == 4 * shared
    assert summary["shared_bytes_fp32_bidirectional"] == 8 * shared
    for r in rounds:
        assert len(r["fit_clients"]) == 3
        for key in ("bytes_up_per_client", "bytes_down_per_client"):
            # serialized .npy arrays: the fp32 payload plus a header of at most 128 bytes per array
            assert 4 * shared < r[key] <= 4 * shared + 128 * n_arrays
        assert r["bytes_per_client_bidirectional"] == r["bytes_up_per_client"] + r["bytes_down_per_client"]
        assert r["fit_bytes_up"] == r["bytes_up"] == 3 * r["bytes_up_per_client"]
        assert r["fit_bytes_down"] == 3 * r["bytes_down_per_client"]
        assert r["client_state_consistent"] is True and r["global_acc"] is None
    assert rounds[0]["fedeagd_mean_drift"] is None  # no history in the first participation
    assert rounds[1]["fedeagd_mean_drift"] >= 0 and rounds[1]["fedeagd_mean_kd_coef"] >= cfg.fedeagd_kd_base
    assert rounds[1]["fedeagd_max_drift"] >= rounds[1]["fedeagd_mean_drift"]
    # the report tabulates what the summary names (round_statistics.md)
    assert summary["round_statistics"] == [f"fedeagd_{name}" for name in FIT_STATISTICS]
    assert rounds[1]["fedeagd_kd_coef_p10"] <= rounds[1]["fedeagd_kd_coef_p90"]
    assert 0 < rounds[1]["fedeagd_kd_loss_share"] < 1
    assert summary["fit_bytes_up"] == sum(r["fit_bytes_up"] for r in rounds)
    assert summary["fit_messages"] == 6
    assert summary["bytes_per_client_per_round_bidirectional"] == rounds[-1]["bytes_per_client_bidirectional"]


def test_drift_of_identical_extractors_is_zero_with_dropout_on():
    """The drift compares student and teacher features in the same (eval) mode: a teacher equal to the
    student gives drift 0 on every sample although the student trains with dropout."""
    cfg = fedeagd_cfg(dropout=0.5)
    ctx = _trained_context(cfg)
    client = FedEAGDClient(cfg, ctx)
    client.set_round(2)
    client.prepare(broadcast(cfg)[1])
    client.teacher = frozen_copy(client.model)
    client.model.train()
    train = client.data.train
    client.batch_loss(train.x[:32], train.y[:32])
    drifts = torch.cat(client._drifts)
    assert drifts.shape == (32,) and float(drifts.max()) < 1e-6
    assert client.model.training and client.model.backbone.training  # training mode restored


def test_untrained_squeeze_excitation_gate_is_nearly_open():
    """The SE gate starts at sigmoid(SE_GATE_BIAS) = 0.95 with the excitation weights at zero, and stays
    near it with the random ones: an untrained block does not halve its features."""
    from fedpers.core.models import SE_GATE_BIAS, SqueezeExcitation

    torch.manual_seed(0)
    se = SqueezeExcitation(32)
    x = torch.rand(4, 32, 6, 6)
    gate = se(x) / x
    assert gate.min() > 0.85 and gate.mean() > 0.9
    torch.nn.init.zeros_(se.fc2.weight)
    torch.testing.assert_close(se(x), x * torch.sigmoid(torch.tensor(SE_GATE_BIAS)))


def test_residual_init_key_starts_the_output_layer_at_zero_or_at_the_seeded_default():
    zero_cfg, default_cfg = fedeagd_cfg(), fedeagd_cfg(fedeagd_residual_init="default")
    zero = FedEAGDClient(zero_cfg, make_context(0, zero_cfg.num_clients))
    first, second = (FedEAGDClient(default_cfg, make_context(k, default_cfg.num_clients)) for k in (0, 1))
    w0, b0, w_zero, b_zero = get_arrays(zero.model, "residual")
    assert not w_zero.any() and not b_zero.any()  # ours: opening the gate leaves the features as they are
    w0d, b0d, w_out, b_out = get_arrays(first.model, "residual")
    np.testing.assert_array_equal(w0d, w0)  # only the output layer is re-drawn
    np.testing.assert_array_equal(b0d, b0)
    bound = 1 / np.sqrt(w_out.shape[1])  # PyTorch's Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert w_out.any() and np.abs(w_out).max() <= bound and np.abs(b_out).max() <= bound
    for a, b in zip(get_arrays(first.model, "personal"), get_arrays(second.model, "personal")):
        np.testing.assert_array_equal(a, b)  # every client starts from the same residual
    # a client without saved state starts each round from that init, not from the zeros
    for a, b in zip(first.personal_arrays(), get_arrays(first.model, "personal")):
        np.testing.assert_array_equal(a, b)


def test_features_in_both_modes_are_a_training_pass_and_an_eval_pass_from_one_trunk():
    """The drift's eval-mode features come from the same convolutions as the training features (one pass):
    they equal a separate eval-mode pass exactly, and the training features equal a plain training pass
    under the same dropout draw."""
    from torch import nn

    from fedpers.core.training import eval_mode_features, features_in_both_modes

    model = build_model((3, 16, 16), 10, feature_dim=32, seed=0, kind="se_cnn")
    model.train()
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    z, z_eval = features_in_both_modes(model.backbone, x)
    torch.manual_seed(7)
    plain = model.backbone(x)
    assert torch.equal(z, plain) and z.requires_grad and not z_eval.requires_grad
    assert torch.equal(z_eval, eval_mode_features(model.backbone, x))
    assert not torch.equal(z, z_eval)  # dropout acted on the training features only
    assert model.training
    # a backbone with batch norm cannot skip its mode: the second pass is taken
    with_bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.ReLU())
    x = torch.randn(6, 4)
    _, z_eval = features_in_both_modes(with_bn.train(), x)
    assert torch.equal(z_eval, eval_mode_features(with_bn, x))
