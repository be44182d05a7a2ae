"""Feature-skew (multi-domain) data: the domain partitioner (the multi-domain datasets are loaded by
:mod:`fedpers.core.data`).

* PACS (``pacs.npz``: photo, art_painting, cartoon, sketch; 7 classes) needs no loader of its own: any
  Keras-layout ``.npz`` with ``d_train``/``d_test`` (and ``domain_names``) is read by
  :func:`fedpers.core.data.load_npz` with its domain ids (``dataset: ../shared/data/pacs.npz``).
* ``mnist_usps`` (:func:`fedpers.core.data.load_mnist_usps`): MNIST (28x28) and USPS (16x16) resized to one common shape (``DIGITS_SIZE``, bilinear)
  as a two-domain digits set (domain 0 = MNIST, 1 = USPS); read from ``data_dir`` (``mnist.npz``,
  ``usps.npz``).
* ``digits_domains`` (:func:`fedpers.core.data.load_digits_domains`): scikit-learn's 8x8 digits as a tiny two-domain set for tests: every image appears
  once, either as is (domain 0) or inverted (``255 - x``, domain 1), alternating by a seeded shuffle.

:func:`domain_partition` gives each client one domain (JDFL paper Sec. 5.1): client ``k`` holds domain
``k mod D`` and the clients that share a domain split its train and test samples evenly, class by class.
"""

from __future__ import annotations

import numpy as np

from fedpers.core.errors import DataError


def domain_client_map(num_domains: int, num_clients: int) -> list[int]:
    """Domain of each client: client ``k`` holds domain ``k mod D`` (every domain is used; with more
    clients than domains a domain is split over ``ceil``/``floor(K / D)`` clients)."""
    if num_clients < num_domains:
        raise DataError(f"partition 'domain' needs num_clients >= the {num_domains} domains of the data, "
                        f"got {num_clients}")
    return [k % num_domains for k in range(num_clients)]


def domain_partition(y_train: np.ndarray, y_test: np.ndarray, d_train: np.ndarray | None, d_test: np.ndarray | None,
                     *, num_clients: int, aux_size: int = 0, seed: int = 0, num_classes: int | None = None):
    """Feature-skew split: each client gets exactly one domain (:func:`domain_client_map`); the clients
    of a domain share its remaining train samples and its test samples evenly, class by class (so a
    client's test split is held-out data of its own domain and the union of client test splits is the
    whole test set). The server's Ds (``aux_size``) is drawn uniformly from the train split first."""
    from fedpers.core.partition import Partition, split_by_proportions

    if d_train is None or d_test is None:
        raise DataError("partition 'domain' needs a dataset with domain ids (d_train/d_test), e.g. pacs.npz, "
                        "mnist_usps or digits_domains")
    n_train = len(y_train)
    if aux_size >= n_train:
        raise DataError(f"aux_size={aux_size} leaves no training data (the train split has {n_train} samples)")
    num_domains = int(max(d_train.max(), d_test.max())) + 1
    owner = domain_client_map(num_domains, num_clients)
    num_classes = int(num_classes if num_classes is not None else max(y_train.max(), y_test.max()) + 1)
    rng = np.random.default_rng(seed)
    aux = np.sort(rng.choice(n_train, size=aux_size, replace=False)).astype(np.int64)
    pool = np.setdiff1d(np.arange(n_train), aux)
    train: list[np.ndarray] = [np.zeros(0, np.int64)] * num_clients
    test: list[np.ndarray] = [np.zeros(0, np.int64)] * num_clients
    for d in range(num_domains):
        members = [k for k in range(num_clients) if owner[k] == d]
        proportions = np.full((num_classes, len(members)), 1.0 / len(members))
        tr = split_by_proportions(y_train, pool[d_train[pool] == d], proportions, rng)
        te = split_by_proportions(y_test, np.flatnonzero(d_test == d), proportions, rng)
        for j, k in enumerate(members):
            train[k], test[k] = tr[j], te[j]
    empty = [k for k in range(num_clients) if len(train[k]) == 0 or len(test[k]) == 0]
    if empty:
        raise DataError(f"partition 'domain' leaves client {empty[0]} without train or test data")
    return Partition(tuple(train), tuple(test), aux)


def client_domains(dataset, partition) -> list[int] | None:
    """True domain of each client: the most frequent domain id among its train samples (None without ids)."""
    if dataset.d_train is None:
        return None
    ids = dataset.d_train if partition.index_space == "split" else np.concatenate([dataset.d_train, dataset.d_test])
    return [int(np.bincount(ids[idx]).argmax()) if len(idx) else -1 for idx in partition.train]
