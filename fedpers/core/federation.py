"""A run's data as every participant sees it: dataset + client split, loaded once per process.

Server and clients call :func:`get_federation` with the run's config; the dataset is read and split once
per process (cached), and each client's tensors are moved to the device once and reused every round.

A deployed SuperNode starts a fresh ClientApp process for every message, which would read the whole
dataset and split it again each time (3.4 s for MNIST here) to use one client's samples. With a state
directory, :func:`use_client_slice` saves that client's own samples once (``ClientSlice``) and later
processes read only those.

``dataset: synthetic`` (the FedProx paper's Synthetic(alpha, beta), fedpers/core/synthetic.py) is a
:class:`SyntheticFederation`: nothing is loaded, each client's samples are generated when it is asked for.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedpers.core.data import Dataset, default_data_dir, load_dataset, save_npz_quietly
from fedpers.core.errors import DataError
from fedpers.core.partition import Partition, hold_out_validation, load_partition, make_partition, save_partition
from fedpers.core.schema import Config
from fedpers.core.seeds import VALIDATION_SPLIT, derived_seed
from fedpers.core import synthetic

# Client splits an actor keeps (Federation.client): more than the clients of any one round of the papers' settings,
# so a 20-client study never rebuilds one; a 10,000-client run's actors stay at the size of these.
CLIENTS_KEPT = 64
# Config keys that determine the data and the split (nothing else may change them).
DATA_KEYS = ("dataset", "data_dir", "partition", "partition_file", "alpha", "classes_per_client",
             "min_samples_per_client", "num_clients", "aux_size", "seed", "flwr_partitioner",
             "flwr_partitioner_args", "flwr_test_fraction", "val_fraction", "synthetic_alpha", "synthetic_beta",
             "synthetic_iid")


@dataclass(frozen=True)
class Split:
    """Images and labels of one split, as tensors on one device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class ClientData:
    """One client's train and test splits, and its validation split when one is held out (``val_fraction``)."""

    train: Split
    test: Split
    val: Split | None = None


