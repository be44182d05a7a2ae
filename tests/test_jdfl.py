"""JDFL: targets, class-only decoding, discovery, domain data, composition, and end-to-end runs
of every base optimizer with JDFL in Ray simulation (a tiny two-domain digits set: original vs inverted)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedpers.algorithms.jdfl import (adjusted_rand_index, centroid_similarity_weights, class_of_joint,
                                     class_only_accuracy, class_only_predictions, default_alpha,
                                     discover_domains, elbow_choice, graded_domain_row, graded_targets,
                                     hard_domain_row, joint_head_use, joint_index,
                                     pseudo_domain_of_each_domain, random_targets, soft_target_loss,
                                     targets_from_domain_row)
from fedpers.registry.config import build_config
from fedpers.core.data import load_digits_domains, load_npz
from fedpers.core.domains import domain_client_map, domain_partition
from fedpers.core.errors import ConfigError, DataError
from fedpers.core.federation import get_federation
from fedpers.core.models import array_shapes, build_model, layer_subset_names
from fedpers.registry.methods import JDFL_BASES, client_class_for, strategy_class_for
from fedpers.core.wire import float_row
from tests.conftest import make_context as context, tiny_overrides

C = 3


def domain_overrides(**extra):
    base = tiny_overrides(dataset="digits_domains", partition="domain", aux_size=0, num_clients=4,
                          model_kind="gn_cnn", feature_dim=32)
    base.update(extra)
    return base



# --- targets --------------------------------------------------------------------------------------------


def test_joint_index_and_class_only_decoding():
    assert joint_index(0, 2, C) == 2 and joint_index(2, 1, C) == 7
    assert class_of_joint(7, C) == 1 and class_of_joint(np.arange(9), C).tolist() == [0, 1, 2] * 3
    logits = torch.full((3, 2 * C), -5.0)
    logits[0, joint_index(1, 2, C)] = 3.0  # class 2 via pseudo-domain 1
    logits[1, joint_index(0, 0, C)] = 3.0
    logits[2, joint_index(1, 1, C)] = 3.0
    assert class_only_predictions(logits, C).tolist() == [2, 0, 1]
    assert class_only_accuracy(logits, torch.tensor([2, 0, 0]), C) == pytest.approx(2 / 3)
    # equals argmax over classes of the per-class max over the M units; M = 1 is plain argmax
    rnd = torch.randn(50, 4 * C)
    per_class_max = rnd.view(50, 4, C).max(dim=1).values.argmax(dim=1)
    assert torch.equal(class_only_predictions(rnd, C), per_class_max)
    plain = torch.randn(20, C)
    assert torch.equal(class_only_predictions(plain, C), plain.argmax(dim=1))


def test_graded_targets_toy_example():
    centroids = np.array([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    w = centroid_similarity_weights(centroids, tau=0.1)
    assert np.allclose(w.sum(axis=1), 1.0) and np.allclose(np.diag(w), 0.0)
    unit = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
    s = unit @ unit.T
    manual = np.exp(s[0, 1:] / 0.1) / np.exp(s[0, 1:] / 0.1).sum()
    assert np.allclose(w[0, 1:], manual)
    alpha = 0.45
    y = torch.tensor([2, 0])
    t = graded_targets(y, 0, w, alpha, C)
    assert t.shape == (2, 4 * C)
    assert torch.allclose(t.sum(dim=1), torch.ones(2, dtype=t.dtype))
    assert t[0, joint_index(0, 2, C)] == pytest.approx(alpha)
    for d in range(1, 4):
        assert t[0, joint_index(d, 2, C)] == pytest.approx((1 - alpha) * w[0, d])
    # all mass on the true class; the similar domain 1 gets far more than the distant ones
    assert t[0].view(4, C)[:, [0, 1]].sum() == 0
    assert t[0, joint_index(1, 2, C)] > 0.5 and t[0, joint_index(3, 2, C)] < 0.01


def test_m_equal_one_reduces_to_one_hot():
    y = torch.tensor([0, 2, 1])
    one_hot = F.one_hot(y, C).float()
    w = centroid_similarity_weights(np.ones((1, 5)), tau=0.1)
    assert np.array_equal(graded_domain_row(0, w, 0.55), [1.0])
    assert torch.equal(graded_targets(y, 0, w, 0.55, C), one_hot)
    assert torch.equal(random_targets(y, 1, 0.7, C), one_hot)
    logits = torch.randn(3, C)
    assert soft_target_loss(logits, one_hot).item() == pytest.approx(F.cross_entropy(logits, y).item(), abs=1e-6)


def test_random_and_hard_targets():
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(C, (400,), generator=gen)
    t = random_targets(y, 4, 1.0, C, gen)
    assert torch.allclose(t.sum(dim=1), torch.ones(400))
    hot = t.argmax(dim=1)
    assert torch.equal(class_of_joint(hot, C), y) and torch.all(t.max(dim=1).values == 1.0)
    counts = torch.bincount(hot // C, minlength=4)
    assert counts.min() > 60  # the drawn pseudo-domain is uniform over the 4
    t = random_targets(y, 4, 0.7, C, gen)
    assert torch.allclose(t.sum(dim=1), torch.ones(400))
    assert torch.allclose(t.max(dim=1).values, torch.full((400,), 0.7))
    assert torch.allclose(t.view(400, 4, C).sum(dim=1), F.one_hot(y, C).float())  # all mass on the true class
    row = torch.as_tensor(hard_domain_row(2, 4), dtype=torch.float32)
    th = targets_from_domain_row(y[:5], row, C)
    assert torch.equal(th.argmax(dim=1), joint_index(2, y[:5], C)) and torch.all(th.sum(dim=1) == 1)


def test_soft_target_loss_is_kl():
    t = torch.tensor([[0.5, 0.0, 0.5, 0.0]])
    logits = torch.log(torch.tensor([[0.5, 1e-9, 0.5, 1e-9]]))
    assert soft_target_loss(logits, t).item() == pytest.approx(0.0, abs=1e-6)
    other = torch.zeros(1, 4)
    expected = (0.5 * np.log(0.5 / 0.25)) * 2
    assert soft_target_loss(other, t).item() == pytest.approx(expected, rel=1e-5)


def test_joint_head_use_on_two_samples_worked_by_hand():
    """M = 2, C = 2 (unit j = d*C + c). Sample 0: unit (0, 0) wins alone; sample 1: unit (0, 1) wins at 2.0,
    but class 0's two units at 1.9 outweigh it in the marginal, so the two decodings disagree there."""
    logits = torch.tensor([[2.0, 0.0, 0.0, 1.0], [1.9, 2.0, 1.9, 0.0]])
    y = torch.tensor([0, 0])
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])  # rows (0,0), (0,1), (1,0), (1,1)
    use = joint_head_use(logits, y, head, 2, np.array([0, 1]), {0: 0, 1: 1})
    assert use["M"] == 2
    assert use["class_only_acc"] == 0.5 and use["marginal_acc"] == 1.0 and use["decodings_differ"] == 0.5
    # each predicted class's units hold e^2 and e^0 of the mass: share e^2 / (e^2 + 1)
    assert use["top_share"] == pytest.approx(np.exp(2) / (np.exp(2) + 1), rel=1e-6)
    assert use["unit_cosine"] == pytest.approx((1 + 1 / np.sqrt(2)) / 2, rel=1e-6)
    # both winners lie in block 0: sample 0's own, not sample 1's; by its own block (1: [1.9, 0]) it is right
    assert use["own_block"] == 0.5 and use["own_block_acc"] == 1.0


