"""Synthetic(alpha, beta): the FedProx paper's generated federated data (Li et al., "Federated Optimization in
Heterogeneous Networks", MLSys 2020, Sec. 5.1 and its appendix), generated client by client on demand.

Client k's data follow its own model (Sec. 5.1, in the form of the authors' ``generate_synthetic.py``)::

    u_k ~ N(0, alpha),  B_k ~ N(0, beta)
    W_k in R^{60 x 10}, entries ~ N(u_k, 1);  b_k in R^10, entries ~ N(u_k, 1);  v_k in R^60, entries ~ N(B_k, 1)
    x ~ N(v_k, Sigma), Sigma diagonal with Sigma_jj = j^-1.2 (j = 1..60);  y = argmax(softmax(x W_k + b_k))

alpha spreads the clients' models (how far their labelling rules differ), beta their inputs. As in that code
the second parameter of each N(.) is numpy's ``scale``, a standard deviation: for Synthetic(0, 0),
(1, 1) and the iid variant this is also the variance the paper writes. Client k holds
``int(lognormal(4, 2)) + 50`` samples (numpy's ``lognormal(mean=4, sigma=2)``, a power law with a floor of
50), of which the first ``int(0.9 n)`` are its train split and the rest its test split, the code's 90/10
split per client. The iid variant (the code's ``synthetic_iid``): one (W, b) with N(0, 1) entries shared
by every client, v_k = 0; alpha and beta are not read.

What is ours: every draw comes from a seeded stream of its own (fedpers/core/seeds.py), client k's from
(seed, SYNTHETIC_CLIENT, k), so any process generates client k alone, in O(its samples), and the same
numbers as every other process; the sizes of all K clients are one O(K) vector from (seed, SYNTHETIC_SIZES).
The code shuffles a client's samples before its 90/10 cut; the samples are independent draws, so a fixed
cut is already a uniformly random split and no shuffle is made. Labels are the argmax of the logits
(softmax keeps their order). A sample is presented as a 1 x 1 x 60 "image" so that every model sees
(C, H, W) inputs.
"""

from __future__ import annotations

import functools

import numpy as np

from fedpers.core.seeds import (SYNTHETIC_AUX, SYNTHETIC_CLIENT, SYNTHETIC_IID_MODEL, SYNTHETIC_SIZES,
                                SYNTHETIC_TEST_CLIENTS, derived_seed)

SYNTHETIC = "synthetic"  # the ``dataset`` value
DIMENSION = 60
NUM_CLASSES = 10
INPUT_SHAPE = (1, 1, DIMENSION)
SIZE_LOG_MEAN, SIZE_LOG_SIGMA, SIZE_FLOOR = 4.0, 2.0, 50  # int(lognormal(4, 2)) + 50 samples per client
TRAIN_SHARE = 0.9  # the code's per-client train share: int(0.9 n) train, the rest test
# The global test set of a run with more clients than this is the test splits of a seeded sample of this
# many clients (ours): the server evaluates its model on a bounded set, not on 10 % of 45 M samples.
GLOBAL_TEST_CLIENTS = 100


def feature_variances() -> np.ndarray:
    """The diagonal of Sigma (Sec. 5.1): ``Sigma_jj = j^-1.2`` for j = 1..60."""
    return np.arange(1, DIMENSION + 1, dtype=np.float64) ** -1.2


def client_sizes(num_clients: int, seed: int) -> np.ndarray:
    """Samples of each of the K clients: ``int(lognormal(4, 2)) + 50`` (Sec. 5.1's power law, as the code draws
    it), int64, from the stream (seed, SYNTHETIC_SIZES)."""
    rng = np.random.default_rng(derived_seed(seed, SYNTHETIC_SIZES))
    return rng.lognormal(SIZE_LOG_MEAN, SIZE_LOG_SIGMA, num_clients).astype(np.int64) + SIZE_FLOOR


def train_sizes(sizes: np.ndarray) -> np.ndarray:
    """Train-split size of clients of ``sizes`` samples: ``int(0.9 n)`` (the code's per-client split); the
    test split holds the other ``n - int(0.9 n)``."""
    return (TRAIN_SHARE * np.asarray(sizes, dtype=np.int64)).astype(np.int64)


def validation_sizes(train: np.ndarray, fraction: float) -> np.ndarray:
    """Samples held out of train splits of sizes ``train`` as validation splits (``val_fraction``, ours):
    ``round(fraction * n)``, at least one, never the last training sample. Not stratified by class as for
    the datasets (fedpers/core/partition.py): that would need every client's labels, i.e. generating all of
    them, to know the sizes; the samples are independent draws, so any fixed cut is a random one."""
    train = np.asarray(train, dtype=np.int64)
    held = np.floor(fraction * train + 0.5).astype(np.int64)
    return np.clip(held, 1, np.maximum(train - 1, 1))