class Federation:
    """Dataset plus partition, with per-device tensor caches."""

    def __init__(self, dataset: Dataset, partition: Partition):
        self.dataset = dataset
        self.partition = partition
        self._host: tuple[torch.Tensor, ...] | None = None
        self._on_device: dict[tuple, Split] = {}  # the server's splits: Ds, the global test set
        self._clients: OrderedDict[tuple, ClientData] = OrderedDict()  # (partition id, device), least recent first

    @property
    def num_clients(self) -> int:
        """K."""
        return self.partition.num_clients

    @property
    def num_classes(self) -> int:
        """C."""
        return self.dataset.num_classes

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return self.dataset.input_shape

    def _host_tensors(self) -> tuple[torch.Tensor, ...]:
        """(x, y) of the train index space and of the test index space, as CPU tensors sharing the numpy
        arrays' memory (no copy)."""
        if self._host is None:
            d = self.dataset
            if self.partition.index_space == "split":
                arrays = [(d.x_train, d.y_train), (d.x_test, d.y_test)]
            else:  # joined: every index points into concat(x_train, x_test)
                arrays = [(np.concatenate([d.x_train, d.x_test]), np.concatenate([d.y_train, d.y_test]))]
            moved = [tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in pair) for pair in arrays]
            self._host = (*moved[0], *moved[-1])
        return self._host

    def _split(self, key: tuple, x: torch.Tensor, y: torch.Tensor, idx: np.ndarray, device: torch.device) -> Split:
        """The samples ``idx`` of (x, y) on ``device``, built once per key. Only these samples are copied
        to the device: a Ray actor holds on its GPU the data of the clients it serves, not the dataset."""
        if key not in self._on_device:
            self._on_device[key] = _take(x, y, idx, device)
        return self._on_device[key]

    def client(self, partition_id: int, device: torch.device) -> ClientData:
        """Client ``partition_id``'s train/test tensors on ``device``, kept for the ``CLIENTS_KEPT`` clients
        served last: an actor of a 10,000-client run serves thousands of clients, and keeping every one would
        grow its memory to a second copy of the dataset."""
        key = (partition_id, str(device))
        if key in self._clients:
            self._clients.move_to_end(key)
            return self._clients[key]
        data = self._client_data(partition_id, device)
        self._clients[key] = data
        while len(self._clients) > CLIENTS_KEPT:
            self._clients.popitem(last=False)
        return data

    def _client_data(self, partition_id: int, device: torch.device) -> ClientData:
        """Client ``partition_id``'s splits, copied to ``device`` (not kept: :meth:`client` keeps them)."""
        xtr, ytr, xte, yte = self._host_tensors()
        val = self.partition.val
        return ClientData(_take(xtr, ytr, self.partition.train[partition_id], device),
                          _take(xte, yte, self.partition.test[partition_id], device),
                          None if val is None else _take(xtr, ytr, val[partition_id], device))

    def aux(self, device: torch.device) -> Split:
        """The server's labelled auxiliary set Ds."""
        xtr, ytr, _, _ = self._host_tensors()
        return self._split(("aux", str(device)), xtr, ytr, self.partition.aux, device)

    def test(self, device: torch.device) -> Split:
        """The global test set: the whole test split, or in a joined index space the union of the
        clients' test splits (global accuracy of a shared model)."""
        _, _, xte, yte = self._host_tensors()
        if self.partition.index_space == "split":
            idx = np.arange(len(yte))
        else:
            idx = np.sort(np.concatenate(self.partition.test))
        return self._split(("global test", str(device)), xte, yte, idx, device)

    def client_label_counts(self) -> dict[str, dict[str, list[int]]]:
        """Each client's number of samples per class, in its train and its test split, and in its
        validation split when one is held out (the picture of the split, as counts)."""
        d = self.dataset
        if self.partition.index_space == "split":
            y_train, y_test = d.y_train, d.y_test
        else:
            y_train = y_test = np.concatenate([d.y_train, d.y_test])
        c = self.num_classes
        counts = {str(k): {"train": np.bincount(y_train[tr], minlength=c).tolist(),
                           "test": np.bincount(y_test[te], minlength=c).tolist()}
                  for k, (tr, te) in enumerate(zip(self.partition.train, self.partition.test))}
        for k, va in enumerate(self.partition.val or ()):
            counts[str(k)]["val"] = np.bincount(y_train[va], minlength=c).tolist()
        return counts

    @functools.cached_property
    def _test_positions(self) -> list[np.ndarray]:
        if self.partition.index_space == "split":
            return [np.asarray(t, dtype=np.int64) for t in self.partition.test]
        union = np.sort(np.concatenate(self.partition.test))
        return [np.searchsorted(union, t) for t in self.partition.test]

    def test_positions(self) -> list[np.ndarray]:
        """Positions of each client's test samples within :meth:`test` (same order as the client's split)."""
        return self._test_positions

    # --- domain ids (feature-skew data; None for single-domain data) ------------------------------------
    def test_domains(self) -> np.ndarray | None:
        """Domain id of every sample of :meth:`test`, in the same order (None without domain ids)."""
        d = self.dataset
        if d.d_test is None:
            return None
        if self.partition.index_space == "split":
            return d.d_test
        return np.concatenate([d.d_train, d.d_test])[np.sort(np.concatenate(self.partition.test))]

    def client_domains(self) -> list[int] | None:
        """True domain of each client (majority domain of its train split; None without domain ids)."""
        from fedpers.core.domains import client_domains

        return client_domains(self.dataset, self.partition)

    # --- what the server writes and estimates ------------------------------------------------------------
    @property
    def test_covers_every_client(self) -> bool:
        """Whether :meth:`test` holds every client's test split (then each client's accuracy of a shared
        model can be read off it at :meth:`test_positions`): always, for a loaded dataset."""
        return True

    def save_partition(self, path: str | os.PathLike, *, dataset: str) -> None:
        """Write the split as ``partition.npz`` (:func:`fedpers.core.partition.save_partition`), which
        ``partition: file`` reads back."""
        save_partition(path, self.partition, dataset=dataset, num_train=len(self.dataset.y_train),
                       num_test=len(self.dataset.y_test))

    def held_bytes(self) -> int:
        """Bytes of data every process holds once it has loaded the federation: the dataset's arrays, and
        in a joined index space their concatenated copy too."""
        d = self.dataset
        arrays = d.x_train.nbytes + d.x_test.nbytes + d.y_train.nbytes + d.y_test.nbytes
        return 2 * arrays if self.partition.index_space == "joined" else arrays

    def sample_bytes(self) -> int:
        """Bytes of one sample and its label on a device."""
        return self.dataset.x_train[:1].nbytes + 8

    def global_test_size(self) -> int:
        """Samples of :meth:`test`."""
        if self.partition.index_space == "split":
            return len(self.dataset.y_test)
        return sum(len(e) for e in self.partition.test)