def test_pseudo_domain_of_each_domain_is_the_majority_cluster():
    assert pseudo_domain_of_each_domain([2, 2, 0, 1, 1], [0, 0, 1, 1, 1]) == {0: 2, 1: 1}
    assert pseudo_domain_of_each_domain([1, 0], [0, 0]) == {0: 0}  # a tie: the smaller id


def test_default_alpha_follows_the_paper():
    assert default_alpha(2) == 0.55 and default_alpha(5) == 0.55 and default_alpha(6) == 0.45


# --- discovery -------------------------------------------------------------------------------------------


def planted(num_clusters: int, per_cluster: int, dim: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(num_clusters, dim)) * 5
    labels = np.repeat(np.arange(num_clusters), per_cluster)
    scale = rng.uniform(0.5, 3.0, size=(len(labels), 1))  # norms differ: normalisation must remove them
    x = (centers[labels] + rng.normal(scale=0.3, size=(len(labels), dim))) * scale
    perm = rng.permutation(len(labels))
    return x[perm], labels[perm]


@pytest.mark.parametrize("select", ["elbow", "silhouette"])
def test_kmeans_recovers_planted_clusters(select):
    x, labels = planted(4, 5)
    found = discover_domains(x, select=select, max_domains=8)
    assert found.num_domains == 4 and found.criterion == select
    assert adjusted_rand_index(labels, found.assignments) == pytest.approx(1.0)
    assert found.centroids.shape == (4, x.shape[1])
    fixed = discover_domains(x, num_domains=4)
    assert fixed.criterion == "fixed" and adjusted_rand_index(labels, fixed.assignments) == pytest.approx(1.0)


