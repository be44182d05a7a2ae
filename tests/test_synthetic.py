"""``dataset: synthetic``: the FedProx paper's Synthetic(alpha, beta) (Li et al., MLSys 2020, Sec. 5.1),
generated per client on demand (fedpers/core/synthetic.py, SyntheticFederation in fedpers/core/federation.py).

The generator is checked against the paper's formulas written out here with numpy, its laziness at 100,000
clients, the effect of alpha and beta on the clients' labels, and short runs of FedAvg, pFedKDH and FedEAGD."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from fedpers.core import synthetic
from fedpers.core.errors import ConfigError
from fedpers.core.federation import SyntheticFederation, get_federation, use_client_slice
from fedpers.core.seeds import SYNTHETIC_CLIENT, SYNTHETIC_SIZES, derived_seed
from fedpers.registry.config import build_config, ignored_keys
from fedpers.registry.methods import federation_for, model_kind_of

CPU = torch.device("cpu")


def federation(num_clients: int = 30, *, seed: int = 0, alpha: float = 1.0, beta: float = 1.0, iid: bool = False,
               aux_size: int = 0, val_fraction: float = 0.0) -> SyntheticFederation:
    """A fresh SyntheticFederation (not get_federation's cached one)."""
    return SyntheticFederation(num_clients=num_clients, seed=seed, alpha=alpha, beta=beta, iid=iid, aux_size=aux_size,
                               val_fraction=val_fraction)


def papers_client(seed: int, k: int, n: int, alpha: float, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """Client k's n samples by Sec. 5.1's formulas, in the order the stream (seed, SYNTHETIC_CLIENT, k) draws
    them: u_k ~ N(0, alpha), B_k ~ N(0, beta), W_k ~ N(u_k, 1), b_k ~ N(u_k, 1), v_k ~ N(B_k, 1),
    x ~ N(v_k, diag(j^-1.2)), y = argmax softmax(x W_k + b_k)."""
    rng = np.random.default_rng(derived_seed(seed, SYNTHETIC_CLIENT, k))
    u, big_b = rng.normal(0, alpha), rng.normal(0, beta)
    w, b, v = rng.normal(u, 1, (60, 10)), rng.normal(u, 1, 10), rng.normal(big_b, 1, 60)
    sigma = np.diag([j ** -1.2 for j in range(1, 61)])
    x = v + rng.standard_normal((n, 60)) @ np.sqrt(sigma)
    logits = x @ w + b
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    return x, softmax.argmax(axis=1)


def test_a_client_is_the_papers_formulas_at_its_seed():
    fed = federation(alpha=0.7, beta=0.3, seed=5)
    k = 4
    n = int(fed.sizes[k])
    x, y = papers_client(5, k, n, 0.7, 0.3)
    data = fed.client(k, CPU)
    n_train = int(0.9 * n)
    assert data.train.x.shape == (n_train, 1, 1, 60) and data.test.x.shape == (n - n_train, 1, 1, 60)
    assert data.train.x.dtype == torch.float32 and data.train.y.dtype == torch.int64
    assert np.array_equal(data.train.x.numpy().reshape(-1, 60), x[:n_train].astype(np.float32))
    assert np.array_equal(data.test.x.numpy().reshape(-1, 60), x[n_train:].astype(np.float32))
    assert np.array_equal(data.train.y.numpy(), y[:n_train]) and np.array_equal(data.test.y.numpy(), y[n_train:])
    assert np.allclose(synthetic.feature_variances(), [j ** -1.2 for j in range(1, 61)], rtol=1e-15, atol=0)
    assert synthetic.feature_variances()[0] == 1.0
    assert fed.num_classes == 10 and fed.input_shape == (1, 1, 60)


def test_the_iid_variant_shares_one_model_and_a_zero_input_mean():
    a = synthetic.client_model(0, 3, 1.0, 1.0, iid=True)
    b = synthetic.client_model(0, 8, 1.0, 1.0, iid=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and not a[2].any() and not b[2].any()
    x, y = synthetic.draw_samples(*b[:3], 2000, b[3])
    assert abs(float(x.mean())) < 0.05  # v_k = 0


def test_a_client_is_the_same_in_every_federation_and_clients_differ():
    one, other = federation(seed=2), federation(seed=2)
    first, again = one.client(7, CPU), other.client(7, CPU)
    for a, b in ((first.train, again.train), (first.test, again.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert one.client(7, CPU) is first  # kept, as Federation keeps its last clients
    neighbour = one.client(8, CPU)
    n = min(len(first.train), len(neighbour.train))
    assert not torch.equal(first.train.x[:n], neighbour.train.x[:n])
    assert not torch.equal(federation(seed=3).client(7, CPU).test.x[:3], first.test.x[:3])


def test_the_sizes_are_the_lognormal_draws_of_their_stream_and_the_split_is_90_10():
    fed = federation(1000, seed=4)
    drawn = np.random.default_rng(derived_seed(4, SYNTHETIC_SIZES)).lognormal(4, 2, 1000)
    assert np.array_equal(fed.sizes, np.array([int(v) + 50 for v in drawn]))
    assert fed.sizes.min() >= 50
    train, test = np.array([len(t) for t in fed.partition.train]), np.array([len(t) for t in fed.partition.test])
    assert np.array_equal(train, [int(0.9 * n) for n in fed.sizes]) and np.array_equal(train + test, fed.sizes)
    assert test.min() >= 5
    data = fed.client(11, CPU)
    assert (len(data.train), len(data.test)) == (train[11], test[11]) and data.val is None


def test_a_validation_split_is_cut_from_the_train_split_and_leaves_the_test_split():
    plain, held = federation(seed=1), federation(seed=1, val_fraction=0.2)
    for k in (0, 5):
        a, b = plain.client(k, CPU), held.client(k, CPU)
        n_val = len(held.partition.val[k])
        assert n_val == max(1, int(np.floor(0.2 * len(a.train) + 0.5))) == len(b.val)
        assert len(b.train) + n_val == len(a.train) == len(held.partition.train[k]) + n_val
        assert torch.equal(torch.cat([b.train.x, b.val.x]), a.train.x) and torch.equal(b.test.y, a.test.y)


def test_100000_clients_build_fast_hold_only_sizes_and_generate_one_client_alone(monkeypatch):
    k = 100_000
    started = time.perf_counter()
    fed = federation(k, aux_size=5000)
    assert time.perf_counter() - started < 2.0
    arrays = [v for v in vars(fed).values() if isinstance(v, np.ndarray)]
    arrays += [split.sizes for split in (fed.partition.train, fed.partition.test)]
    assert max(a.size for a in arrays) <= k and sum(a.nbytes for a in arrays) <= 8 * 8 * k
    assert not any(isinstance(v, torch.Tensor) for v in vars(fed).values())
    assert len(fed.partition.train) == k and len(fed.partition.aux) == 5000
    generated: list[int] = []
    real = synthetic.client_model
    monkeypatch.setattr(synthetic, "client_model",
                        lambda seed, client, *rest: generated.append(client) or real(seed, client, *rest))
    data = fed.client(41_234, CPU)
    assert generated == [41_234] and len(data.train) == len(fed.partition.train[41_234])
    assert "_test_clients" not in vars(fed) and "_aux_arrays" not in vars(fed)  # the server's sets: on demand


def test_the_server_sets_are_bounded_for_many_clients():
    fed = federation(1000, aux_size=300)
    assert not fed.test_covers_every_client and federation(100).test_covers_every_client
    clients = synthetic.global_test_clients(1000, 0)
    assert len(clients) == synthetic.GLOBAL_TEST_CLIENTS == 100 and np.all(np.diff(clients) > 0)
    test = fed.test(CPU)
    assert len(test) == fed.global_test_size() == sum(len(fed.partition.test[k]) for k in clients)
    positions = fed.test_positions()
    k = int(clients[3])
    assert torch.equal(test.y[positions[k]], fed.client(k, CPU).test.y)
    assert sum(len(p) for p in positions) == len(test)
    assert sorted(map(int, fed.client_label_counts())) == clients.tolist()
    aux = fed.aux(CPU)
    assert aux.x.shape == (300, 1, 1, 60) and 0 <= int(aux.y.min()) and int(aux.y.max()) < 10
    assert torch.equal(federation(1000, aux_size=300).aux(CPU).x, aux.x)


def test_beta_makes_the_clients_labels_more_heterogeneous_and_alpha_alone_changes_no_label():
    def label_shares(fed: SyntheticFederation) -> np.ndarray:
        counts = np.array([np.bincount(fed.generate(k)["y_train"], minlength=10) for k in range(40)], float)
        return counts / counts.sum(axis=1, keepdims=True)

    def heterogeneity(shares: np.ndarray) -> tuple[float, float]:
        """(mean share of a client's most frequent label, mean total variation between two clients)."""
        tv = 0.5 * np.abs(shares[:, None] - shares[None]).sum(axis=-1)
        return float(shares.max(axis=1).mean()), float(tv[np.triu_indices(len(shares), 1)].mean())

    flat = heterogeneity(label_shares(federation(40, alpha=0.0, beta=0.0)))
    hard = heterogeneity(label_shares(federation(40, alpha=1.0, beta=1.0)))
    iid = heterogeneity(label_shares(federation(40, iid=True)))
    assert hard[0] > flat[0] + 0.05 and hard[1] > flat[1] > iid[1] + 0.5  # measured: 0.850/0.896, 0.786/0.883
    # alpha shifts all ten logits of a sample by the same u_k (sum(x) + 1): Synthetic(0, 1) and (1, 1) agree
    without, with_alpha = federation(alpha=0.0), federation(alpha=1.0)
    for k in range(5):
        assert np.array_equal(without.generate(k)["y_train"], with_alpha.generate(k)["y_train"])


def test_bad_synthetic_settings_are_one_line_naming_the_key():
    with pytest.raises(ConfigError, match="config key 'synthetic_alpha': must be >= 0"):
        build_config({"dataset": "synthetic", "synthetic_alpha": -0.5})
    with pytest.raises(ConfigError, match="config key 'synthetic_beta'"):
        build_config({"dataset": "synthetic", "synthetic_beta": -1})
    with pytest.raises(ConfigError, match="config key 'partition'.*synthetic_iid=true"):
        build_config({"dataset": "synthetic", "partition": "iid"})
    jdfl = build_config({"dataset": "synthetic", "method": "fedavg", "jdfl": "graded"})
    with pytest.raises(ConfigError, match="config key 'jdfl_layers'.*model mlp"):
        federation_for(jdfl)
    with pytest.raises(ConfigError, match="config key 'model_kind'.*residual_mlp"):
        federation_for(build_config({"dataset": "synthetic", "method": "fedeagd", "model_kind": "mlp"}))


def test_the_default_model_on_synthetic_data_is_an_mlp_and_the_split_keys_are_not_read():
    assert model_kind_of(build_config({"dataset": "synthetic", "method": "fedavg"})) == "mlp"
    assert model_kind_of(build_config({"dataset": "synthetic", "method": "fedeagd"})) == "residual_mlp"
    assert model_kind_of(build_config({"dataset": "digits", "method": "fedeagd"})) == "se_cnn"
    assert model_kind_of(build_config({"dataset": "synthetic", "model_kind": "gn_cnn"})) == "gn_cnn"
    cfg = build_config({"dataset": "synthetic", "alpha": 0.5, "method": "fedavg"})
    assert ignored_keys(cfg, ["alpha", "synthetic_beta"]) == ["alpha (datasets other than synthetic)"]
    mnist = build_config({"dataset": "mnist", "synthetic_alpha": 0.5, "method": "fedavg"})
    assert ignored_keys(mnist, ["synthetic_alpha", "alpha"]) == ["synthetic_alpha (dataset synthetic)"]


def test_a_deployed_client_generates_its_data_and_leaves_no_slice(tmp_path):
    cfg = build_config({"dataset": "synthetic", "num_clients": 20, "method": "fedavg"})
    with use_client_slice(cfg, 3, str(tmp_path)):
        fed = get_federation(cfg)
        assert isinstance(fed, SyntheticFederation) and len(fed.client(3, CPU).train) == len(fed.partition.train[3])
    assert not list(tmp_path.rglob("*.npz"))


def test_fedavg_pfedkdh_and_fedeagd_run_and_fedavg_learns(tmp_path):
    from fedpers.apps.inprocess import run_in_process
    from fedpers.core.results import read_metrics, read_summary

    # batches of 256: client 27 of seed 0 holds 26,040 training samples (the sizes' long tail)
    base = dict(dataset="synthetic", num_clients=50, rounds=3, feature_dim=32, device="cpu", local_epochs=1,
                batch_size=256, lr=0.1, aux_size=500)
    for method in ("fedavg", "pfedkdh", "fedeagd"):
        out = tmp_path / method
        run_in_process(build_config({**base, "method": method, "out_dir": str(out)}))
        rounds, summary = read_metrics(out), read_summary(out)
        assert [r["round"] for r in rounds] == [1, 2, 3] and len(summary["client_train_sizes"]) == 50
        assert 0.0 <= summary["final"]["personalized_macro_acc"] <= 1.0
        with np.load(out / "partition.npz") as saved:
            assert np.array_equal(saved["train_sizes"], summary["client_train_sizes"])
        if method == "fedavg":
            test = get_federation(build_config({**base, "method": method})).test(CPU)
            majority = np.bincount(test.y.numpy(), minlength=10).max() / len(test)  # 0.651 at seed 0
            accuracies = [r["global_acc"] for r in rounds]
            assert accuracies[-1] > majority + 0.05 and accuracies[-1] > accuracies[0]