@dataclass(frozen=True)
class GeneratedData:
    """What a run reads of a generated dataset without generating it: its name, classes and sample shape,
    and the generator's parameters. Single-domain: no domain ids."""

    name: str
    num_classes: int
    input_shape: tuple[int, int, int]
    alpha: float
    beta: float
    iid: bool
    d_train: None = None
    d_test: None = None
    domain_names: tuple[str, ...] = ()
    num_domains: int = 0


class SplitSizes:
    """One split of every client, as ``range(size)``: the positions of the client's samples in its generated
    split. What the server reads of a split is its length; the sizes are one int64 vector (O(K))."""

    def __init__(self, sizes: np.ndarray):
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, client: int) -> range:
        return range(int(self.sizes[client]))

    def __iter__(self):
        return (range(n) for n in self.sizes.tolist())


@dataclass(frozen=True)
class GeneratedPartition:
    """The split of generated data (:class:`SyntheticFederation`): each client's train, test and validation
    sizes as :class:`SplitSizes`, and Ds as ``range(aux_size)``. The attributes a :class:`Partition` has,
    for the server's reads (sizes, weights)."""

    train: SplitSizes
    test: SplitSizes
    aux: range
    val: SplitSizes | None = None
    index_space: str = "generated"

    @property
    def num_clients(self) -> int:
        """K."""
        return len(self.train)


