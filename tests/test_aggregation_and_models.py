"""Eq. (4) aggregation, update validation, the backbone/head split, and Eq. (5) recalibration."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpers.core.errors import ClientUpdateError
from fedpers.core.models import array_shapes, build_model, get_arrays, parameter_names, set_arrays
from fedpers.core.validation import update_problem, weighted_average


def test_weighted_average_known_values():
    a = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    b = [np.array([3.0, 6.0], np.float32), np.array([[4.0]], np.float32)]
    out = weighted_average([(a, 1), (b, 3)])  # Eq. 4: (1*a + 3*b) / 4
    np.testing.assert_allclose(out[0], [2.5, 5.0])
    np.testing.assert_allclose(out[1], [[3.0]])
    assert out[0].dtype == np.float32


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=6), st.floats(-5, 5))
def test_weighted_average_of_identical_updates_is_identity(counts, value):
    arr = [np.full((2, 3), value, np.float32)]
    out = weighted_average([(arr, n) for n in counts])
    np.testing.assert_allclose(out[0], arr[0], rtol=1e-6, atol=1e-6)


def test_update_problem_rejects_malformed():
    shapes = [(2,), (1, 1)]
    ok = [np.zeros(2, np.float32), np.zeros((1, 1), np.float32)]
    assert update_problem(ok, shapes, 5) is None
    assert "NaN" in update_problem([np.array([np.nan, 0], np.float32), ok[1]], shapes, 5)
    assert "shape" in update_problem([np.zeros(3, np.float32), ok[1]], shapes, 5)
    assert "arrays" in update_problem(ok[:1], shapes, 5)
    assert "sample count" in update_problem(ok, shapes, 0)
    assert "dtype" in update_problem([np.zeros(2, np.int64), ok[1]], shapes, 5)
    assert "bound" in update_problem(ok, shapes, 10, max_examples=9)


def test_split_by_name_covers_the_model_exactly_once():
    m = build_model((1, 8, 8), 10, feature_dim=16, seed=0)
    bb, head = parameter_names(m, "backbone"), parameter_names(m, "head")
    assert set(bb).isdisjoint(head)
    assert sorted(bb + head) == sorted(parameter_names(m, "all"))
    assert head == ["head.weight", "head.bias"]
    assert all(not n.startswith("head.") for n in bb)


def test_seeded_models_are_identical_and_set_arrays_round_trips():
    a = build_model((1, 8, 8), 10, feature_dim=16, seed=3)
    b = build_model((1, 8, 8), 10, feature_dim=16, seed=3)
    for x, y in zip(get_arrays(a, "all"), get_arrays(b, "all")):
        np.testing.assert_array_equal(x, y)
    c = build_model((1, 8, 8), 10, feature_dim=16, seed=4)
    set_arrays(c, get_arrays(a, "backbone"), "backbone")
    for x, y in zip(get_arrays(a, "backbone"), get_arrays(c, "backbone")):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(get_arrays(a, "head")[0], get_arrays(c, "head")[0])


def test_set_arrays_rejects_bad_shapes_and_nan():
    m = build_model((1, 8, 8), 10, feature_dim=16, seed=0)
    head = get_arrays(m, "head")
    with pytest.raises(ClientUpdateError, match="shape"):
        set_arrays(m, [head[0][:5], head[1]], "head")
    with pytest.raises(ClientUpdateError, match="expected 2"):
        set_arrays(m, head[:1], "head")
    bad = [head[0].copy(), head[1].copy()]
    bad[1][0] = np.inf
    with pytest.raises(ClientUpdateError, match="finite"):
        set_arrays(m, bad, "head")
    assert array_shapes(m, "head") == [(10, 16), (10,)]


def test_model_sizes_follow_the_data():
    for shape, classes in [((1, 8, 8), 10), ((1, 28, 28), 10), ((3, 32, 32), 100), ((3, 64, 64), 7)]:
        m = build_model(shape, classes, seed=0)
        out = m(torch.zeros(2, *shape))
        assert out.shape == (2, classes)


@pytest.mark.parametrize("kind,shape", [("cnn", (1, 28, 28)), ("cnn", (1, 8, 8)), ("se_cnn", (3, 32, 32)),
                                        ("gn_cnn", (3, 64, 64))])
def test_the_no_gradient_max_pool_path_gives_nn_maxpool2d_bit_for_bit(kind, shape):
    """fedpers' MaxPool2d takes a channels-last kernel where no gradient is taken; its outputs (and so a
    model's evaluation) must be exactly nn.MaxPool2d's, ties included (flat image regions give exact ties
    after a convolution), and training must stay on PyTorch's own path."""
    import copy

    from torch import nn

    from fedpers.core.models import MaxPool2d, build_model

    model = build_model(shape, 10, feature_dim=32, seed=0, kind=kind).eval()
    reference = copy.deepcopy(model)
    swapped = 0
    for module in reference.modules():
        for name, child in module.named_children():
            if isinstance(child, MaxPool2d):
                setattr(module, name, nn.MaxPool2d(child.kernel_size))
                swapped += 1
    assert swapped >= 2 and not any(type(m) is MaxPool2d for m in reference.modules())
    x = torch.rand(16, *shape, generator=torch.Generator().manual_seed(1))
    x[:, :, : shape[1] // 2] = 0.5  # a flat region: equal values in every pooling window
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    pool, plain = MaxPool2d(2), nn.MaxPool2d(2)
    y = torch.relu(torch.randn(4, 8, 10, 10))
    y[:, :, :4] = 0.25
    with torch.no_grad():
        fast = pool(y)
    assert torch.equal(fast, plain(y)) and fast.is_contiguous()
    a, b = y.clone().requires_grad_(), y.clone().requires_grad_()
    out = pool(a)
    assert out.grad_fn is not None and "MaxPool2DWithIndices" in type(out.grad_fn).__name__
    gradient = torch.randn_like(out)
    out.backward(gradient)
    plain(b).backward(gradient)
    assert torch.equal(a.grad, b.grad)


def test_cpu_image_batches_are_channels_last_and_train_as_channels_first(tmp_path):
    """A federation of 3-channel images hands its clients (and the server's sets) channels-last tensors on the
    CPU, where oneDNN's kernels are faster; 1-channel images and vectors stay as they were. The layout moves
    no value: batches indexed from it keep it, max-pooling it is exact, and a training step of each model kind
    gives the channels-first step's loss and parameters up to rounding."""
    from fedpers.core.federation import device_layout, get_federation
    from fedpers.core.models import MaxPool2d
    from fedpers.registry.config import build_config
    from tests.conftest import tiny_overrides

    rng = np.random.default_rng(0)
    path = tmp_path / "rgb.npz"
    np.savez(path, x_train=rng.random((60, 3, 8, 8), dtype=np.float32), y_train=np.arange(60) % 3,
             x_test=rng.random((30, 3, 8, 8), dtype=np.float32), y_test=np.arange(30) % 3)
    cfg = build_config(tiny_overrides(method="fedper", dataset=str(path), aux_size=6))
    fed = get_federation(cfg)
    client = fed.client(0, torch.device("cpu"))
    channels_last = torch.channels_last
    assert client.train.x.is_contiguous(memory_format=channels_last) and not client.train.x.is_contiguous()
    assert client.test.x.is_contiguous(memory_format=channels_last)
    assert fed.aux(torch.device("cpu")).x.is_contiguous(memory_format=channels_last)
    assert client.train.x[torch.tensor([3, 0, 1])].is_contiguous(memory_format=channels_last)
    loaded = torch.from_numpy(fed.dataset.x_train)
    assert torch.equal(client.train.x, loaded[fed.partition.train[0]])  # same values, another order in memory
    gray, vectors = torch.rand(4, 1, 8, 8), torch.rand(4, 60)
    assert device_layout(gray) is gray and device_layout(vectors) is vectors

    pooled = MaxPool2d(2)(device_layout(torch.relu(torch.randn(4, 8, 10, 10))))
    assert pooled.is_contiguous(memory_format=channels_last)

    for kind, shape in [("cnn", (3, 32, 32)), ("se_cnn", (3, 32, 32)), ("gn_cnn", (3, 64, 64))]:
        x = torch.rand(8, *shape, generator=torch.Generator().manual_seed(2))
        y = torch.arange(8) % 5
        steps = []
        for batch in (x, device_layout(x)):
            model = build_model(shape, 5, feature_dim=32, seed=0, kind=kind, dropout=0.0)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loss = torch.nn.functional.cross_entropy(model(batch), y)
            loss.backward()
            opt.step()
            steps.append((loss.item(), torch.cat([p.detach().flatten() for p in model.parameters()])))
        (loss_cf, params_cf), (loss_cl, params_cl) = steps
        assert loss_cl == pytest.approx(loss_cf, rel=1e-6), kind
        assert torch.allclose(params_cl, params_cf, rtol=1e-5, atol=1e-6), kind
