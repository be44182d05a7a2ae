"""Partitioning: determinism, disjointness, skew strength, and the small-client rule."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpers.core.data import load_digits_dataset
from fedpers.core.errors import DataError
from fedpers.core.partition import make_partition


@pytest.fixture(scope="module")
def digits():
    return load_digits_dataset()


def label_skew(part, y_train, num_classes):
    """Mean total-variation distance between each client's label distribution and the global one."""
    global_dist = np.bincount(y_train, minlength=num_classes) / len(y_train)
    tvs = [0.5 * np.abs(np.bincount(y_train[t], minlength=num_classes) / len(t) - global_dist).sum()
           for t in part.train]
    return float(np.mean(tvs))


def test_deterministic_in_seed(digits):
    kw = dict(num_clients=8, scheme="dirichlet", alpha=0.3, aux_size=50)
    a = make_partition(digits.y_train, digits.y_test, seed=1, **kw)
    b = make_partition(digits.y_train, digits.y_test, seed=1, **kw)
    c = make_partition(digits.y_train, digits.y_test, seed=2, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a.train + a.test + (a.aux,), b.train + b.test + (b.aux,)))
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, c.train))


@settings(max_examples=25, deadline=None)
@given(num_clients=st.integers(2, 12), alpha=st.sampled_from([0.1, 0.5, 2.0, 100.0]),
       scheme=st.sampled_from(["dirichlet", "iid", "pathological"]), aux=st.integers(0, 300),
       seed=st.integers(0, 10_000))
def test_clients_disjoint_from_each_other_aux_and_cover_the_pool(num_clients, alpha, scheme, aux, seed):
    d = load_digits_dataset()
    p = make_partition(d.y_train, d.y_test, num_clients=num_clients, scheme=scheme, alpha=alpha,
                       classes_per_client=3, aux_size=aux, seed=seed, min_samples_per_client=2)
    train = np.concatenate(p.train)
    assert len(np.unique(train)) == len(train)  # no sample on two clients
    assert np.intersect1d(train, p.aux).size == 0  # Ds disjoint from every client
    assert len(p.aux) == aux
    assert np.array_equal(np.sort(np.concatenate([train, p.aux])), np.arange(len(d.y_train)))
    test = np.concatenate(p.test)  # test indices live in x_test: disjoint from Ds and train by construction
    assert len(np.unique(test)) == len(test) == len(d.y_test)
    assert all(len(t) >= 1 for t in p.test)


def test_test_split_follows_the_train_label_distribution(digits):
    p = make_partition(digits.y_train, digits.y_test, num_clients=4, scheme="dirichlet", alpha=0.2, seed=0)
    for tr, te in zip(p.train, p.test):
        dtr = np.bincount(digits.y_train[tr], minlength=10) / len(tr)
        dte = np.bincount(digits.y_test[te], minlength=10) / len(te)
        assert 0.5 * np.abs(dtr - dte).sum() < 0.15


def test_label_skew_grows_as_alpha_falls(digits):
    skews = []
    for alpha in (100.0, 0.5, 0.05):
        vals = [label_skew(make_partition(digits.y_train, digits.y_test, num_clients=5, scheme="dirichlet",
                                          alpha=alpha, seed=s), digits.y_train, 10) for s in range(3)]
        skews.append(np.mean(vals))
    assert skews[0] < skews[1] < skews[2]
    iid = make_partition(digits.y_train, digits.y_test, num_clients=5, scheme="iid", seed=0)
    assert label_skew(iid, digits.y_train, 10) < 0.05


def test_pathological_gives_k_classes(digits):
    p = make_partition(digits.y_train, digits.y_test, num_clients=5, scheme="pathological",
                       classes_per_client=2, seed=0)
    for t in p.train:
        assert len(np.unique(digits.y_train[t])) == 2


def test_small_alpha_many_clients_respects_minimum_or_fails_clearly(digits):
    p = make_partition(digits.y_train, digits.y_test, num_clients=20, scheme="dirichlet", alpha=0.05,
                       seed=0, min_samples_per_client=10)
    assert min(len(t) for t in p.train) >= 10
    with pytest.raises(DataError, match="raise alpha"):
        make_partition(digits.y_train, digits.y_test, num_clients=140, scheme="dirichlet", alpha=0.05,
                       seed=0, min_samples_per_client=10)