class SyntheticFederation(Federation):
    """``dataset: synthetic``: the FedProx paper's Synthetic(alpha, beta) (Li et al., MLSys 2020, Sec. 5.1;
    fedpers/core/synthetic.py), with Federation's interface and no dataset in memory.

    Building it draws the K clients' sizes (one O(K) vector); a client's samples are generated when
    :meth:`client` is asked for it, from a stream of its own (seed, client), in O(its samples), and the
    ``CLIENTS_KEPT`` clients served last are kept as Federation keeps them. A client's train split is the first
    ``int(0.9 n)`` of its n samples less its validation split (``val_fraction``: the last
    :func:`fedpers.core.synthetic.validation_sizes` of them), its test split the rest.

    What the server uses is ours and bounded: the global test set (:meth:`test`) is the test splits of at
    most ``GLOBAL_TEST_CLIENTS`` clients (all when K is no more); Ds (:meth:`aux`) is ``aux_size`` samples,
    each drawn from the distribution of a uniformly chosen client; label counts (:meth:`client_label_counts`,
    partition.png) cover the global test set's clients only; the saved partition records sizes."""

    def __init__(self, *, num_clients: int, seed: int, alpha: float, beta: float, iid: bool, aux_size: int,
                 val_fraction: float):
        self.seed, self.alpha, self.beta, self.iid = seed, alpha, beta, iid
        self.dataset = GeneratedData(synthetic.SYNTHETIC, synthetic.NUM_CLASSES, synthetic.INPUT_SHAPE,
                                     alpha, beta, iid)
        self.sizes = synthetic.client_sizes(num_clients, seed)
        train = synthetic.train_sizes(self.sizes)
        val = synthetic.validation_sizes(train, val_fraction) if val_fraction > 0 else None
        self.partition = GeneratedPartition(SplitSizes(train if val is None else train - val),
                                            SplitSizes(self.sizes - train), range(aux_size),
                                            None if val is None else SplitSizes(val))
        self._on_device: dict[tuple, Split] = {}
        self._clients: OrderedDict[tuple, ClientData] = OrderedDict()

    def generate(self, partition_id: int) -> dict[str, np.ndarray]:
        """Client ``partition_id``'s arrays as numpy (:func:`fedpers.core.synthetic.generate_client`)."""
        val = self.partition.val
        return synthetic.generate_client(self.seed, partition_id, int(self.sizes[partition_id]), alpha=self.alpha,
                                         beta=self.beta, iid=self.iid,
                                         num_val=0 if val is None else int(val.sizes[partition_id]))

    def _client_data(self, partition_id: int, device: torch.device) -> ClientData:
        a = {k: torch.from_numpy(v).to(device) for k, v in self.generate(partition_id).items()}
        return ClientData(Split(a["x_train"], a["y_train"]), Split(a["x_test"], a["y_test"]),
                          Split(a["x_val"], a["y_val"]) if "x_val" in a else None)

    def _on(self, name: str, device: torch.device, arrays: tuple[np.ndarray, np.ndarray]) -> Split:
        key = (name, str(device))
        if key not in self._on_device:
            self._on_device[key] = Split(*(torch.from_numpy(a).to(device) for a in arrays))
        return self._on_device[key]

    @functools.cached_property
    def _aux_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return synthetic.server_samples(self.seed, self.num_clients, len(self.partition.aux), alpha=self.alpha,
                                        beta=self.beta, iid=self.iid)

    def aux(self, device: torch.device) -> Split:
        """The server's labelled set Ds (ours): ``aux_size`` samples, each a fresh draw from the distribution
        of a client chosen uniformly (:func:`fedpers.core.synthetic.server_samples`)."""
        return self._on("aux", device, self._aux_arrays)

    @functools.cached_property
    def _test_clients(self) -> tuple[np.ndarray, np.ndarray, dict[str, dict[str, list[int]]]]:
        """(x, y) of the global test set and the label counts of its clients, generated in one pass."""
        xs, ys, counts = [], [], {}
        c = self.num_classes
        for k in synthetic.global_test_clients(self.num_clients, self.seed).tolist():
            arrays = self.generate(k)
            xs.append(arrays["x_test"])
            ys.append(arrays["y_test"])
            counts[str(k)] = {split: np.bincount(arrays[f"y_{split}"], minlength=c).tolist()
                              for split in ("train", "test", "val") if f"y_{split}" in arrays}
        return np.concatenate(xs), np.concatenate(ys), counts

    def test(self, device: torch.device) -> Split:
        """The global test set (ours): the test splits of :func:`fedpers.core.synthetic.global_test_clients`
        (every client up to ``GLOBAL_TEST_CLIENTS``, else a seeded sample of that many), in client order."""
        x, y, _ = self._test_clients
        return self._on("global test", device, (x, y))

    @property
    def test_covers_every_client(self) -> bool:
        """Whether :meth:`test` holds every client's test split: with at most ``GLOBAL_TEST_CLIENTS`` clients."""
        return self.num_clients <= synthetic.GLOBAL_TEST_CLIENTS

    def client_label_counts(self) -> dict[str, dict[str, list[int]]]:
        """Samples per class of the clients of the global test set (all clients up to
        ``GLOBAL_TEST_CLIENTS``), in their train, test and validation splits: counting every client of a
        100,000-client run would generate all of them, and its picture (partition.png) would be unreadable."""
        return self._test_clients[2]

    @functools.cached_property
    def _test_positions(self) -> list[np.ndarray]:
        positions = [np.zeros(0, np.int64)] * self.num_clients
        start = 0
        for k in synthetic.global_test_clients(self.num_clients, self.seed).tolist():
            n = len(self.partition.test[k])
            positions[k] = np.arange(start, start + n, dtype=np.int64)
            start += n
        return positions

    def test_positions(self) -> list[np.ndarray]:
        """Positions of each client's test samples within :meth:`test`; empty for a client outside it."""
        return self._test_positions

    def test_domains(self) -> None:
        """None: generated data have no domain ids."""
        return None

    def client_domains(self) -> None:
        """None: generated data have no domain ids."""
        return None

    def save_partition(self, path: str | os.PathLike, *, dataset: str) -> None:
        """Write ``partition.npz`` with what determines the generated split: each client's train, test (and
        validation) sizes, ``aux_size``, the generator's parameters and seed; no sample indices (there are
        no stored samples to index)."""
        p = self.partition
        val = {} if p.val is None else {"val_sizes": p.val.sizes}
        np.savez(path, train_sizes=p.train.sizes, test_sizes=p.test.sizes, **val,
                 aux_size=np.array(len(p.aux), dtype=np.int64), index_space=np.array(p.index_space),
                 dataset=np.array(dataset), seed=np.array(self.seed, dtype=np.int64),
                 synthetic_alpha=np.array(self.alpha), synthetic_beta=np.array(self.beta),
                 synthetic_iid=np.array(self.iid))

    def held_bytes(self) -> int:
        """Bytes every process holds once built: the size vectors (no samples until a client is asked for)."""
        p = self.partition
        return self.sizes.nbytes + sum(split.sizes.nbytes for split in (p.train, p.test, p.val) if split is not None)

    def sample_bytes(self) -> int:
        """Bytes of one sample (60 float32) and its label on a device."""
        return 4 * int(np.prod(self.input_shape)) + 8

    def global_test_size(self) -> int:
        """Samples of :meth:`test`, from the sizes (nothing is generated)."""
        return int(self.partition.test.sizes[synthetic.global_test_clients(self.num_clients, self.seed)].sum())


