"""Math of SCAFFOLD, FedDyn, FedDC, FedProc and MOON (fedpers/algorithms/) and their clients' state
handling, without a Flower run. End-to-end runs: tests/test_simulation.py (every registered method)."""

import numpy as np
import pytest
import torch

from clients.feddc import FedDCClient
from clients.feddyn import FedDynClient
from clients.scaffold import ScaffoldClient
from fedpers.algorithms.feddc import feddc_corrected_model, feddc_server_state, feddc_update_drift
from fedpers.algorithms.feddyn import feddyn_client_state, feddyn_regularizer, feddyn_server_update
from fedpers.algorithms.fedproc import fedproc_global_prototypes, prototype_contrastive_loss
from fedpers.algorithms.moon import moon_contrastive_loss
from fedpers.algorithms.prototypes import class_prototypes
from fedpers.algorithms.scaffold import scaffold_client_control, scaffold_correction, scaffold_server_update
from fedpers.algorithms.server_state import linear_term, local_steps
from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.core.models import get_arrays
from strategies.base import Upload
from strategies.feddyn import FedDynStrategy
from strategies.scaffold import ScaffoldStrategy
from tests.conftest import make_context as context, tiny_overrides


def arr(*v):
    return np.array(v, dtype=np.float64)



# --- SCAFFOLD -------------------------------------------------------------------------------------------


def test_scaffold_control_variate_arithmetic():
    c_i, c = [arr(1.0, -2.0)], [arr(0.5, 0.5)]
    x, y = [arr(3.0, 3.0)], [arr(2.0, 4.0)]
    # option II: c_i+ = c_i - c + (x - y) / (K lr), K = 4, lr = 0.5
    new = scaffold_client_control(c_i, c, x, y, steps=4, lr=0.5)
    np.testing.assert_allclose(new[0], [1.0 - 0.5 + 1.0 / 2, -2.0 - 0.5 - 1.0 / 2])
    np.testing.assert_allclose(scaffold_correction(c, c_i)[0], [-0.5, 2.5])
    # server: x += eta_g (mean_y - x); c += |S|/N mean(dc)
    new_x, new_c = scaffold_server_update(x, c, [arr(2.0, 5.0)], [arr(1.0, -1.0)], num_sampled=2, num_clients=8,
                                          server_lr=0.5)
    np.testing.assert_allclose(new_x[0], [2.5, 4.0])
    np.testing.assert_allclose(new_c[0], [0.75, 0.25])
    assert local_steps(100, 32, 2) == 8


def test_linear_term_applies_the_correction_as_gradient():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    v = torch.tensor([0.3, -0.7])
    (0.5 * (p ** 2).sum() + linear_term([p], [v])).backward()
    assert torch.allclose(p.grad, p.detach() + v)  # g(y) + (c - c_i)