def test_elbow_rule():
    assert elbow_choice({1: 10.0, 2: 2.0, 3: 1.5, 4: 1.2, 5: 1.0}) == 2
    assert elbow_choice({1: 1.0, 2: 1.0, 3: 1.0}) == 1  # flat: one domain
    x, _ = planted(1, 6)
    assert discover_domains(x, select="elbow").num_domains <= 2


# --- data -----------------------------------------------------------------------------------------------


def test_domain_partition_gives_each_client_one_domain():
    y_tr = np.tile(np.arange(3), 40)
    d_tr = np.repeat([0, 1], 60)
    y_te = np.tile(np.arange(3), 10)
    d_te = np.repeat([0, 1], 15)
    split = domain_partition(y_tr, y_te, d_tr, d_te, num_clients=5, seed=1)
    assert domain_client_map(2, 5) == [0, 1, 0, 1, 0]
    for k in range(5):
        assert set(d_tr[split.train[k]]) == {k % 2} and set(d_te[split.test[k]]) == {k % 2}
    all_train = np.concatenate(split.train)
    assert len(all_train) == len(np.unique(all_train)) == 120
    assert sorted(np.concatenate(split.test).tolist()) == list(range(30))
    sizes = [len(split.train[k]) for k in (0, 2, 4)]
    assert max(sizes) - min(sizes) <= 3  # a domain is cut evenly among its clients
    with pytest.raises(DataError, match="num_clients >= the 2 domains"):
        domain_partition(y_tr, y_te, d_tr, d_te, num_clients=1)
    with pytest.raises(DataError, match="domain ids"):
        domain_partition(y_tr, y_te, None, None, num_clients=2)


def test_npz_domain_arrays_and_digits_domains(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "multi.npz"
    np.savez(path, x_train=rng.integers(0, 255, (20, 8, 8, 3), dtype=np.uint8), y_train=np.arange(20) % 2,
             x_test=rng.integers(0, 255, (6, 8, 8, 3), dtype=np.uint8), y_test=np.arange(6) % 2,
             d_train=np.arange(20) % 4, d_test=np.arange(6) % 4, domain_names=np.array(["a", "b", "c", "d"]))
    ds = load_npz(path)
    assert ds.d_train.tolist() == (np.arange(20) % 4).tolist() and ds.domain_names == ("a", "b", "c", "d")
    assert ds.num_domains == 4
    digits = load_digits_domains()
    assert digits.num_domains == 2 and set(digits.d_test.tolist()) == {0, 1}
    x0 = digits.x_train[digits.d_train == 0].mean()
    x1 = digits.x_train[digits.d_train == 1].mean()
    assert x1 > x0  # inverted images are brighter on average


def test_gn_cnn_and_layer_subsets():
    model = build_model((3, 64, 64), 7, feature_dim=32, kind="gn_cnn")
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 7)
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())
    last = layer_subset_names(model, "last_conv_head")
    assert last == ["backbone.2.0.weight", "backbone.2.0.bias", "backbone.2.1.weight", "backbone.2.1.bias",
                    "head.weight", "head.bias"]
    assert layer_subset_names(model, "head") == ["head.weight", "head.bias"]
    assert len(layer_subset_names(model, "last_two_conv_head")) == 10
    small = build_model((1, 8, 8), 10, feature_dim=16, kind="gn_cnn")
    assert small(torch.zeros(1, 1, 8, 8)).shape == (1, 10)


# --- composition and server-side phases ---------------------------------------------------------------------


def test_config_and_registry_compose_jdfl_with_a_base():
    cfg = build_config(domain_overrides(method="scaffold", jdfl="graded"))
    s_cls, c_cls = strategy_class_for(cfg), client_class_for(cfg)
    from clients.scaffold import ScaffoldClient
    from strategies.scaffold import ScaffoldStrategy

    assert issubclass(s_cls, ScaffoldStrategy) and issubclass(c_cls, ScaffoldClient)
    assert s_cls.__name__ == "JDFLScaffoldStrategy" and strategy_class_for(cfg) is s_cls  # cached
    off = build_config(domain_overrides(method="scaffold"))
    assert strategy_class_for(off) is ScaffoldStrategy
    assert set(JDFL_BASES) >= {"fedavg", "scaffold", "feddyn", "feddc", "fedproc"}
    with pytest.raises(ConfigError, match="config key 'jdfl': JDFL wraps only fedavg, scaffold, .*not method 'fedper'"):
        build_config(domain_overrides(method="fedper", jdfl="graded"))
    with pytest.raises(ConfigError, match="jdfl"):
        build_config(domain_overrides(jdfl="soft"))


