"""Feature-skew (multi-domain) data: loaders of multi-domain datasets and the domain partitioner.

* PACS (``pacs.npz``: photo, art_painting, cartoon, sketch; 7 classes) needs no loader of its own: any
  Keras-layout ``.npz`` with ``d_train``/``d_test`` (and ``domain_names``) is read by
  :func:`fedpers.data.load_npz` with its domain ids (``dataset: ../shared/data/pacs.npz``).
* ``mnist_usps``: MNIST (28x28) and USPS (16x16) resized to one common shape (``DIGITS_SIZE``, bilinear)
  as a two-domain digits set (domain 0 = MNIST, 1 = USPS); read from ``data_dir`` (``mnist.npz``,
  ``usps.npz``).
* ``digits_domains``: scikit-learn's 8x8 digits as a tiny two-domain set for tests: every image appears
  once, either as is (domain 0) or inverted (``255 - x``, domain 1), alternating by a seeded shuffle.

:func:`domain_partition` gives each client one domain (JDFL paper Sec. 5.1): client ``k`` holds domain
``k mod D`` and the clients that share a domain split its train and test samples evenly, class by class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedpers.errors import DataError

DOMAIN_DATASETS = ("mnist_usps", "digits_domains")
DIGITS_SIZE = 28  # common side of MNIST + USPS (USPS 16x16 is upsampled; ours)


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of uint8 (N, H, W) images to (N, size, size), uint8."""
    import torch
    import torch.nn.functional as F

    if x.shape[1] == size and x.shape[2] == size:
        return x
    t = torch.as_tensor(x, dtype=torch.float32)[:, None]
    out = F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return out[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DataError(f"data file not found: {path} (mnist_usps needs mnist.npz and usps.npz in data_dir)")
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}


def load_mnist_usps(data_dir: str | Path, size: int = DIGITS_SIZE):
    """MNIST + USPS as one two-domain dataset (domain 0 = MNIST, 1 = USPS), images resized to size x size."""
    from fedpers.data import default_data_dir, from_arrays

    root = Path(data_dir) if data_dir else default_data_dir()
    parts = [_read_npz(root / "mnist.npz"), _read_npz(root / "usps.npz")]
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in ("x_train", "y_train", "x_test", "y_test", "d_train", "d_test")}
    for d, part in enumerate(parts):
        for split in ("train", "test"):
            arrays[f"x_{split}"].append(resize_images(part[f"x_{split}"], size))
            arrays[f"y_{split}"].append(part[f"y_{split}"].astype(np.int64))
            arrays[f"d_{split}"].append(np.full(len(part[f"y_{split}"]), d, np.int64))
    cat = {k: np.concatenate(v) for k, v in arrays.items()}
    return from_arrays("mnist_usps", cat["x_train"], cat["y_train"], cat["x_test"], cat["y_test"], num_classes=10,
                       d_train=cat["d_train"], d_test=cat["d_test"], domain_names=("mnist", "usps"))


def load_digits_domains(seed: int = 0):
    """scikit-learn digits as a tiny two-domain set: each image once, original (domain 0) or inverted
    (domain 1), half and half by a seeded shuffle (train/test split as :func:`load_digits_dataset`)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from fedpers.data import from_arrays

    bunch = load_digits()
    x = (bunch.images / 16.0 * 255.0).astype(np.uint8)
    x_tr, x_te, y_tr, y_te = train_test_split(x, bunch.target, test_size=0.2, stratify=bunch.target,
                                              random_state=0)
    rng = np.random.default_rng(seed)
    out = []
    for xs in (x_tr, x_te):
        d = (rng.permutation(len(xs)) % 2).astype(np.int64)
        xs = np.where(d[:, None, None] == 1, 255 - xs, xs).astype(np.uint8)
        out.append((xs, d))
    (x_tr, d_tr), (x_te, d_te) = out
    return from_arrays("digits_domains", x_tr, y_tr, x_te, y_te, num_classes=10, d_train=d_tr, d_test=d_te,
                       domain_names=("original", "inverted"))


def load_domain_dataset(name: str, data_dir: str = ""):
    """Load one of :data:`DOMAIN_DATASETS` by name."""
    if name == "mnist_usps":
        return load_mnist_usps(data_dir)
    if name == "digits_domains":
        return load_digits_domains()
    raise DataError(f"unknown multi-domain dataset '{name}'")


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
    from fedpers.partition import Partition, split_by_proportions

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