@functools.lru_cache(maxsize=8)
def shared_iid_model(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) of the iid variant, shared by every client: entries N(0, 1), from (seed, SYNTHETIC_IID_MODEL)."""
    rng = np.random.default_rng(derived_seed(seed, SYNTHETIC_IID_MODEL))
    weights = rng.normal(0.0, 1.0, (DIMENSION, NUM_CLASSES))
    bias = rng.normal(0.0, 1.0, NUM_CLASSES)
    weights.flags.writeable = bias.flags.writeable = False  # shared by every call
    return weights, bias


def client_model(seed: int, client: int, alpha: float, beta: float,
                 iid: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.Generator]:
    """(W_k, b_k, v_k) of client k (Sec. 5.1): u_k ~ N(0, alpha), B_k ~ N(0, beta), then W_k, b_k ~ N(u_k, 1)
    and v_k ~ N(B_k, 1) entry-wise, drawn in this order from (seed, SYNTHETIC_CLIENT, k); the iid variant's
    shared (W, b) and v_k = 0. Returns the client's generator too, positioned for its samples."""
    rng = np.random.default_rng(derived_seed(seed, SYNTHETIC_CLIENT, client))
    if iid:
        weights, bias = shared_iid_model(seed)
        return weights, bias, np.zeros(DIMENSION), rng
    u = rng.normal(0.0, alpha)
    b_mean = rng.normal(0.0, beta)
    weights = rng.normal(u, 1.0, (DIMENSION, NUM_CLASSES))
    bias = rng.normal(u, 1.0, NUM_CLASSES)
    mean = rng.normal(b_mean, 1.0, DIMENSION)
    return weights, bias, mean, rng


def draw_samples(weights: np.ndarray, bias: np.ndarray, mean: np.ndarray, n: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the model (W, b, v) (Sec. 5.1): ``x ~ N(v, Sigma)`` (independent coordinates, Sigma
    diagonal) and ``y = argmax(x W + b)``. Returns x as float32 (n, 1, 1, 60) and y as int64; the labels
    are taken from the float64 draws."""
    x = mean + rng.standard_normal((n, DIMENSION)) * np.sqrt(feature_variances())
    y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
    return x.astype(np.float32).reshape(n, *INPUT_SHAPE), y


def generate_client(seed: int, client: int, size: int, *, alpha: float, beta: float, iid: bool,
                    num_val: int = 0) -> dict[str, np.ndarray]:
    """Client k's arrays: its ``size`` samples (:func:`client_model`, :func:`draw_samples`) cut in order into
    train (the first ``int(0.9 size) - num_val``), validation (the next ``num_val``, present only when
    ``num_val`` > 0) and test (the last ``size - int(0.9 size)``): keys ``x_train``, ``y_train``, ``x_test``,
    ``y_test`` and ``x_val``, ``y_val``."""
    weights, bias, mean, rng = client_model(seed, client, alpha, beta, iid)
    x, y = draw_samples(weights, bias, mean, size, rng)
    n_train = int(train_sizes(np.array([size]))[0])
    keep = n_train - num_val
    arrays = {"x_train": x[:keep], "y_train": y[:keep], "x_test": x[n_train:], "y_test": y[n_train:]}
    if num_val > 0:
        arrays.update(x_val=x[keep:n_train], y_val=y[keep:n_train])
    return arrays


def global_test_clients(num_clients: int, seed: int) -> np.ndarray:
    """The clients whose test splits form the global test set (ours): all of them up to
    :data:`GLOBAL_TEST_CLIENTS`, else that many drawn without replacement from (seed,
    SYNTHETIC_TEST_CLIENTS); sorted."""
    if num_clients <= GLOBAL_TEST_CLIENTS:
        return np.arange(num_clients, dtype=np.int64)
    rng = np.random.default_rng(derived_seed(seed, SYNTHETIC_TEST_CLIENTS))
    return np.sort(rng.choice(num_clients, size=GLOBAL_TEST_CLIENTS, replace=False)).astype(np.int64)


def server_samples(seed: int, num_clients: int, count: int, *, alpha: float, beta: float,
                   iid: bool) -> tuple[np.ndarray, np.ndarray]:
    """The server's labelled set Ds (ours): ``count`` samples, each from the distribution of a client drawn
    uniformly (with replacement), as fresh draws, not copies of that client's own samples; clients and
    draws from (seed, SYNTHETIC_AUX). O(count) clients' models are generated, none of their samples."""
    rng = np.random.default_rng(derived_seed(seed, SYNTHETIC_AUX))
    owners = rng.integers(0, num_clients, size=count)
    x = np.empty((count, *INPUT_SHAPE), np.float32)
    y = np.empty(count, np.int64)
    order = np.argsort(owners, kind="stable")
    clients, starts = np.unique(owners[order], return_index=True)
    for client, rows in zip(clients, np.split(order, starts[1:])):
        weights, bias, mean, _ = client_model(seed, int(client), alpha, beta, iid)
        x[rows], y[rows] = draw_samples(weights, bias, mean, len(rows), rng)
    return x, y
