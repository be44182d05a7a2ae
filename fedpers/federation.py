"""A run's data as every participant sees it: dataset + client split, loaded once per process.

Server and clients call :func:`get_federation` with the run's config; the dataset is read and split once
per process (cached), and each client's tensors are moved to the device once and reused every round.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from fedpers.data import Dataset, load_dataset
from fedpers.errors import DataError
from fedpers.partition import Partition, load_partition, make_partition
from fedpers.schema import Config

# Config keys that determine the data and the split (nothing else may change them).
DATA_KEYS = ("dataset", "data_dir", "partition", "partition_file", "alpha", "classes_per_client",
             "min_samples_per_client", "num_clients", "aux_size", "seed", "flwr_partitioner",
             "flwr_partitioner_args", "flwr_test_fraction")


@dataclass(frozen=True)
class Split:
    """Images and labels of one split, as tensors on one device."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class ClientData:
    """One client's train and test splits."""

    train: Split
    test: Split


class Federation:
    """Dataset plus partition, with per-device tensor caches."""

    def __init__(self, dataset: Dataset, partition: Partition):
        self.dataset = dataset
        self.partition = partition
        self._host: tuple[torch.Tensor, ...] | None = None
        self._on_device: dict[tuple, Split] = {}

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
            rows = torch.as_tensor(np.asarray(idx, dtype=np.int64))
            self._on_device[key] = Split(x[rows].to(device), y[rows].to(device))
        return self._on_device[key]

    def client(self, partition_id: int, device: torch.device) -> ClientData:
        """Client ``partition_id``'s train/test tensors on ``device`` (built once, then reused)."""
        xtr, ytr, xte, yte = self._host_tensors()
        return ClientData(
            self._split(("train", partition_id, str(device)), xtr, ytr, self.partition.train[partition_id], device),
            self._split(("test", partition_id, str(device)), xte, yte, self.partition.test[partition_id], device))

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
        """Each client's number of samples per class, in its train and its test split (the picture of the
        split, as counts)."""
        d = self.dataset
        if self.partition.index_space == "split":
            y_train, y_test = d.y_train, d.y_test
        else:
            y_train = y_test = np.concatenate([d.y_train, d.y_test])
        c = self.num_classes
        return {str(k): {"train": np.bincount(y_train[tr], minlength=c).tolist(),
                         "test": np.bincount(y_test[te], minlength=c).tolist()}
                for k, (tr, te) in enumerate(zip(self.partition.train, self.partition.test))}

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
        from fedpers.domains import client_domains

        return client_domains(self.dataset, self.partition)


@functools.lru_cache(maxsize=4)
def _federation(dataset: str, data_dir: str, partition: str, partition_file: str, alpha: float,
                classes_per_client: int, min_samples_per_client: int, num_clients: int, aux_size: int,
                seed: int, flwr_partitioner: str, flwr_partitioner_args: str, flwr_test_fraction: float) -> Federation:
    data = load_dataset(dataset, data_dir)
    if partition == "file":
        split = load_partition(partition_file, num_train=len(data.y_train), num_test=len(data.y_test))
        if split.num_clients != num_clients:
            raise DataError(f"num_clients={num_clients} but partition file {partition_file} has "
                            f"{split.num_clients} clients")
    elif partition == "flwr":  # a flwr-datasets partitioner (optional extra)
        from fedpers.flwr_partition import flwr_partition

        split = flwr_partition(np.concatenate([data.y_train, data.y_test]), len(data.y_train),
                               num_clients=num_clients, partitioner=flwr_partitioner,
                               arguments=flwr_partitioner_args, aux_size=aux_size, seed=seed,
                               test_fraction=flwr_test_fraction)
    elif partition == "domain":  # feature skew: one domain per client (fedpers/domains.py)
        from fedpers.domains import domain_partition

        split = domain_partition(data.y_train, data.y_test, data.d_train, data.d_test, num_clients=num_clients,
                                 aux_size=aux_size, seed=seed, num_classes=data.num_classes)
    else:
        split = make_partition(
            data.y_train, data.y_test, num_clients=num_clients, scheme=partition, alpha=alpha,
            classes_per_client=classes_per_client, aux_size=aux_size, seed=seed,
            min_samples_per_client=min_samples_per_client, num_classes=data.num_classes,
        )
    return Federation(data, split)


def get_federation(cfg: Config) -> Federation:
    """The run's Federation, loaded and split once per process."""
    return _federation(*(cfg[k] for k in DATA_KEYS))
