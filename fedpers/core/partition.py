"""Client splits: class-wise Dirichlet label skew, pathological k-classes-per-client, and IID.

How a split is made (deterministic in ``seed``):

1. The server's auxiliary set Ds (``aux_size`` samples) is drawn uniformly from the training split
   first; it is disjoint from every client's data and from all test data.
2. A class-to-client proportion matrix ``P`` (C x K, rows sum to 1) is drawn: ``P[c] ~ Dir(alpha)``
   (Dirichlet) or equal shares among the clients that hold class ``c`` (pathological). IID deals each
   class's samples to the clients in turn instead (:func:`deal_evenly`): shares of 1/K rounded class by
   class would leave clients empty once K nears a class's size.
3. For every class, the remaining training samples and the test samples of that class are both cut by
   the same row ``P[c]``. Each client's test split therefore has the same label distribution as its
   train split (up to rounding), and the union of client test splits is the whole test set.
4. Dirichlet only: the draw is repeated (up to ``MAX_DIRICHLET_DRAWS`` times) until every client has at
   least ``min_samples_per_client`` training samples and at least one test sample, the rule of e.g.
   PFLlib/FedLab; if no draw qualifies the run stops with a clear error instead of crashing later.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedpers.core.errors import DataError

MAX_DIRICHLET_DRAWS = 1000


INDEX_SPACES = ("split", "joined")


@dataclass(frozen=True)
class Partition:
    """Sample indices per client.

    ``index_space == "split"``: ``train[k]`` and ``aux`` index x_train, ``test[k]`` indexes x_test.
    ``index_space == "joined"``: every index points into the concatenation of x_train and x_test.
    """

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    aux: np.ndarray
    index_space: str = "split"
    # each client's validation split (:func:`hold_out_validation`), in the index space of ``train`` and
    # disjoint from it; None when no validation split is held out
    val: tuple[np.ndarray, ...] | None = None

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


def deal_evenly(labels: np.ndarray, indices: np.ndarray, num_clients: int,
                rng: np.random.Generator) -> list[np.ndarray]:
    """IID: ``indices`` shuffled within each class, the classes laid end to end and dealt to the clients in
    turn (in a seeded order of the clients): each client gets floor or ceil of n_c / K samples of every class
    c and floor or ceil of n / K in all, so even 10,000 clients of MNIST's 10,000 test images get one each."""
    order = np.concatenate([indices[labels[indices] == c][rng.permutation(int((labels[indices] == c).sum()))]
                            for c in np.unique(labels[indices])]) if len(indices) else indices
    owner = rng.permutation(num_clients)  # owner[j] receives positions j, j + K, j + 2K, ...
    parts: list[np.ndarray] = [np.zeros(0, np.int64)] * num_clients
    for j in range(num_clients):
        parts[owner[j]] = np.sort(order[j::num_clients]).astype(np.int64)
    return parts


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
        train = deal_evenly(y_train, pool, num_clients, rng)
        test = deal_evenly(y_test, test_pool, num_clients, rng)
        return Partition(tuple(train), tuple(test), aux)
    if scheme == "pathological":
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


def save_partition(path, partition: Partition, *, dataset: str, num_train: int, num_test: int) -> None:
    """Write ``partition.npz``: ``train_<c>``, ``test_<c>`` (int64), ``aux``, ``index_space``, ``dataset``,
    ``num_samples`` (= num_train + num_test, the length of the joined index space) and ``num_train``."""
    arrays = {f"train_{c}": t.astype(np.int64) for c, t in enumerate(partition.train)}
    arrays.update({f"test_{c}": t.astype(np.int64) for c, t in enumerate(partition.test)})
    np.savez(path, **arrays, aux=partition.aux.astype(np.int64), index_space=np.array(partition.index_space),
             dataset=np.array(dataset), num_samples=np.array(num_train + num_test, dtype=np.int64),
             num_train=np.array(num_train, dtype=np.int64))


def count_partition_clients(path) -> int:
    """Number of clients in a partition file (its ``train_<c>`` arrays), or a DataError."""
    return len(_read_partition_arrays(path)[0])