def test_discovery_round_expands_head_and_optimizer_state():
    """Phase 1 by hand (client discovery messages + the server's clustering) and Phase 2's shapes."""
    cfg = build_config(domain_overrides(method="scaffold", jdfl="graded", jdfl_m=0))
    fed = get_federation(cfg)
    strategy = strategy_class_for(cfg)(cfg, fed)
    client_cls = client_class_for(cfg)
    theta0 = strategy.download_arrays()[:len(array_shapes(strategy.model, "all"))]
    ctxs = [context(p, 4) for p in range(4)]
    vectors = []
    for p in range(4):
        up, n, _ = client_cls(cfg, ctxs[p]).fit(theta0, {"server_round": 0, "jdfl_phase": "discovery"})
        assert [a.shape for a in up] == [tuple(strategy.model.state_dict()[k].shape)
                                         for k in layer_subset_names(strategy.model, "last_conv_head")]
        vectors.append(np.concatenate([a.ravel() for a in up]))
    found = discover_domains(np.stack(vectors), select="elbow", max_domains=4)
    assert found.num_domains == 2
    assert adjusted_rand_index(fed.client_domains(), found.assignments) == pytest.approx(1.0)
    strategy.install_discovery(found.num_domains, dict(enumerate(found.assignments)), found.centroids)
    assert strategy.model.head.out_features == 2 * 10 and strategy.jdfl_info["ari"] == pytest.approx(1.0)
    expanded = array_shapes(strategy.model, "all")
    assert strategy.upload_section_shapes() == {"model": expanded, "control_delta": expanded}  # model + Delta c
    assert strategy.server_state[-2].shape == (20, 32)  # c follows the expanded head
    z0 = found.assignments[0]
    assert strategy.client_rows[0][z0] == pytest.approx(0.55) and strategy.client_rows[0].sum() == pytest.approx(1)
    params = strategy.download_arrays()
    up, _, _ = client_cls(cfg, ctxs[0]).fit(params, strategy.message_config(1, jdfl_m=2,
                                                                             jdfl_row=float_row(strategy.client_rows[0])))
    assert [a.shape for a in up] == 2 * expanded
    _, _, metrics = client_cls(cfg, ctxs[1]).evaluate(params, strategy.message_config(1))
    assert 0.0 <= metrics["acc"] <= 1.0


# --- end to end: once in Ray simulation, over the other optimizers in-process -----------------------------
# The in-process engine runs the same server_fn, round loop and clients (tests/test_simulation.py checks that
# it gives the Ray simulation's numbers); Ray would add its start-up to every case.

E2E = [("fedavg", "graded", "ray"), ("scaffold", "random", "inprocess"), ("feddyn", "graded", "inprocess"),
       ("feddc", "random", "inprocess"), ("fedproc", "graded", "inprocess"), ("moon", "random", "inprocess"),
       ("fedavg", "hard", "inprocess")]


@pytest.mark.simulation
@pytest.mark.parametrize("method,mode,engine", E2E)
def test_jdfl_runs_end_to_end(method, mode, engine, tmp_path):
    from fedpers.core.results import read_metrics, read_summary
    from fedpers.apps.inprocess import run_in_process
    from fedpers.apps.simulation import run_simulation

    cfg = build_config(domain_overrides(method=method, jdfl=mode, num_clients=3, fraction_fit=0.67,
                                        out_dir=str(tmp_path), jdfl_discovery_epochs=1))
    {"ray": run_simulation, "inprocess": run_in_process}[engine](cfg)
    rounds = read_metrics(tmp_path)
    summary = read_summary(tmp_path)
    assert [r["round"] for r in rounds] == [1, 2]
    assert rounds[0]["jdfl_M"] == summary["jdfl"]["M"] >= 1
    assert summary["jdfl"]["true_domains"] == [0, 1, 0] and summary["jdfl"]["ari"] is not None
    for r in rounds:
        assert r["rejected_updates"] == 0 and r["failed_clients"] == 0 and len(r["fit_clients"]) == 2
        assert 0.0 <= r["global_acc"] <= 1.0
        assert {"global_acc_domain_original", "global_acc_domain_inverted"} <= set(r)
        assert set(r["per_client_acc"]) == {"0", "1", "2"}
    assert summary["final"]["global_acc"] is not None and summary["config"]["jdfl"] == mode
