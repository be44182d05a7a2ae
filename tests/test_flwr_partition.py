"""partition: flwr: a flwr-datasets partitioner applied to the loaded arrays gives exactly the clients that
flwr-datasets itself gives on the same labels and seed."""

import sys

import numpy as np
import pytest

from fedpers.registry.config import build_config
from fedpers.core.errors import ConfigError
from fedpers.core.federation import get_federation


def flwr_cfg(partitioner="DirichletPartitioner", args="{alpha: 0.5}", **extra):
    return build_config({"dataset": "digits", "num_clients": 5, "aux_size": 100, "seed": 3, "partition": "flwr",
                         "flwr_partitioner": partitioner, "flwr_partitioner_args": args, **extra})


def test_dirichlet_partitioner_gives_the_same_clients_as_flwr_datasets_itself():
    from datasets import Dataset as HFDataset
    from flwr_datasets.partitioner import DirichletPartitioner

    fed = get_federation(flwr_cfg())
    d = fed.dataset
    y = np.concatenate([d.y_train, d.y_test])
    pool = np.setdiff1d(np.arange(len(y)), fed.partition.aux)
    reference = DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.5, seed=3)
    reference.dataset = HFDataset.from_dict({"label": y[pool], "row": np.arange(len(pool))})
    assert fed.partition.index_space == "joined" and len(fed.partition.aux) == 100
    for c in range(5):
        expected = np.sort(pool[np.asarray(reference.load_partition(c)["row"])])
        ours = np.sort(np.concatenate([fed.partition.train[c], fed.partition.test[c]]))
        np.testing.assert_array_equal(ours, expected)
        assert len(fed.partition.test[c]) == round(0.25 * len(expected))  # flwr_test_fraction
        assert np.intersect1d(fed.partition.train[c], fed.partition.test[c]).size == 0


def test_pathological_and_shard_partitioners_with_their_arguments():
    fed = get_federation(flwr_cfg("PathologicalPartitioner", "{num_classes_per_partition: 2}"))
    y = np.concatenate([fed.dataset.y_train, fed.dataset.y_test])
    for c in range(5):
        assert len(np.unique(y[np.concatenate([fed.partition.train[c], fed.partition.test[c]])])) <= 2
    fed = get_federation(flwr_cfg("ShardPartitioner", "{num_shards_per_partition: 2, shard_size: 60}"))
    assert all(len(t) + len(e) == 120 for t, e in zip(fed.partition.train, fed.partition.test))


def test_bad_partitioner_name_arguments_and_missing_extra_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="'NoSuchPartitioner' is not a flwr-datasets partitioner; known: .*Dirichlet"):
        get_federation(flwr_cfg("NoSuchPartitioner"))
    with pytest.raises(ConfigError, match="flwr_partitioner_args.*DirichletPartitioner"):
        get_federation(flwr_cfg(args="{alpah: 0.5}"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        get_federation(flwr_cfg(args="[1, 2]"))
    monkeypatch.setitem(sys.modules, "flwr_datasets", None)
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", None)
    with pytest.raises(ConfigError, match=r"needs flwr-datasets: pip install 'fedpers\[flwr\]'"):
        get_federation(flwr_cfg(seed=4))
