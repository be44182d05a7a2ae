"""Personalized baselines FedProto, pFedSim, FedAS, FedFed: their math (fedpers/algorithms/) on
small tensors, their clients' and strategies' defining computations without a Flower run, per-client
state, config keys and ready configs. End-to-end runs are in test_simulation.py (parametrized over the
registry)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from torch import nn

from clients.fedas import FedASClient
from clients.fedfed import DISTILLER_STATE, SHARED_FLAG, FedFedClient
from clients.fedproto import FedProtoClient
from clients.pfedsim import LOCAL_STATE as PFEDSIM_STATE, PFedSimClient
from fedpers.algorithms.fedas import align_backbone, fedas_alignment_loss, fisher_trace, fisher_weights
from fedpers.algorithms.fedfed import FeatureDistiller, fedfed_distill_loss, sensitive_features, distill_rounds
from fedpers.algorithms.fedproto import fedproto_loss, nearest_prototype
from fedpers.algorithms.pfedsim import classifier_similarity, pfedsim_weights, warmup_rounds
from fedpers.algorithms.prototypes import aggregate_prototypes, class_prototypes
from fedpers.registry.config import all_keys, build_config
from fedpers.core.errors import ConfigError
from fedpers.core.federation import get_federation
from fedpers.core.models import array_shapes, build_model, get_arrays, parameter_names
from fedpers.registry.methods import METHODS
from fedpers.core.wire import join_sections
from strategies.base import FedPersStrategy, Upload, parameters_nbytes
from tests.conftest import TinyNet, arrays_equal, make_context, tiny_overrides, toy_data

METHODS_MORE = ("fedproto", "pfedsim", "fedas", "fedfed")



def tiny_cfg(method: str, **extra):
    return build_config(tiny_overrides(method=method, **extra))


def make_strategy(cfg) -> FedPersStrategy:
    return METHODS[cfg.method].strategy_class()(cfg, get_federation(cfg))




class FakeProxy:
    def __init__(self, cid):
        self.cid = cid


def fit_res(arrays, n, metrics=None):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, dict(metrics or {}))


# --- FedProto -----------------------------------------------------------------------------------------
def test_class_prototypes_are_class_means_with_counts():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    protos, counts = class_prototypes(feats, torch.tensor([0, 0, 2]), 4)
    np.testing.assert_allclose(protos, [[2.0, 1.0], [0, 0], [5.0, 5.0], [0, 0]])
    np.testing.assert_array_equal(counts, [2, 0, 1, 0])
    assert protos.dtype == np.float32 and counts.dtype == np.float32


def test_fedproto_server_average_is_count_weighted_per_class():
    a = (np.array([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]], np.float32), np.array([3, 1, 0], np.float32))
    b = (np.array([[4.0, 8.0], [5.0, 5.0], [9.0, 9.0]], np.float32), np.array([1, 3, 0], np.float32))
    protos, mask = aggregate_prototypes([a, b])
    np.testing.assert_allclose(protos[0], [1.0, 2.0])  # (3*0 + 1*4)/4, (3*0 + 1*8)/4
    np.testing.assert_allclose(protos[1], [4.0, 4.0])  # (1*1 + 3*5)/4
    np.testing.assert_allclose(protos[2], [0.0, 0.0])  # nobody holds class 2
    np.testing.assert_array_equal(mask, [1, 1, 0])


def test_fedproto_inference_picks_the_nearest_available_prototype():
    protos = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    feats = torch.tensor([[1.0, 1.0], [9.0, 1.0], [1.0, 8.0], [0.0, 9.0]])
    assert nearest_prototype(feats, protos, torch.tensor([True, True, True])).tolist() == [0, 1, 2, 2]
    # class 2 has no prototype: its samples go to the nearest available class
    assert nearest_prototype(feats, protos, torch.tensor([True, True, False])).tolist() == [0, 1, 0, 0]


def test_fedproto_loss_is_ce_plus_lambda_mse_to_the_class_prototype():
    logits = torch.randn(4, 3)
    feats = torch.randn(4, 2, requires_grad=True)
    y = torch.tensor([0, 1, 2, 1])
    protos = torch.randn(3, 2)
    allc = torch.tensor([True, True, True])
    expected = F.cross_entropy(logits, y) + 0.5 * ((feats - protos[y]) ** 2).mean()
    assert torch.allclose(fedproto_loss(logits, feats, y, protos, allc, 0.5), expected)
    none = torch.tensor([False, False, False])
    assert torch.allclose(fedproto_loss(logits, feats, y, protos, none, 0.5), F.cross_entropy(logits, y))
    part = torch.tensor([True, False, False])  # only sample 0 (class 0) is regularised
    expected = F.cross_entropy(logits, y) + 2.0 * ((feats[0] - protos[0]) ** 2).mean()
    assert torch.allclose(fedproto_loss(logits, feats, y, protos, part, 2.0), expected)


def test_fedproto_server_bounds_inflated_class_counts():
    strategy = make_strategy(tiny_cfg("fedproto"))
    [(c, d)] = strategy.upload_section_shapes()["class_prototypes"]
    honest = [np.zeros((c, d), np.float32), np.zeros(c, np.float32)]
    honest[1][0] = 10
    liar = [np.ones((c, d), np.float32), np.zeros(c, np.float32)]
    liar[1][0] = 1e6  # claims a million class-0 samples but reports 10 examples
    uploads = {pid: Upload([], 10, {"class_prototypes": [p], "class_counts": [k]})
               for pid, (p, k) in enumerate([honest, liar])}
    protos, _ = strategy.aggregate(1, uploads)
    np.testing.assert_allclose(protos[0], 0.5)  # both weigh 10


def test_fedproto_round_trip_uploads_prototypes_and_keeps_the_model():
    cfg = tiny_cfg("fedproto")
    strategy = make_strategy(cfg)
    c, d = get_federation(cfg).num_classes, cfg.feature_dim
    down = strategy.download_arrays()
    assert [a.shape for a in down] == [(c, d), (c,)] and not down[1].any()
    contexts = [make_context(p, cfg.num_clients) for p in range(2)]
    ups = []
    for pid, ctx in enumerate(contexts):
        up, n, m = FedProtoClient(cfg, ctx).fit(down, strategy.message_config(1))
        assert [a.shape for a in up] == [(c, d), (c,)] and up[1].sum() == n  # counts = class histogram
        assert m["arrays:class_prototypes"] == m["arrays:class_counts"] == 1 and "arrays:model" not in m
        ups.append((up, n))
    uploads = {pid: Upload([], n, {"class_prototypes": [up[0]], "class_counts": [up[1]]})
               for pid, (up, n) in enumerate(ups)}
    strategy.apply_aggregate(1, strategy.aggregate(1, uploads))
    protos, mask = strategy.download_arrays()
    expected, _ = aggregate_prototypes([(u[0], u[1]) for u, _ in ups])
    np.testing.assert_allclose(protos, expected)
    assert mask.any()
    # the model never leaves the client; it survives an evaluation with new prototypes
    saved = contexts[0].state["fedpers.personal"].to_numpy_ndarrays()
    client = FedProtoClient(cfg, contexts[0])
    _, _, em = client.evaluate([protos, mask], strategy.message_config(1))
    assert arrays_equal(get_arrays(client.model, "all"), saved)
    assert {"acc", "acc_local", "acc_head"} <= set(em) and 0 <= em["acc"] <= 1
    assert strategy.has_global_model is False


# --- pFedSim ------------------------------------------------------------------------------------------
def test_classifier_similarity():
    w = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert classifier_similarity(w, w) == pytest.approx(1.0)
    assert classifier_similarity(w, -w) == 0.0  # floored at 0
    assert classifier_similarity(w, np.array([[1.0, 0.0], [1.0, 0.0]])) == pytest.approx(0.5)


def test_pfedsim_weights_favour_the_most_similar_client_and_sum_to_one():
    row = np.array([1.0, 0.9, 0.3, 0.0])
    w = pfedsim_weights(row, 0)
    assert w.sum() == pytest.approx(1.0) and np.all(w >= 0)
    assert w[0] > w[1] > w[2] > w[3] == 0.0  # self, then by similarity; dissimilar clients get nothing
    np.testing.assert_allclose(w[1] / w[2], np.log(1 - 0.9) / np.log(1 - 0.3))  # -log(1 - s)
    np.testing.assert_array_equal(pfedsim_weights(np.array([0.0, 1.0, 0.0]), 1), [0.0, 1.0, 0.0])  # no similarity yet


def test_pfedsim_server_sends_each_client_its_own_similarity_weighted_model():
    cfg = tiny_cfg("pfedsim", rounds=4, pfedsim_warmup=0.5)
    assert warmup_rounds(cfg) == 2
    strategy = make_strategy(cfg)
    strategy.book.start()
    strategy.frozen = get_arrays(strategy.model, "all")
    rng = np.random.default_rng(0)
    models = {p: [a + rng.normal(0, 0.1, a.shape).astype(a.dtype) for a in strategy.frozen] for p in range(3)}
    # clients 0 and 1 have the same classifier, client 2 a different one
    h = strategy.head_weight_index
    models[1][h] = models[0][h].copy()
    models[2][h] = -models[0][h]
    strategy.aggregate(3, {p: Upload(models[p], 10, {}) for p in range(3)})  # keyed by the client that sent it
    assert strategy.similarity[0, 1] == pytest.approx(1.0, abs=1e-6) and strategy.similarity[0, 2] == 0.0
    got = strategy.personalized_arrays(0)
    w = pfedsim_weights(strategy.similarity[0], 0)
    assert w[2] == 0.0 and w[0] > 0 and w[1] > 0
    np.testing.assert_allclose(got[0], w[0] * models[0][0] + w[1] * models[1][0], rtol=1e-5, atol=1e-6)
    assert arrays_equal(strategy.personalized_arrays(2), models[2])  # client 2: only itself
    # per-client FitIns and byte accounting
    strategy.roster.partition_of = {"a": 0, "b": 2}
    pairs = [(FakeProxy("a"), FitIns(ndarrays_to_parameters(strategy.frozen), {"server_round": 4})),
             (FakeProxy("b"), FitIns(ndarrays_to_parameters(strategy.frozen), {"server_round": 4}))]

    out = strategy.per_client_fit(pairs, lambda pid: {"model": strategy.personalized_arrays(pid)})
    sent = [parameters_to_ndarrays(ins.parameters) for _, ins in out]
    assert arrays_equal(sent[1], models[2]) and not arrays_equal(sent[0], sent[1])
    assert strategy.book.current["bytes_down"] == sum(parameters_nbytes(ins.parameters) for _, ins in out)
    assert all(ins.config == {"server_round": 4, "arrays:model": len(models[2])} for _, ins in out)  # own counts


def test_pfedsim_client_keeps_its_classifier_in_the_personalization_phase():
    cfg = tiny_cfg("pfedsim", rounds=2, pfedsim_warmup=0.5)
    strategy = make_strategy(cfg)
    params = get_arrays(strategy.model, "all")
    context = make_context(0, cfg.num_clients)
    _, _, m1 = PFedSimClient(cfg, context).fit(params, {"server_round": 1})  # warm-up: FedAvg, no state
    assert "state_digest" not in m1 and len(context.state) == 0
    up, _, m2 = PFedSimClient(cfg, context).fit(params, {"server_round": 2})
    local = context.state["fedpers." + PFEDSIM_STATE].to_numpy_ndarrays()
    assert arrays_equal(up, local) and "state_digest" in m2
    names = parameter_names(strategy.model, "all")
    other = [a + 0.5 for a in params]  # a new personalized model: its extractor is used, its head is not
    client = PFedSimClient(cfg, context)
    client._round, client._fitting = 3, True
    client.prepare(other)
    for name, got, new, own in zip(names, get_arrays(client.model, "all"), other, local):
        np.testing.assert_array_equal(got, own if name.startswith("head.") else new)
    _, _, em = PFedSimClient(cfg, context).evaluate(other, {"server_round": 2})
    assert em["state_digest"] == m2["state_digest"]  # evaluated with its own trained model


# --- FedAS --------------------------------------------------------------------------------------------
def test_fedas_alignment_moves_the_received_extractor_toward_the_local_features():
    x, y = toy_data(n=96)
    local = TinyNet(seed=1)  # the client's previous local model
    received = TinyNet(seed=2)  # the downloaded shared parameters
    feats = local.backbone(x).detach()
    protos, counts = class_prototypes(feats, y, 3)
    protos_t, avail = torch.as_tensor(protos), torch.as_tensor(counts > 0)

    def loss_of(model):
        with torch.no_grad():
            return float(fedas_alignment_loss(model.backbone(x), y, protos_t, avail))

    head_before = [p.detach().clone() for p in received.head.parameters()]
    local_before = get_arrays(local, "all")
    before = loss_of(received)
    history = align_backbone(received, local, x, y, num_classes=3, lr=0.1, epochs=20, batch_size=16, drop_last=False,
                             generator=torch.Generator().manual_seed(0))
    assert loss_of(received) < 0.5 * before and history[-1] < history[0]
    assert all(torch.equal(a, b) for a, b in zip(head_before, received.head.parameters()))  # only the extractor
    assert arrays_equal(local_before, get_arrays(local, "all"))


def squared_gradient_norms(model, params, x, y, batch_size):
    """The Fisher trace by hand: per batch in data order, the squared norm of the gradient of the mean
    cross-entropy with respect to ``params`` (every one of which the forward pass must reach), summed."""
    total = 0.0
    for s in range(0, len(x), batch_size):
        grads = torch.autograd.grad(F.cross_entropy(model(x[s:s + batch_size]), y[s:s + batch_size]), params)
        total += float(sum(g.pow(2).sum() for g in grads))
    return total


def test_fisher_trace_and_weights():
    x, y = toy_data()
    model = TinyNet()
    t = fisher_trace(model, x, y, batch_size=16)
    expected = squared_gradient_norms(model, list(model.parameters()), x, y, batch_size=16)
    assert t == pytest.approx(expected, rel=1e-5) and t > 0
    np.testing.assert_allclose(fisher_weights([1.0, 3.0], [50, 50]), [0.25, 0.75])
    np.testing.assert_allclose(fisher_weights([0.0, float("nan")], [10, 30]), [0.25, 0.75])  # fallback


def test_fisher_trace_counts_only_the_parameters_the_forward_pass_reaches():
    # The SE-CNN's residual branch is skipped while its gate is shut (fusion 0, every method but FedEAGD):
    # its parameters have no gradient, and the trace is the one over the rest (FedAS on the SE-CNN).
    x, y = toy_data(d_in=64, classes=10)
    x = x.reshape(-1, 1, 8, 8)
    model = build_model((1, 8, 8), 10, feature_dim=16, kind="se_cnn", seed=0)
    assert model.fusion == 0.0
    reached = [p for name, p in model.named_parameters() if not name.startswith("residual.")]
    model.eval()
    expected = squared_gradient_norms(model, reached, x, y, batch_size=16)
    t = fisher_trace(model, x, y, batch_size=16)
    assert t == pytest.approx(expected, rel=1e-6) and t > 0


def test_fedas_server_weights_extractors_by_fisher_trace():
    cfg = tiny_cfg("fedas")
    strategy = make_strategy(cfg)
    shapes = strategy.upload_section_shapes()
    assert shapes["fisher_trace"] == [(1,)] and shapes["model"] == array_shapes(strategy.model, "backbone")
    a = [np.zeros(s, np.float32) for s in shapes["model"]]
    b = [np.ones(s, np.float32) for s in shapes["model"]]
    out = strategy.aggregate(1, {0: Upload(a, 100, {"fisher_trace": [np.array([1.0], np.float32)]}),
                                1: Upload(b, 1, {"fisher_trace": [np.array([3.0], np.float32)]})})
    np.testing.assert_allclose(out[0], 0.75)  # Fisher weights 1/4, 3/4 regardless of sample counts


def test_fedas_client_aligns_then_trains_and_uploads_the_fisher_trace():
    cfg = tiny_cfg("fedas", fedas_align_epochs=3)
    strategy = make_strategy(cfg)
    params = strategy.download_arrays()
    context = make_context(0, cfg.num_clients)
    up, _, m1 = FedASClient(cfg, context).fit(params, {"server_round": 1})
    assert "alignment_loss" not in m1  # first participation: nothing to align to
    assert up[-1].shape == (1,) and up[-1][0] == pytest.approx(m1["fisher_trace"]) and m1["fisher_trace"] > 0
    local = context.state["fedpers.personal"].to_numpy_ndarrays()
    new = [a + 0.05 for a in params]
    client = FedASClient(cfg, context)
    client._fitting, client._generator = True, torch.Generator().manual_seed(0)
    client.prepare(new)
    names = parameter_names(client.model, "all")
    for name, got, own in zip(names, get_arrays(client.model, "all"), local):
        if name.startswith("head."):
            np.testing.assert_array_equal(got, own)  # own classifier
    aligned = get_arrays(client.model, "backbone")
    assert not arrays_equal(aligned, new)  # the received extractor was changed by alignment
    assert client.alignment_losses and client.alignment_losses[-1] <= client.alignment_losses[0]
    # evaluation uses the saved local model, whatever is broadcast
    evaluator = FedASClient(cfg, context)
    _, _, em = evaluator.evaluate(new, {"server_round": 2})
    assert arrays_equal(get_arrays(evaluator.model, "all"), local) and em["state_digest"] == m1["state_digest"]


# --- FedFed -------------------------------------------------------------------------------------------
def test_fedfed_shared_features_are_sensitive_part_plus_noise():
    torch.manual_seed(0)
    g = FeatureDistiller(1)
    x = torch.randn(200, 1, 8, 8)
    clean = sensitive_features(g, x, 0.0)
    with torch.no_grad():
        g.eval()
        np.testing.assert_allclose(clean.numpy(), (x - g(x)[0]).numpy(), atol=1e-6)  # x_s = x - G(x)
    noisy = sensitive_features(g, x, 0.25, torch.Generator().manual_seed(1))
    diff = (noisy - clean).numpy()
    assert abs(diff.std() - 0.25) < 0.01 and abs(diff.mean()) < 0.01  # Gaussian noise of std sigma


def test_fedfed_distill_loss_trains_distiller_and_classifier():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU())
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.backbone(x))

    model, g = Net(), FeatureDistiller(1)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 3, (32,))
    loss = fedfed_distill_loss(model, g, x, y, noise_stds=[0.15, 0.25], w_rec=5.0, w_kl=0.005, w_ce=2.0, w_x_ce=0.4)
    loss.backward()
    assert all(p.grad is not None for p in g.parameters()) and all(p.grad is not None for p in model.parameters())


def test_fedfed_shares_once_and_clients_train_on_shared_features():
    cfg = tiny_cfg("fedfed", rounds=3, fedfed_distill_rounds=1)
    assert distill_rounds(cfg) == 1 and distill_rounds(cfg.replace(fedfed_distill_rounds=15)) == 2
    strategy = make_strategy(cfg)
    params = strategy.download_arrays()
    ctx0, ctx1 = make_context(0, cfg.num_clients), make_context(1, cfg.num_clients)
    up, n, m = FedFedClient(cfg, ctx0).fit(params, strategy.message_config(1))
    xs, ys = up[-2:]
    assert len(xs) == 2 * n and m["shared_samples_sent"] == 2 * n  # two noise levels
    assert "fedpers." + DISTILLER_STATE in ctx0.state and "fedpers." + SHARED_FLAG in ctx0.state
    train = get_federation(cfg).client(0, torch.device("cpu")).train
    np.testing.assert_array_equal(ys, np.concatenate([train.y.numpy(), train.y.numpy()]).astype(np.float32))
    # the two copies differ by noise only (same distiller, same inputs)
    assert not np.allclose(xs[:n], xs[n:]) and abs(float(np.std(xs[:n] - xs[n:])) - np.hypot(0.15, 0.25)) < 0.02
    # server: shared features go into the global dataset, the model is averaged as FedAvg
    strategy.book.start()
    strategy.roster.partition_of = {"a": 0}
    strategy.aggregate_fit(1, [(FakeProxy("a"), fit_res(up, n, m))], [])
    assert len(strategy.shared_y) == 2 * n and strategy.sharers == {0}
    assert strategy.book.current["bytes_up"] == parameters_nbytes(ndarrays_to_parameters(up))
    # a client never sampled during distillation never shares; client 0 never shares twice
    _, _, m1 = FedFedClient(cfg, ctx1).fit(params, strategy.message_config(2))
    assert m1["shared_samples_sent"] == 0
    draw, draw_counts = join_sections(strategy.draw(1, 2), strategy.broadcast_sections)
    draw_config = {**strategy.message_config(2), **draw_counts}
    assert len(draw[-1]) == min(2 * n, len(get_federation(cfg).partition.train[1]))
    client = FedFedClient(cfg, ctx1)
    client._round = 2
    client.receive(draw, draw_config)
    x_all, y_all = client.training_set()
    assert len(x_all) == len(client.data.train) + len(draw[-1])  # local + shared samples
    _, _, m2 = FedFedClient(cfg, ctx0).fit(draw, draw_config)
    assert m2["shared_samples_used"] == len(draw[-1]) and m2["shared_samples_sent"] == 0
    # training on the shared samples changes the result
    _, _, _ = FedFedClient(cfg, make_context(2, cfg.num_clients)).fit(params, strategy.message_config(2))
    a, _, _ = FedFedClient(cfg, make_context(2, cfg.num_clients)).fit(draw, draw_config)
    b, _, _ = FedFedClient(cfg, make_context(2, cfg.num_clients)).fit(params, strategy.message_config(2))
    assert not arrays_equal(a[:-2], b[:-2])


def test_fedfed_trains_on_its_own_and_the_shared_images_in_one_layout(tmp_path):
    """3-channel images reach the client channels-last (fedpers.core.federation.device_layout); the shared
    samples it receives join them in that layout, so its training steps keep the faster kernels."""
    rng = np.random.default_rng(0)
    path = tmp_path / "rgb.npz"
    np.savez(path, x_train=rng.random((60, 3, 32, 32), dtype=np.float32), y_train=np.arange(60) % 3,
             x_test=rng.random((30, 3, 32, 32), dtype=np.float32), y_test=np.arange(30) % 3)
    cfg = tiny_cfg("fedfed", dataset=str(path), aux_size=6)
    strategy, client = make_strategy(cfg), FedFedClient(cfg, make_context(1, cfg.num_clients))
    shared = rng.random((5, 3, 32, 32), dtype=np.float32)
    content = {**strategy.broadcast_content(), "shared_features": [shared], "shared_labels": [np.arange(5.0) % 3]}
    arrays, counts = join_sections(content, strategy.broadcast_sections)
    client.receive(arrays, {**strategy.message_config(2), **counts})
    assert client.data.train.x.is_contiguous(memory_format=torch.channels_last)
    x_all, y_all = client.training_set()
    assert x_all.is_contiguous(memory_format=torch.channels_last) and not x_all.is_contiguous()
    assert torch.equal(x_all[-5:], torch.from_numpy(shared)) and y_all[-5:].tolist() == [0, 1, 2, 0, 1]


def test_fedfed_server_drops_malformed_shared_features():
    cfg = tiny_cfg("fedfed", rounds=3, fedfed_distill_rounds=1)
    strategy = make_strategy(cfg)
    model = get_arrays(strategy.model, "all")
    bad_labels = [np.zeros((4, 1, 8, 8), np.float32), np.array([0, 1, 99, 2], np.float32)]
    strategy.book.start()
    strategy.roster.partition_of = {"a": 0}
    counts = {"arrays:model": len(model), "arrays:shared_features": 1, "arrays:shared_labels": 1}
    strategy.aggregate_fit(1, [(FakeProxy("a"), fit_res(model + bad_labels, 10, counts))], [])
    assert len(strategy.shared_y) == 0 and strategy.book.current["rejected"] == 0  # model still aggregated


# --- per-client state survives rounds in which the client is not sampled ----------------------------
@pytest.mark.parametrize("method", ["fedproto", "pfedsim", "fedas", "fedfed"])
def test_state_survives_unsampled_rounds(method):
    cfg = tiny_cfg(method, rounds=4, pfedsim_warmup=0.25, fedfed_distill_rounds=2)
    strategy = make_strategy(cfg)
    params = strategy.download_arrays()
    cls = METHODS[method].client_class()
    context = make_context(1, cfg.num_clients)
    _, _, fit_metrics = cls(cfg, context).fit(params, strategy.message_config(2))
    saved = {k: v.to_numpy_ndarrays() for k, v in context.state.array_records.items()}
    assert saved
    for r in (3, 4):  # not sampled: evaluated only, against a changed broadcast
        changed = [a + 0.01 * r if a.size and a.ndim > 1 else a for a in params]
        _, _, em = cls(cfg, context).evaluate(changed, strategy.message_config(r))
        if "state_digest" in fit_metrics:
            assert em["state_digest"] == fit_metrics["state_digest"]
    assert {k: v.to_numpy_ndarrays() for k, v in context.state.array_records.items()}.keys() == saved.keys()
    for k, v in context.state.array_records.items():
        assert arrays_equal(v.to_numpy_ndarrays(), saved[k])


# --- registry, config keys, ready configs ----------------------------------------------------------
def test_registry_entries():
    for name in METHODS_MORE:
        spec = METHODS[name]
        assert spec.metric == "personalized_macro_acc" and not spec.needs_aux and spec.paper
        assert issubclass(spec.strategy_class(), FedPersStrategy)
    assert [METHODS[m].strategy_class().has_global_model for m in METHODS_MORE] == [False, False, False, True]


def test_keys_are_prefixed_with_defaults():
    keys = {k.name: k.default for k in all_keys() if k.name.split("_", 1)[0] in METHODS_MORE}
    assert keys["fedproto_lambda"] == 1.0 and keys["fedproto_infer"] == "global"
    assert keys["pfedsim_warmup"] == 0.5
    assert (keys["fedas_align_lr"], keys["fedas_align_epochs"], keys["fedas_align_batch"]) == (0.01, 1, 16)
    assert keys["fedfed_distill_rounds"] == 15 and keys["fedfed_noise_std1"] == 0.15
    for bad in ({"fedproto_infer": "knn"}, {"pfedsim_warmup": 1.0}, {"fedas_align_batch": 0},
                {"fedfed_noise_std1": -1.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            build_config(bad)