def device_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the memory layout the models train fastest in on its device: a batch of multi-channel
    images on the CPU in channels-last (NHWC) order, anything else as it is.

    The values are the same; only the order in memory changes, and with it the kernels PyTorch picks:
    oneDNN's channels-last convolutions and the vectorised channels-last max-pool and GroupNorm, which were
    faster or level for every multi-channel model we train, in training steps and evaluations, on one thread
    and two (benchmarks/memory_format.py measures both layouts side by side). On 1-channel images the two
    layouts are one. Batches sliced or indexed from such a tensor keep its layout, so every training step
    and evaluation gets it. Sums taken in another order round differently: a run of 3-channel images gives
    the numbers it gave in channels-first order up to rounding, not bit for bit. On CUDA the layout stays as
    it was (not measured there)."""
    if x.device.type == "cpu" and x.dim() == 4 and x.shape[1] > 1:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _take(x: torch.Tensor, y: torch.Tensor, idx: np.ndarray, device: torch.device) -> Split:
    """Samples ``idx`` of (x, y), copied to ``device`` (images in :func:`device_layout`)."""
    rows = torch.as_tensor(np.asarray(idx, dtype=np.int64))
    return Split(device_layout(x[rows].to(device)), y[rows].to(device))


@functools.lru_cache(maxsize=4)
def _federation(dataset: str, data_dir: str, partition: str, partition_file: str, alpha: float,
                classes_per_client: int, min_samples_per_client: int, num_clients: int, aux_size: int,
                seed: int, flwr_partitioner: str, flwr_partitioner_args: str, flwr_test_fraction: float,
                val_fraction: float, synthetic_alpha: float, synthetic_beta: float, synthetic_iid: bool) -> Federation:
    if dataset == synthetic.SYNTHETIC:  # generated per client: nothing to load or split
        return SyntheticFederation(num_clients=num_clients, seed=seed, alpha=synthetic_alpha, beta=synthetic_beta,
                                   iid=synthetic_iid, aux_size=aux_size, val_fraction=val_fraction)
    data = load_dataset(dataset, data_dir)
    if partition == "file":
        split = load_partition(partition_file, num_train=len(data.y_train), num_test=len(data.y_test), dataset=dataset)
        if split.num_clients != num_clients:
            raise DataError(f"num_clients={num_clients} but partition file {partition_file} has "
                            f"{split.num_clients} clients")
    elif partition == "flwr":  # a flwr-datasets partitioner (optional extra)
        from fedpers.core.flwr_partition import flwr_partition

        split = flwr_partition(np.concatenate([data.y_train, data.y_test]), len(data.y_train),
                               num_clients=num_clients, partitioner=flwr_partitioner,
                               arguments=flwr_partitioner_args, aux_size=aux_size, seed=seed,
                               test_fraction=flwr_test_fraction)
    elif partition == "domain":  # feature skew: one domain per client (fedpers/core/domains.py)
        from fedpers.core.domains import domain_partition

        split = domain_partition(data.y_train, data.y_test, data.d_train, data.d_test, num_clients=num_clients,
                                 aux_size=aux_size, seed=seed, num_classes=data.num_classes)
    else:
        split = make_partition(
            data.y_train, data.y_test, num_clients=num_clients, scheme=partition, alpha=alpha,
            classes_per_client=classes_per_client, aux_size=aux_size, seed=seed,
            min_samples_per_client=min_samples_per_client, num_classes=data.num_classes,
        )
    if val_fraction > 0:
        train_labels = data.y_train if split.index_space == "split" else np.concatenate([data.y_train, data.y_test])
        split = hold_out_validation(split, train_labels, val_fraction,
                                    np.random.default_rng(derived_seed(seed, VALIDATION_SPLIT)))
    return Federation(data, split)


def get_federation(cfg: Config) -> Federation:
    """The run's Federation, loaded and split once per process (inside :func:`use_client_slice`: that
    client's slice)."""
    keys = tuple(cfg[k] for k in DATA_KEYS)
    view = _client_view.get()
    if view is not None and view.keys == keys:
        return view  # type: ignore[return-value]  # the client-side subset of Federation's interface
    fed = _federation(*keys)
    _built.add(keys)
    return fed


# --------------------------------------------------------------------------------------------------
# one client's slice, for processes that serve one message of one client
# --------------------------------------------------------------------------------------------------
SLICE_FORMAT = 2  # 2: the validation split travels with the slice
_client_view: contextvars.ContextVar["ClientSlice | None"] = contextvars.ContextVar("client_view", default=None)
_built: set[tuple] = set()  # data-key values whose whole Federation this process has built


