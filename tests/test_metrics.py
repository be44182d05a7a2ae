"""The accuracies people compare, on a hand-made 3-client example: personalized macro (equal weight per
client), personalized sample-weighted, and the best / last-5 summaries of a run's history."""

import pytest

from fedpers.core.results import accuracy_summary
from strategies.rounds import mean_of, weighted_mean


def test_macro_and_weighted_personalized_accuracy_of_three_clients():
    # client 0: 9 of 10 right, client 1: 1 of 2, client 2: 30 of 40
    per_client = {0: 0.9, 1: 0.5, 2: 0.75}
    counts = {0: 10, 1: 2, 2: 40}
    assert mean_of(per_client.values()) == pytest.approx((0.9 + 0.5 + 0.75) / 3)  # 0.7166..., the paper's
    assert weighted_mean(per_client, counts) == pytest.approx((9 + 1 + 30) / 52)  # 0.7692..., PFLlib's
    assert weighted_mean(per_client, {0: 10, 1: 2}) == pytest.approx(10 / 12)  # a client without a count
    assert weighted_mean({}, counts) is None


def test_best_value_its_round_and_mean_of_the_last_five_evaluated_rounds():
    history = [{"round": r, "global_acc": g, "personalized_macro_acc": p}
               for r, g, p in [(1, 0.5, None), (2, 0.7, 0.6), (3, 0.9, 0.8), (4, 0.6, 0.8), (5, 0.8, 0.7),
                               (6, 0.9, None), (7, 0.4, 0.5)]]
    s = accuracy_summary(history)
    assert s["best"] == {"global_acc": 0.9, "personalized_macro_acc": 0.8}
    assert s["best_round"] == {"global_acc": 3, "personalized_macro_acc": 3}  # the earliest on ties
    assert s["mean_last_5_evaluated"]["global_acc"] == pytest.approx((0.9 + 0.6 + 0.8 + 0.9 + 0.4) / 5)
    # personalized accuracy was evaluated in rounds 2, 3, 4, 5, 7 only: those five
    assert s["mean_last_5_evaluated"]["personalized_macro_acc"] == pytest.approx((0.6 + 0.8 + 0.8 + 0.7 + 0.5) / 5)


def test_label_distribution_picture_has_one_row_per_client(tmp_path):
    """partition.png: a clients x classes count matrix (read back from the image's pixel rows is fragile,
    so the drawn matrix is checked through matplotlib's own image object)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedpers.core.run_figures import label_distribution_png

    counts = {"0": {"train": [5, 0, 1]}, "1": {"train": [0, 7, 0]}, "2": {"train": [2, 2, 2]},
              "3": {"train": [0, 0, 9]}}
    captured = {}
    original = plt.Axes.imshow

    def spy(self, data, *args, **kwargs):
        captured["matrix"] = data
        return original(self, data, *args, **kwargs)

    plt.Axes.imshow = spy
    try:
        path = label_distribution_png(counts, tmp_path / "partition.png")
    finally:
        plt.Axes.imshow = original
    assert path.is_file() and path.stat().st_size > 1000
    assert captured["matrix"].tolist() == [[5, 0, 1], [0, 7, 0], [2, 2, 2], [0, 0, 9]]  # one row per client


def test_wandb_offline_logs_every_round_and_the_summary(tmp_path):
    """wandb: offline writes a run under OUT/wandb with every round's numbers (no network, no process left)."""
    from fedpers.core.results import ResultsWriter

    writer = ResultsWriter(tmp_path, wandb="offline", config={"method": "fedavg", "alpha": 0.5})
    for r in (1, 2):
        writer.append_round({"round": r, "global_acc": 0.25 * r, "personalized_macro_acc": None,
                             "personalized_weighted_acc_probe": 0.125, "per_client_acc": None, "train_loss": 1.0,
                             "bytes_up": 1, "bytes_down": 1, "round_seconds": 0.1})
    writer.write_summary({"method": "fedavg", "final": {"global_acc": 0.5}, "config": {"alpha": 0.5}})
    logs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1 and writer.wandb_run is None  # finished with the summary
    data = logs[0].read_bytes()
    assert b"global_acc" in data and b"personalized_weighted_acc_probe" in data and b"train_loss" in data


@pytest.mark.simulation
@pytest.mark.parametrize("dataset", ["digits", "mnist"])
def test_memory_estimate_is_within_25_percent_of_the_measured_peak(tmp_path, dataset):
    """The one-line estimate fedpers run prints before it starts, against the peak PSS of its process tree
    (driver, Ray's processes, client actors) sampled while it runs. MNIST where the shared file is here."""
    import os
    import re
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    from fedpers.apps.memory import tree_pss

    root = Path(__file__).resolve().parents[1]
    data = {"digits": "digits", "mnist": str(root.parent / "shared" / "data" / "mnist.npz")}[dataset]
    if dataset == "mnist" and not Path(data).is_file():
        pytest.skip("../shared/data/mnist.npz is not on this machine")
    cmd = [sys.executable, "-m", "fedpers", "run", "--out", str(tmp_path / "run"), "--set", f"dataset={data}",
           "--set", "method=fedper", "--set", "rounds=2", "--set", "local_epochs=1", "--set", "device=cpu",
           "--set", "num_clients=10", "--set", "fraction_fit=1.0", "--set", "aux_size=100"]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_pss(proc.pid))
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate(timeout=600)
    stop.set()
    sampler.join()
    assert proc.returncode == 0, out
    estimate = float(re.search(r"memory estimate: host ([0-9.]+) GiB", out).group(1)) * 2**30
    assert 0.75 * peak[0] <= estimate <= 1.25 * peak[0], (estimate / 2**20, peak[0] / 2**20)


def test_summary_names_the_machine_and_the_threads_of_the_run(tmp_path):
    """summary.json's ``environment``: the versions and the CPU kernels and intra-op threads the run's
    process had (the regression runs pin 2 threads), so that two runs of the same arithmetic that part in
    their last digits can be traced to their machines."""
    import flwr
    import torch

    from fedpers.core.results import read_summary
    from tests.regression_runs import RECORDED_THREADS, run

    before = torch.get_num_threads()
    run("fedper", tmp_path / "run")
    env = read_summary(tmp_path / "run")["environment"]
    assert (env["torch"], env["flwr"]) == (torch.__version__, flwr.__version__)
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch_threads"] == RECORDED_THREADS and torch.get_num_threads() == before
    assert env["cpu"] and env["cpu_count"] >= 1
    assert env["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
