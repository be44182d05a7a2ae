"""``partition: flwr``: a client split made by one of flwr-datasets' partitioners, so a study uses exactly
the split of a Flower baseline (optional extra: ``pip install 'fedpers[flwr]'``).

The partitioner (``flwr_partitioner``, a class name of ``flwr_datasets.partitioner``, with keyword
arguments ``flwr_partitioner_args``, a YAML/JSON mapping such as ``{alpha: 0.3, min_partition_size: 10}``)
is applied, with ``num_partitions = num_clients``, ``partition_by = "label"`` and ``seed = seed`` (where the class takes
them) unless the arguments name them, to the labels of all samples (train then test split, the ``joined`` index space)
less the server's auxiliary set Ds (drawn from the train split first, as for the other schemes). Each
client's partition is then split at random (seeded) into train and test, ``flwr_test_fraction`` of it
(default 0.25, PFLlib's 75/25) to test, as Flower baselines do with
``partition.train_test_split(test_size=..., seed=...)``.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from fedpers.core.errors import ConfigError, DataError
from fedpers.core.partition import Partition


def partitioner_kwargs(text: str) -> dict[str, Any]:
    """The ``flwr_partitioner_args`` mapping (YAML flow or JSON text; '' = none)."""
    from fedpers.core.schema import read_yaml_text

    if not text.strip():
        return {}
    try:
        value = read_yaml_text(text)
    except Exception:  # noqa: BLE001 - any YAML error is the same bad input
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"config key 'flwr_partitioner_args': expected a mapping like '{{alpha: 0.5}}', got {text!r}")
    return value


def flwr_partition(y_joined: np.ndarray, n_train: int, *, num_clients: int, partitioner: str, arguments: str,
                   aux_size: int, seed: int, test_fraction: float) -> Partition:
    """The split described in the module docstring; ``y_joined`` = concat(y_train, y_test)."""
    try:
        import flwr_datasets.partitioner as partitioners
        from datasets import Dataset as HFDataset
    except ImportError:
        raise ConfigError("partition=flwr needs flwr-datasets: pip install 'fedpers[flwr]'") from None
    cls = getattr(partitioners, partitioner, None)
    if not (isinstance(cls, type) and issubclass(cls, partitioners.Partitioner)):
        known = sorted(n for n in dir(partitioners) if n.endswith("Partitioner") and n != "Partitioner")
        raise ConfigError(f"config key 'flwr_partitioner': {partitioner!r} is not a flwr-datasets partitioner; "
                          f"known: {', '.join(known)}")
    if aux_size >= n_train:
        raise DataError(f"aux_size={aux_size} leaves no training data (the train split has {n_train} samples)")
    rng = np.random.default_rng(seed)
    aux = np.sort(rng.choice(n_train, size=aux_size, replace=False)).astype(np.int64)
    pool = np.setdiff1d(np.arange(len(y_joined)), aux)
    # partition_by and seed only where the class takes them: IidPartitioner, e.g., takes neither
    accepted = inspect.signature(cls).parameters
    defaults = {"num_partitions": num_clients, "partition_by": "label", "seed": seed}
    kwargs = {**{k: v for k, v in defaults.items() if k == "num_partitions" or k in accepted},
              **partitioner_kwargs(arguments)}
    try:
        split = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"config key 'flwr_partitioner_args': {partitioner}: {exc}") from None
    split.dataset = HFDataset.from_dict({"label": y_joined[pool].astype(np.int64), "index": pool})
    train, test = [], []
    for client in range(num_clients):
        try:
            indices = np.asarray(split.load_partition(client)["index"], dtype=np.int64)
        except (ValueError, KeyError) as exc:
            raise DataError(f"partition=flwr: {partitioner} could not make {num_clients} clients: {exc}") from None
        order = np.random.default_rng([seed, client]).permutation(len(indices))
        n_test = int(round(test_fraction * len(indices)))
        test.append(np.sort(indices[order[:n_test]]))
        train.append(np.sort(indices[order[n_test:]]))
        if len(train[-1]) == 0 or len(test[-1]) == 0:
            raise DataError(f"partition=flwr: client {client} gets {len(indices)} samples, too few for a train and "
                            f"a test split (flwr_test_fraction={test_fraction})")
    return Partition(tuple(train), tuple(test), aux, "joined")