def test_impossible_requests_are_clear_errors(digits):
    with pytest.raises(DataError, match="num_clients=5000 exceeds"):
        make_partition(digits.y_train, digits.y_test, num_clients=5000, scheme="iid")
    with pytest.raises(DataError, match="aux_size"):
        make_partition(digits.y_train, digits.y_test, num_clients=2, scheme="iid", aux_size=10**6)
    with pytest.raises(DataError, match="classes_per_client"):
        make_partition(digits.y_train, digits.y_test, num_clients=2, scheme="pathological", classes_per_client=11)


def test_only_a_clients_own_samples_are_moved_to_the_device():
    """A client actor copies to its device the samples of the clients it serves, never the dataset
    (the 'meta' device stands in for a GPU: it records shapes without holding data)."""
    import torch

    from fedpers.registry.config import build_config
    from fedpers.core.federation import Federation, get_federation

    fed = get_federation(build_config({"dataset": "digits", "num_clients": 4, "aux_size": 100, "alpha": 1.0}))
    fresh = Federation(fed.dataset, fed.partition)
    data = fresh.client(2, torch.device("meta"))
    assert data.train.x.device.type == "meta" and data.test.y.device.type == "meta"
    assert len(data.train) == len(fed.partition.train[2]) and len(data.test) == len(fed.partition.test[2])
    on_device = [s for c in fresh._clients.values() for s in (c.train, c.test) if s.x.device.type == "meta"]
    assert sum(len(s) for s in on_device) == len(fed.partition.train[2]) + len(fed.partition.test[2])
    assert not fresh._on_device  # no server split was built for a client
    cpu = fresh.client(2, torch.device("cpu"))
    assert torch.equal(cpu.train.y, torch.as_tensor(fed.dataset.y_train[fed.partition.train[2]]))


def test_an_actor_keeps_only_the_clients_it_served_last(monkeypatch):
    """Federation.client keeps CLIENTS_KEPT clients' splits, least recently served out first: a
    10,000-client run's actor does not grow to a copy of the dataset."""
    import torch

    from fedpers.core import federation as federation_module
    from fedpers.core.federation import Federation, get_federation
    from fedpers.registry.config import build_config

    monkeypatch.setattr(federation_module, "CLIENTS_KEPT", 2)
    fed = get_federation(build_config({"dataset": "digits", "num_clients": 4, "aux_size": 100, "alpha": 1.0}))
    fresh = Federation(fed.dataset, fed.partition)
    cpu = torch.device("cpu")
    first = fresh.client(0, cpu)
    fresh.client(1, cpu)
    assert fresh.client(0, cpu) is first  # kept, and now the most recent
    fresh.client(2, cpu)  # evicts client 1, the least recent
    assert [pid for pid, _ in fresh._clients] == [0, 2]
    again = fresh.client(1, cpu)
    assert [pid for pid, _ in fresh._clients] == [2, 1]
    assert torch.equal(again.train.y, torch.as_tensor(fed.dataset.y_train[fed.partition.train[1]]))


def test_iid_deals_every_class_evenly_even_with_one_test_sample_per_client():
    """IID with as many clients as test samples: everyone gets exactly one test sample, and each client's
    count of every class is floor or ceil of n_c / K (the old 1/K-per-class cut left clients empty)."""
    rng = np.random.default_rng(0)
    y_train, y_test = rng.integers(0, 4, size=1000), rng.integers(0, 4, size=40)
    p = make_partition(y_train, y_test, num_clients=40, scheme="iid", seed=3)
    assert [len(t) for t in p.test] == [1] * 40
    assert sorted(np.concatenate(p.train).tolist()) == list(range(1000))
    for c in range(4):
        n_c = int((y_train == c).sum())
        counts = [int((y_train[t] == c).sum()) for t in p.train]
        assert set(counts) <= {n_c // 40, -(-n_c // 40)}
    again = make_partition(y_train, y_test, num_clients=40, scheme="iid", seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(p.train, again.train))
