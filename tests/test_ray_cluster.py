"""The same runs on a real two-node Ray cluster (a head and a worker node as separate processes on
127.0.0.1, one CPU each, started and stopped by the test by PID)."""

import threading
import time

import pytest

from fedpers.core.cluster import LocalRayCluster, check_data_on_nodes
from fedpers.registry.config import build_config
from fedpers.core.errors import DataError
from fedpers.core.results import read_metrics, read_summary
from fedpers.apps.simulation import run_simulation
from tests.conftest import tiny_overrides

pytestmark = pytest.mark.simulation


@pytest.fixture(scope="module")
def cluster():
    try:
        c = LocalRayCluster(num_nodes=2, cpus_per_node=1)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"Ray cannot start a local two-node cluster here: {exc}")
    try:
        yield c
    finally:
        c.stop()


def cluster_config(cluster, tmp_path, **extra):
    return build_config(tiny_overrides(method="pfedkdh", num_clients=4, fraction_fit=1.0,
                                       ray_address=cluster.address, out_dir=str(tmp_path), **extra))


def test_data_check_names_the_node_and_path(cluster, tmp_path):
    cfg = cluster_config(cluster, tmp_path)
    assert check_data_on_nodes(cfg) == 2
    with pytest.raises(DataError, match="cannot read .*missing.npz"):
        check_data_on_nodes(cfg.replace(dataset=str(tmp_path / "missing.npz")))


def test_two_node_run_places_clients_on_both_nodes_and_keeps_state(cluster, tmp_path):
    run_simulation(cluster_config(cluster, tmp_path, rounds=2))
    rounds = read_metrics(tmp_path)
    assert [r["round"] for r in rounds] == [1, 2]
    nodes = {node for r in rounds for node in r["fit_nodes"].values()}
    assert len(nodes) == 2  # clients ran on both nodes
    # every client's private head at evaluation is the one it trained last, wherever it ran
    assert all(r["client_state_consistent"] for r in rounds)
    assert all(r["evaluated_clients"] == 4 for r in rounds)
    assert read_summary(tmp_path)["final"]["personalized_macro_acc"] is not None


def test_worker_node_dying_mid_run_does_not_hang_the_run(cluster, tmp_path):
    cfg = cluster_config(cluster, tmp_path, rounds=4, local_epochs=2)
    metrics = tmp_path / "metrics.jsonl"

    def kill_worker_after_round_one():
        deadline = time.time() + 180
        while time.time() < deadline:
            if metrics.exists() and metrics.read_text().strip():
                cluster.kill_node(1)
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_worker_after_round_one, daemon=True)
    killer.start()
    started = time.time()
    run_simulation(cfg)
    killer.join(timeout=5)
    rounds = read_metrics(tmp_path)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]  # finished with the remaining node
    assert sum(r["failed_clients"] for r in rounds[1:]) > 0  # the dead node's messages failed...
    assert all(r["evaluated_clients"] >= 1 for r in rounds)  # ...and the rest went on
    assert time.time() - started < 300
