"""Explicit partitions: every run's split as partition.npz, and runs on a given split."""

import numpy as np
import pytest

from fedpers.registry.config import build_config, load_config
from fedpers.core.data import load_digits_dataset
from fedpers.core.errors import ConfigError, DataError
from fedpers.core.federation import get_federation
from fedpers.core.partition import load_partition, make_partition, save_partition
from fedpers.registry.methods import federation_for
from fedpers.core.results import read_metrics
from fedpers.apps.inprocess import run_in_process
from tests.conftest import tiny_overrides


@pytest.fixture(scope="module")
def digits():
    return load_digits_dataset()


def pflib_style_joined(digits, num_clients=4, seed=0, aux=0):
    """All train+test samples spread over clients, 75/25 train/test per client (PFLlib's generator)."""
    n = len(digits.y_train) + len(digits.y_test)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    aux_idx, rest = order[:aux], order[aux:]
    arrays = {}
    for c, chunk in enumerate(np.array_split(rest, num_clients)):
        cut = int(0.75 * len(chunk))
        arrays[f"train_{c}"], arrays[f"test_{c}"] = np.sort(chunk[:cut]), np.sort(chunk[cut:])
    return dict(arrays, aux=np.sort(aux_idx).astype(np.int64), index_space=np.array("joined"),
                dataset=np.array("digits"), num_samples=np.array(n))


def write(tmp_path, name, arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


def test_save_load_round_trip(digits, tmp_path):
    p = make_partition(digits.y_train, digits.y_test, num_clients=5, scheme="dirichlet", alpha=0.3,
                       aux_size=40, seed=3)
    path = tmp_path / "partition.npz"
    save_partition(path, p, dataset="digits", num_train=len(digits.y_train), num_test=len(digits.y_test))
    q = load_partition(path, num_train=len(digits.y_train), num_test=len(digits.y_test))
    assert q.index_space == "split" and q.num_clients == 5
    for a, b in zip(p.train + p.test + (p.aux,), q.train + q.test + (q.aux,)):
        np.testing.assert_array_equal(a, b)
    with np.load(path) as f:
        assert str(f["dataset"]) == "digits" and int(f["num_samples"]) == len(digits.y_train) + len(digits.y_test)


def test_num_clients_comes_from_the_file(digits, tmp_path):
    path = write(tmp_path, "p.npz", pflib_style_joined(digits, num_clients=4, aux=50))
    cfg = load_config(None, [f"partition_file={path}", "partition=file", "dataset=digits", "method=fedavg"])
    assert cfg.num_clients == 4
    with pytest.raises(ConfigError, match="'num_clients': 7 given, but partition file"):
        load_config(None, [f"partition_file={path}", "partition=file", "dataset=digits", "num_clients=7"])
    with pytest.raises(ConfigError, match="partition_file"):
        build_config({"partition": "file"})


def test_joined_federation_uses_the_file_and_its_union_of_test_splits(digits, tmp_path):
    path = write(tmp_path, "p.npz", pflib_style_joined(digits, num_clients=4, aux=50))
    cfg = build_config(tiny_overrides(method="pfedkdh", partition="file", partition_file=path, num_clients=4))
    fed = get_federation(cfg)
    assert fed.partition.index_space == "joined" and len(fed.partition.aux) == 50
    total = len(digits.y_train) + len(digits.y_test)
    assert len(fed.test("cpu")) + sum(len(t) for t in fed.partition.train) + 50 == total


@pytest.mark.parametrize("mutate, message", [
    (lambda a: a.update(num_samples=np.array(70000)), "num_samples=70000 but the dataset has"),
    (lambda a: a.update(train_0=np.array([0, 10**6])), "outside"),
    (lambda a: a.update(test_1=np.concatenate([a["test_1"], a["train_1"][:1]])), "client 1's train and test"),
    (lambda a: a.update(aux=a["train_2"][:3]), "aux overlaps client data"),
    (lambda a: a.update(index_space=np.array("weird")), "index_space"),
    (lambda a: a.update(train_0=np.array([0.5, 1.5])), "integer index array"),
    (lambda a: a.pop("test_3"), "matching test_<c>"),
])
def test_malformed_partition_files_fail_clearly(digits, tmp_path, mutate, message):
    arrays = pflib_style_joined(digits, num_clients=4, aux=20)
    mutate(arrays)
    path = write(tmp_path, "bad.npz", arrays)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace("'", "'")):
        load_partition(path, num_train=len(digits.y_train), num_test=len(digits.y_test))


def test_method_needing_aux_says_none_is_left(digits, tmp_path):
    path = write(tmp_path, "noaux.npz", pflib_style_joined(digits, num_clients=4, aux=0))
    cfg = build_config(tiny_overrides(method="pfedkdh", partition="file", partition_file=path, num_clients=4))
    with pytest.raises(DataError, match="needs the server's auxiliary set Ds, but partition file .* leaves none"):
        federation_for(cfg)
    with pytest.raises(DataError, match="not found"):
        get_federation(cfg.replace(partition_file=str(tmp_path / "missing.npz")))


@pytest.mark.simulation
def test_round_trip_run_gives_same_clients_and_first_round(tmp_path):
    # in-process: the split is written and read by server_fn and the clients, the same in every engine
    first = build_config(tiny_overrides(method="fedavg", rounds=1, out_dir=str(tmp_path / "a"), fraction_fit=0.67))
    run_in_process(first)
    saved = tmp_path / "a" / "partition.npz"
    second = first.replace(partition="file", partition_file=str(saved), out_dir=str(tmp_path / "b"))
    run_in_process(second)
    a, b = read_metrics(tmp_path / "a")[0], read_metrics(tmp_path / "b")[0]
    for key in ("per_client_acc", "global_acc", "train_loss", "fit_clients"):
        assert a[key] == b[key], key
    with np.load(saved) as f1, np.load(tmp_path / "b" / "partition.npz") as f2:
        assert all(np.array_equal(f1[k], f2[k]) for k in f1.files if k.startswith(("train_", "test_", "aux")))


@pytest.mark.simulation
def test_pflib_joined_split_runs_fedavg(digits, tmp_path):
    path = write(tmp_path, "pflib.npz", pflib_style_joined(digits, num_clients=3, aux=0))
    cfg = build_config(tiny_overrides(method="fedavg", rounds=1, partition="file", partition_file=path,
                                      out_dir=str(tmp_path / "run")))
    run_in_process(cfg)
    rec = read_metrics(tmp_path / "run")[0]
    assert set(rec["per_client_acc"]) == {"0", "1", "2"} and rec["global_acc"] is not None


def test_a_partition_file_made_for_another_dataset_of_the_same_size_is_refused(digits, tmp_path):
    """The file records the dataset it was made for; the same sample counts do not make the same images.
    A name written with its folder or .npz, or with a hyphen, is the same dataset."""
    arrays = pflib_style_joined(digits, num_clients=3)
    n_train, n_test = len(digits.y_train), len(digits.y_test)
    path = write(tmp_path, "p.npz", {**arrays, "dataset": np.array("fmnist.npz")})
    with pytest.raises(DataError, match="made for dataset 'fmnist.npz', not 'digits'"):
        load_partition(path, num_train=n_train, num_test=n_test, dataset="digits")
    for same in ("digits", "../data/digits.npz", "Digits"):
        assert load_partition(write(tmp_path, "q.npz", {**arrays, "dataset": np.array("digits.npz")}),
                              num_train=n_train, num_test=n_test, dataset=same).num_clients == 3