class ClientSlice:
    """What a client needs of the Federation (its size, classes, image shape and its own samples),
    without the rest of the dataset."""

    def __init__(self, keys: tuple, partition_id: int, num_clients: int, num_classes: int,
                 arrays: dict[str, np.ndarray]):
        self.keys, self.partition_id = keys, partition_id
        self.num_clients, self.num_classes = num_clients, num_classes
        self._arrays = arrays
        self._on_device: dict[str, ClientData] = {}

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return tuple(int(d) for d in self._arrays["x_train"].shape[1:])  # type: ignore[return-value]

    def client(self, partition_id: int, device: torch.device) -> ClientData:
        """This client's train/test tensors on ``device`` (another partition id is a DataError)."""
        if partition_id != self.partition_id:
            raise DataError(f"client slice of partition {self.partition_id} asked for partition {partition_id}")
        if str(device) not in self._on_device:
            a = {k: device_layout(torch.from_numpy(np.ascontiguousarray(v)).to(device))
                 for k, v in self._arrays.items()}
            self._on_device[str(device)] = ClientData(Split(a["x_train"], a["y_train"]), Split(a["x_test"], a["y_test"]),
                                                      Split(a["x_val"], a["y_val"]) if "x_val" in a else None)
        return self._on_device[str(device)]


def data_key(cfg: Config) -> str:
    """Hash of what determines the data and the split: the data keys, and the size and modification time
    of every file they can read (the dataset or partition file, every .npz in data_dir)."""
    files = [Path(str(cfg[k])) for k in ("dataset", "partition_file") if str(cfg[k]) and Path(str(cfg[k])).is_file()]
    root = Path(cfg.data_dir) if cfg.data_dir else default_data_dir()
    files += sorted(root.glob("*.npz")) if root.is_dir() else []
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    blob = json.dumps({"keys": [cfg[k] for k in DATA_KEYS], "files": stats, "format": SLICE_FORMAT}, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def client_slice_path(state_dir: str | os.PathLike, partition_id: int, key: str) -> Path:
    """Where client ``partition_id``'s slice of the data ``key`` is kept in a state directory (beside the
    clients' ``partition-<id>/`` state folders, not in them: those hold only client state)."""
    return Path(state_dir) / "data" / f"partition-{partition_id}-{key}.npz"


@contextlib.contextmanager
def use_client_slice(cfg: Config, partition_id: int, state_dir: str):
    """Within this block, :func:`get_federation` gives client ``partition_id``'s slice, read from
    ``state_dir`` if saved there before; otherwise the whole Federation is built (as always) and the
    slice saved for the next process. Without a state dir, or when this process already holds the whole
    Federation (a simulation actor serving many clients), nothing changes."""
    keys = tuple(cfg[k] for k in DATA_KEYS)
    # Generated data are not sliced: the process generates its client (O(its samples), plus the O(K) size
    # vector: 2 ms for the median client of Synthetic(1, 1)) and leaves no file that could go stale
    if not state_dir or keys in _built or cfg.dataset == synthetic.SYNTHETIC:
        yield
        return
    path = client_slice_path(state_dir, partition_id, data_key(cfg))
    view = _read_slice(path, keys, partition_id)
    if view is None:
        fed = get_federation(cfg)
        _write_slice(path, fed, partition_id)
        yield
        return
    token = _client_view.set(view)
    try:
        yield
    finally:
        _client_view.reset(token)


def _read_slice(path: Path, keys: tuple, partition_id: int) -> ClientSlice | None:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
            arrays.update({k: f[k] for k in ("x_val", "y_val") if k in f.files})
            meta = json.loads(str(f["meta"]))
    except (OSError, KeyError, ValueError):
        return None  # none yet, or unreadable: rebuilt from the dataset
    return ClientSlice(keys, partition_id, int(meta["num_clients"]), int(meta["num_classes"]), arrays)


def _write_slice(path: Path, fed: Federation, partition_id: int) -> None:
    """Save the slice atomically; a failure leaves no file and changes nothing else. Private (0600) as
    the client state beside it."""
    data = fed.client(partition_id, torch.device("cpu"))
    meta = json.dumps({"num_clients": fed.num_clients, "num_classes": fed.num_classes})
    val = {} if data.val is None else {"x_val": data.val.x.numpy(), "y_val": data.val.y.numpy()}
    save_npz_quietly(path, 0o600, x_train=data.train.x.numpy(), y_train=data.train.y.numpy(),
                     x_test=data.test.x.numpy(), y_test=data.test.y.numpy(), meta=np.array(meta), **val)