def test_scaffold_client_and_server_round_trip():
    cfg = build_config(tiny_overrides(method="scaffold", aux_size=0))
    fed = get_federation(cfg)
    strategy = ScaffoldStrategy(cfg, fed)
    params = strategy.download_arrays()
    n_model = len(get_arrays(strategy.model, "all"))
    assert len(params) == 2 * n_model and all(not a.any() for a in params[n_model:])  # c = 0
    ctx = context(0, cfg.num_clients)
    up, n, metrics = ScaffoldClient(cfg, ctx).fit(params, strategy.message_config(1))
    assert metrics["arrays:model"] == metrics["arrays:control_delta"] == n_model  # named sections, counted
    y, dc = up[:n_model], up[n_model:]
    steps = local_steps(n, cfg.batch_size, cfg.local_epochs)
    expected = [(x - yy) / (steps * cfg.lr) for x, yy in zip(params[:n_model], y)]  # c = c_i = 0
    for a, b in zip(dc, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    stored = ctx.state["fedpers.scaffold_ci"].to_numpy_ndarrays()
    for a, b in zip(stored, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # the server: x = mean y (eta_g = 1), c = |S|/N * mean dc
    new_x = strategy.aggregate(1, {0: Upload(y, n, {"control_delta": dc})})
    for a, b in zip(new_x, y):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(strategy.server_state, dc):
        np.testing.assert_allclose(a, b / cfg.num_clients, rtol=1e-5, atol=1e-7)
    # second participation: the stored c_i enters the correction
    strategy.apply_aggregate(1, new_x)
    c2 = ScaffoldClient(cfg, ctx)
    c2.receive(strategy.download_arrays(), strategy.message_config(2))
    for corr, c, ci in zip(c2.correction, strategy.server_state, stored):
        np.testing.assert_allclose(corr.numpy(), c - ci, rtol=1e-5, atol=1e-6)


# --- FedDyn ---------------------------------------------------------------------------------------------


def test_feddyn_dual_update():
    g = [arr(0.2, -0.1)]
    theta_i, theta_g = [arr(1.0, 1.0)], [arr(0.5, 2.0)]
    np.testing.assert_allclose(feddyn_client_state(g, theta_i, theta_g, alpha=0.1)[0], [0.2 - 0.05, -0.1 + 0.1])
    h = [arr(0.0, 1.0)]
    theta, new_h = feddyn_server_update(h, theta_g, [arr(1.5, 1.0)], num_sampled=2, num_clients=4, alpha=0.1)
    # h = h - alpha * |S|/N * (mean - prev); theta = mean - h / alpha
    np.testing.assert_allclose(new_h[0], [0.0 - 0.1 * 0.5 * 1.0, 1.0 - 0.1 * 0.5 * -1.0])
    np.testing.assert_allclose(theta[0], [1.5 - new_h[0][0] / 0.1, 1.0 - new_h[0][1] / 0.1])


def test_feddyn_regularizer_gradient():
    p = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    gs, ref = torch.tensor([0.5, 0.25]), torch.tensor([0.0, 1.0])
    feddyn_regularizer([p], [gs], [ref], alpha=0.2).backward()
    assert torch.allclose(p.grad, -gs + 0.2 * (p.detach() - ref))


def test_feddyn_client_keeps_its_gradient_state():
    cfg = build_config(tiny_overrides(method="feddyn", aux_size=0, feddyn_alpha=0.1))
    strategy = FedDynStrategy(cfg, get_federation(cfg))
    params = strategy.download_arrays()
    assert len(params) == len(get_arrays(strategy.model, "all"))  # h stays on the server
    ctx = context(1, cfg.num_clients)
    up, n, _ = FedDynClient(cfg, ctx).fit(params, strategy.message_config(1))
    state = ctx.state["fedpers.feddyn_grad"].to_numpy_ndarrays()
    for s, t, g in zip(state, up, params):
        np.testing.assert_allclose(s, -0.1 * (t - g), rtol=1e-4, atol=1e-7)
    theta = strategy.aggregate(1, {0: Upload(up, n, {})})
    for a, t, h in zip(theta, up, strategy.h):
        np.testing.assert_allclose(a, t - h / 0.1, rtol=1e-4, atol=1e-6)


# --- FedDC ----------------------------------------------------------------------------------------------


def test_feddc_drift_and_state():
    h, theta, w = [arr(0.1, 0.0)], [arr(1.0, 2.0)], [arr(0.5, 2.5)]
    new_h = feddc_update_drift(h, theta, w)
    np.testing.assert_allclose(new_h[0], [0.6, -0.5])
    np.testing.assert_allclose(feddc_corrected_model(theta, new_h)[0], [1.6, 1.5])
    np.testing.assert_allclose(feddc_server_state([arr(1.0, 1.0)], [arr(2.0, -2.0)], 1, 4)[0], [1.5, 0.5])


def test_feddc_client_uploads_corrected_model():
    cfg = build_config(tiny_overrides(method="feddc", aux_size=0))
    from strategies.feddc import FedDCStrategy

    strategy = FedDCStrategy(cfg, get_federation(cfg))
    params = strategy.download_arrays()
    n_model = len(get_arrays(strategy.model, "all"))
    ctx = context(0, cfg.num_clients)
    client = FedDCClient(cfg, ctx)
    up, n, _ = client.fit(params, strategy.message_config(1))
    theta = get_arrays(client.model, "all")
    drift = ctx.state["fedpers.feddc_drift"].to_numpy_ndarrays()
    for d, t, w in zip(drift, theta, params[:n_model]):
        np.testing.assert_allclose(d, t - w, rtol=1e-5, atol=1e-7)  # h_i = 0 + (theta_i - w)
    for u, t, d in zip(up[:n_model], theta, drift):
        np.testing.assert_allclose(u, t + d, rtol=1e-5, atol=1e-7)
    assert len(up) == 2 * n_model


# --- FedProc and MOON ------------------------------------------------------------------------------------


def test_prototypes_and_their_aggregation():
    feats = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    protos, counts = class_prototypes(feats, torch.tensor([0, 0, 2]), 3)
    np.testing.assert_allclose(protos, [[2.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(counts, [2, 0, 1])
    other = (np.array([[4.0, 0.0], [1.0, 1.0], [0.0, 0.0]]), np.array([2.0, 1.0, 0.0]))
    prev = np.full((3, 2), 9.0)
    g, seen = fedproc_global_prototypes([(protos, counts), other], prev)
    np.testing.assert_array_equal(seen, [1, 1, 1])
    np.testing.assert_allclose(g, [[3.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    g2, seen2 = fedproc_global_prototypes([(protos, np.zeros(3))], prev)
    np.testing.assert_array_equal(seen2, [0, 0, 0])
    np.testing.assert_allclose(g2, prev)  # nobody reported: keep the previous prototypes


def test_prototype_contrastive_loss_prefers_the_own_prototype():
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0])
    near = prototype_contrastive_loss(torch.tensor([[1.0, 0.1]]), y, protos, 0.5)
    far = prototype_contrastive_loss(torch.tensor([[0.1, 1.0]]), y, protos, 0.5)
    assert near < far
    masked = prototype_contrastive_loss(torch.tensor([[1.0, 0.1]]), torch.tensor([1]), protos, 0.5,
                                        torch.tensor([True, False]))
    assert masked.item() == 0.0


def test_moon_loss_pulls_towards_global_and_away_from_previous():
    z = torch.tensor([[1.0, 0.0]])
    good = moon_contrastive_loss(z, torch.tensor([[1.0, 0.1]]), torch.tensor([[0.0, 1.0]]), 0.5)
    bad = moon_contrastive_loss(z, torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.1]]), 0.5)
    assert good < bad
    assert moon_contrastive_loss(z, z, z, 0.5).item() == pytest.approx(np.log(2), rel=1e-5)


@pytest.mark.parametrize("method", ["scaffold", "feddyn", "feddc", "fedproc", "moon"])
def test_state_survives_a_round_without_participation(method):
    from fedpers.registry.methods import client_class_for, strategy_class_for

    cfg = build_config(tiny_overrides(method=method, aux_size=0))
    strategy = strategy_class_for(cfg)(cfg, get_federation(cfg))
    ctx = context(2, cfg.num_clients)
    cls = client_class_for(cfg)
    cls(cfg, ctx).fit(strategy.download_arrays(), strategy.message_config(1))
    before = {k: [a.copy() for a in v.to_numpy_ndarrays()] for k, v in ctx.state.array_records.items()}
    cls(cfg, ctx).evaluate(strategy.download_arrays(), strategy.message_config(2))  # evaluation changes no state
    after = {k: v.to_numpy_ndarrays() for k, v in ctx.state.array_records.items()}
    assert before.keys() == after.keys()
    for k in before:
        for a, b in zip(before[k], after[k]):
            np.testing.assert_array_equal(a, b)
