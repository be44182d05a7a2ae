"""Client splits: class-wise Dirichlet label skew, pathological k-classes-per-client, and IID.

How a split is made (deterministic in ``seed``):

1. The server's auxiliary set Ds (``aux_size`` samples) is drawn uniformly from the training split
   first; it is disjoint from every client's data and from all test data.
2. A class-to-client proportion matrix ``P`` (C x K, rows sum to 1) is drawn: ``P[c] ~ Dir(alpha)``
   (Dirichlet), equal shares among the clients that hold class ``c`` (pathological), or ``1/K`` (IID).
3. For every class, the remaining training samples and the test samples of that class are both cut by
   the same row ``P[c]``. Each client's test split therefore has the same label distribution as its
   train split (up to rounding), and the union of client test splits is the whole test set.
4. Dirichlet only: the draw is repeated (up to ``MAX_DIRICHLET_DRAWS`` times) until every client has at
   least ``min_samples_per_client`` training samples and at least one test sample, the rule of e.g.
   PFLlib/FedLab; if no draw qualifies the run stops with a clear error instead of crashing later.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedpers.errors import DataError

MAX_DIRICHLET_DRAWS = 1000


@dataclass(frozen=True)
class Partition:
    """Sample indices per client: ``train[k]`` into x_train, ``test[k]`` into x_test; ``aux`` into x_train."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    aux: np.ndarray

    @property
    def num_clients(self) -> int:
        """K."""
        return len(self.train)


def dirichlet_proportions(num_classes: int, num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Class-wise Dirichlet label skew: row ``c`` of the C x K result is ``Dir(alpha * 1_K)``."""
    return rng.dirichlet(np.full(num_clients, alpha), size=num_classes)


def pathological_proportions(num_classes: int, num_clients: int, classes_per_client: int,
                             rng: np.random.Generator) -> np.ndarray:
    """k classes per client (McMahan et al.'s shards): classes dealt round-robin over a shuffled order
    so that every class is held by someone; a class is shared equally among its holders."""
    if classes_per_client > num_classes:
        raise DataError(f"classes_per_client={classes_per_client} exceeds the {num_classes} classes of the data")
    order = rng.permutation(num_classes)
    holds = np.zeros((num_classes, num_clients))
    for k in range(num_clients):
        for j in range(classes_per_client):
            holds[order[(k * classes_per_client + j) % num_classes], k] = 1.0
    counts = holds.sum(axis=1, keepdims=True)
    return np.divide(holds, counts, out=np.zeros_like(holds), where=counts > 0)


def split_by_proportions(labels: np.ndarray, indices: np.ndarray, proportions: np.ndarray,
                         rng: np.random.Generator) -> list[np.ndarray]:
    """Cut ``indices`` class by class according to ``proportions`` (C x K); returns K sorted index arrays."""
    num_clients = proportions.shape[1]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(proportions.shape[0]):
        idx_c = indices[labels[indices] == c]
        idx_c = idx_c[rng.permutation(len(idx_c))]
        cuts = (np.cumsum(proportions[c]) * len(idx_c)).round().astype(int)[:-1]
        for k, chunk in enumerate(np.split(idx_c, cuts)):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64) for p in parts]


def make_partition(y_train: np.ndarray, y_test: np.ndarray, *, num_clients: int, scheme: str,
                   alpha: float = 0.5, classes_per_client: int = 2, aux_size: int = 0, seed: int = 0,
                   min_samples_per_client: int = 1, num_classes: int | None = None) -> Partition:
    """Split the data over ``num_clients`` clients (see module docstring for the exact rule)."""
    n_train = len(y_train)
    num_classes = int(num_classes if num_classes is not None else max(y_train.max(), y_test.max()) + 1)
    if aux_size >= n_train:
        raise DataError(f"aux_size={aux_size} leaves no training data (the train split has {n_train} samples)")
    if num_clients > n_train - aux_size:
        raise DataError(
            f"num_clients={num_clients} exceeds the {n_train - aux_size} training samples left after aux_size"
        )
    if num_clients > len(y_test):
        raise DataError(f"num_clients={num_clients} exceeds the {len(y_test)} test samples")
    rng = np.random.default_rng(seed)
    aux = np.sort(rng.choice(n_train, size=aux_size, replace=False)).astype(np.int64)
    pool = np.setdiff1d(np.arange(n_train), aux)
    test_pool = np.arange(len(y_test))

    if scheme == "iid":
        proportions = np.full((num_classes, num_clients), 1.0 / num_clients)
    elif scheme == "pathological":
        proportions = pathological_proportions(num_classes, num_clients, classes_per_client, rng)
    elif scheme == "dirichlet":
        if alpha <= 0:
            raise DataError(f"alpha must be > 0, got {alpha}")
        for _ in range(MAX_DIRICHLET_DRAWS):
            proportions = dirichlet_proportions(num_classes, num_clients, alpha, rng)
            train = split_by_proportions(y_train, pool, proportions, rng)
            test = split_by_proportions(y_test, test_pool, proportions, rng)
            if min(map(len, train)) >= min_samples_per_client and min(map(len, test)) >= 1:
                return Partition(tuple(train), tuple(test), aux)
        raise DataError(
            f"no Dirichlet(alpha={alpha}) split in {MAX_DIRICHLET_DRAWS} draws gives each of {num_clients} "
            f"clients >= {min_samples_per_client} train samples and >= 1 test sample; "
            "raise alpha, lower num_clients or lower min_samples_per_client"
        )
    else:
        raise DataError(f"unknown partition '{scheme}'")

    train = split_by_proportions(y_train, pool, proportions, rng)
    test = split_by_proportions(y_test, test_pool, proportions, rng)
    empty = [k for k in range(num_clients) if len(train[k]) == 0 or len(test[k]) == 0]
    if empty:
        raise DataError(f"partition '{scheme}' leaves client {empty[0]} without train or test data")
    return Partition(tuple(train), tuple(test), aux)