def _read_partition_arrays(path):
    from pathlib import Path

    p = Path(path)
    if not str(path):
        raise DataError("partition=file needs partition_file: PATH")
    if not p.is_file():
        raise DataError(f"partition file not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except Exception as exc:
        raise DataError(f"{p}: not a readable partition .npz ({type(exc).__name__})") from None
    for key in data:
        prefix, _, number = key.partition("_")
        if prefix in ("train", "test") and not (number.isdigit() and str(int(number)) == number):
            raise DataError(f"{p}: key '{key}' is not a client key: clients are train_<c> / test_<c> with "
                            f"c = 0, 1, 2, ... written without leading zeros")
    train = {int(k[6:]): v for k, v in data.items() if k.startswith("train_")}
    test = {int(k[5:]): v for k, v in data.items() if k.startswith("test_")}
    if not train:
        raise DataError(f"{p}: no train_<c> arrays")
    if sorted(train) != list(range(len(train))) or sorted(test) != sorted(train):
        raise DataError(f"{p}: clients must be train_0..train_{len(train) - 1} with matching test_<c> arrays")
    return train, test, data, p


def _dataset_key(name: str) -> str:
    """A dataset's name as files and configs write it, reduced so that ``mnist``, ``mnist.npz`` and
    ``../shared/data/mnist.npz`` (or ``cifar-10`` and ``cifar10``) compare equal."""
    return Path(str(name)).name.removesuffix(".npz").lower().replace("-", "").replace("_", "")


def load_partition(path, *, num_train: int, num_test: int, dataset: str | None = None) -> Partition:
    """Read and check a partition file against a dataset of ``num_train`` + ``num_test`` samples (named
    ``dataset``, where the file records the dataset it was made for).

    Errors (one line each): a file made for another dataset (even of the same size), unknown index space,
    ``num_samples`` not matching the dataset, indices out of
    range or not integers, a client with an empty train or test split, a client whose train and test
    overlap (joined space), or an ``aux`` set that overlaps client data."""
    train, test, data, p = _read_partition_arrays(path)
    made_for = str(data["dataset"]) if "dataset" in data else ""
    if dataset is not None and made_for and _dataset_key(made_for) != _dataset_key(dataset):
        raise DataError(f"{p}: made for dataset {made_for!r}, not {Path(str(dataset)).name!r}: a split of "
                        "another dataset's samples (the same sizes do not make them the same images)")
    space = str(data.get("index_space", np.array("split")))
    if space not in INDEX_SPACES:
        raise DataError(f"{p}: index_space must be 'split' or 'joined', got '{space}'")
    if "num_samples" in data and int(data["num_samples"]) != num_train + num_test:
        raise DataError(
            f"{p}: num_samples={int(data['num_samples'])} but the dataset has {num_train + num_test} "
            f"({num_train} train + {num_test} test): the split was made for other data"
        )
    bounds = {"train": num_train, "test": num_test, "aux": num_train} if space == "split" else \
        {"train": num_train + num_test, "test": num_train + num_test, "aux": num_train + num_test}

    def checked(name: str, arr, kind: str) -> np.ndarray:
        arr = np.asarray(arr)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise DataError(f"{p}: {name} must be a 1-D integer index array")
        arr = arr.astype(np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= bounds[kind]):
            raise DataError(f"{p}: {name} has indices outside [0, {bounds[kind]}) of the {space} index space")
        return arr

    tr = tuple(checked(f"train_{c}", train[c], "train") for c in range(len(train)))
    te = tuple(checked(f"test_{c}", test[c], "test") for c in range(len(train)))
    aux = checked("aux", data.get("aux", np.zeros(0, np.int64)), "aux")
    for c in range(len(tr)):
        if len(tr[c]) == 0 or len(te[c]) == 0:
            raise DataError(f"{p}: client {c} has an empty train or test split")
        for name, arr in ((f"train_{c}", tr[c]), (f"test_{c}", te[c])):
            if np.unique(arr).size != arr.size:
                raise DataError(f"{p}: {name} repeats index {_first_repeat(arr)}")
        if space == "joined" and np.intersect1d(tr[c], te[c]).size:
            raise DataError(f"{p}: client {c}'s train and test splits overlap")
    if space == "joined":  # one index space: no sample may belong to two clients, in any split
        _refuse_shared_samples(p, [(f"train_{c}", a) for c, a in enumerate(tr)] +
                               [(f"test_{c}", a) for c, a in enumerate(te)])
    else:
        _refuse_shared_samples(p, [(f"train_{c}", a) for c, a in enumerate(tr)])
        _refuse_shared_samples(p, [(f"test_{c}", a) for c, a in enumerate(te)])
    client_train = np.concatenate(tr)
    client_all = client_train if space == "split" else np.concatenate([client_train, *te])
    if aux.size and np.intersect1d(aux, client_all).size:
        raise DataError(f"{p}: aux overlaps client data")
    return Partition(tr, te, aux, space)


def _first_repeat(arr: np.ndarray) -> int:
    values, counts = np.unique(arr, return_counts=True)
    return int(values[counts > 1][0])


def _refuse_shared_samples(path, named: list[tuple[str, np.ndarray]]) -> None:
    """One line naming a sample index that two of the ``named`` index arrays hold, if there is one (a client
    training on another client's test sample would inflate its accuracy unnoticed)."""
    owner = np.concatenate([np.full(len(a), i) for i, (_, a) in enumerate(named)])
    indices = np.concatenate([a for _, a in named])
    order = np.argsort(indices, kind="stable")
    same = np.flatnonzero(indices[order][1:] == indices[order][:-1])
    if same.size:
        first, second = owner[order][same[0]], owner[order][same[0] + 1]
        raise DataError(f"{path}: sample {int(indices[order][same[0]])} is in both {named[first][0]} and "
                        f"{named[second][0]}: a sample may belong to one client only")


def hold_out_validation(partition: Partition, train_labels: np.ndarray, fraction: float,
                        rng: np.random.Generator) -> Partition:
    """Hold out ``fraction`` of each client's training samples as that client's validation split, never
    trained on (hyperparameters are chosen on it, not on the test split).

    Stratified by class: of each class a client holds ``n_c`` samples of, ``round(fraction * n_c)`` go to
    validation, drawn at random. A client whose classes are all too small for that still gives one sample
    when it has two or more, so that every client with data to spare has a validation split; a client's
    last training sample is never taken. ``train_labels`` are the labels of the index space of
    ``partition.train``. The draw depends only on ``rng`` and the partition."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {fraction}")
    train, val = [], []
    for idx in partition.train:
        labels = train_labels[idx]
        held: list[np.ndarray] = []
        for c in np.unique(labels):
            of_class = idx[labels == c]
            take = int(np.floor(fraction * len(of_class) + 0.5))
            held.append(rng.choice(of_class, size=min(take, len(of_class)), replace=False))
        chosen = np.concatenate(held) if held else np.zeros(0, np.int64)
        if len(chosen) == 0 and len(idx) >= 2:
            chosen = rng.choice(idx, size=1, replace=False)
        if len(chosen) >= len(idx):  # keep at least one training sample
            chosen = chosen[: len(idx) - 1]
        chosen = np.sort(chosen).astype(np.int64)
        val.append(chosen)
        train.append(np.setdiff1d(idx, chosen).astype(np.int64))
    return Partition(tuple(train), partition.test, partition.aux, partition.index_space, tuple(val))
