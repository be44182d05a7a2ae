"""Robustness: malformed updates are rejected (never averaged), robust aggregation, NaN clients, and
a server killed mid-run keeps every finished round on disk."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters, parameters_to_ndarrays
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpers.registry.config import build_config
from fedpers.core.errors import FedpersError
from fedpers.core.federation import get_federation
from fedpers.core.models import get_arrays
from fedpers.core.results import read_metrics
from fedpers.apps.simulation import run_simulation
from fedpers.core.validation import aggregate_updates, corrupt_update
from strategies.fedavg import FedAvgStrategy
from tests.conftest import ROOT, tiny_overrides

CFG = build_config(tiny_overrides(method="fedavg", feature_dim=8))


def make_strategy(**changes):
    cfg = CFG.replace(**changes) if changes else CFG
    strategy = FedAvgStrategy(cfg, get_federation(cfg))
    strategy.book.start()
    for pid in range(cfg.num_clients):
        strategy.roster.partition_of[f"node{pid}"] = pid
    return strategy


def fit_result(pid, arrays, n=None, parameters=None):
    n = 10 if n is None else n
    params = parameters if parameters is not None else ndarrays_to_parameters(arrays)
    return SimpleNamespace(cid=f"node{pid}"), FitRes(Status(Code.OK, ""), params, n, {"train_loss": 1.0})


def honest_update(strategy, shift):
    return [a + shift for a in get_arrays(strategy.model, "all")]


CORRUPTIONS = ["nan", "inf", "shape", "count", "dtype", "zero_samples", "negative_samples", "too_many_samples",
               "garbage_bytes"]


def corrupt(kind, arrays, rng):
    arrays = [a.copy() for a in arrays]
    i = int(rng.integers(len(arrays)))
    n = None
    if kind == "nan":
        arrays[i].reshape(-1)[int(rng.integers(arrays[i].size))] = np.nan
    elif kind == "inf":
        arrays[i].reshape(-1)[0] = -np.inf
    elif kind == "shape":
        arrays[i] = arrays[i].reshape(-1)[:-1] if arrays[i].size > 1 else np.zeros((2, 2), np.float32)
    elif kind == "count":
        arrays = arrays[:-1]
    elif kind == "dtype":
        arrays[i] = arrays[i].astype(np.int32)
    elif kind == "zero_samples":
        n = 0
    elif kind == "negative_samples":
        n = -5
    elif kind == "too_many_samples":
        n = 10**9
    elif kind == "garbage_bytes":
        return arrays, n, Parameters(tensors=[b"\x00garbage"] * len(arrays), tensor_type="numpy.ndarray")
    return arrays, n, None


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from(CORRUPTIONS), min_size=1, max_size=2), seed=st.integers(0, 10**6))
def test_malformed_updates_are_rejected_and_never_averaged(kinds, seed):
    strategy = make_strategy()
    rng = np.random.default_rng(seed)
    good = honest_update(strategy, 0.5)
    results = [fit_result(0, good)]
    for j, kind in enumerate(kinds):
        arrays, n, params = corrupt(kind, honest_update(strategy, 100.0), rng)
        results.append(fit_result(j + 1, arrays, n, params))
    params, _ = strategy.aggregate_fit(1, results, [])
    assert strategy.book.current["rejected"] == len(kinds)
    for got, want in zip(parameters_to_ndarrays(params), good):
        np.testing.assert_allclose(got, want, rtol=1e-6)  # only the honest update counts


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(CORRUPTIONS), seed=st.integers(0, 10**6))
def test_round_without_valid_update_fails_clearly_and_keeps_the_global_model(kind, seed):
    strategy = make_strategy()
    before = get_arrays(strategy.model, "all")
    arrays, n, params = corrupt(kind, honest_update(strategy, 1.0), np.random.default_rng(seed))
    with pytest.raises(FedpersError, match="fewer than min_fit_updates=1"):
        strategy.aggregate_fit(3, [fit_result(1, arrays, n, params)], [])
    for a, b in zip(before, get_arrays(strategy.model, "all")):
        np.testing.assert_array_equal(a, b)


def test_min_fit_updates_is_enforced():
    strategy = make_strategy(min_fit_updates=2)
    with pytest.raises(FedpersError, match="1 valid client updates"):
        strategy.aggregate_fit(1, [fit_result(0, honest_update(strategy, 0.0))], [])


def test_sample_count_bound_defaults_to_the_clients_split_size():
    strategy = make_strategy()
    size = len(strategy.federation.partition.train[0])
    strategy.aggregate_fit(1, [fit_result(0, honest_update(strategy, 0.0), size),
                               fit_result(1, honest_update(strategy, 0.0), size + 10**6)], [])
    assert strategy.book.current["rejected"] == 1


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_robust_rules_bound_one_hostile_client(rule):
    rng = np.random.default_rng(0)
    honest = [([rng.normal(1.0, 0.1, (4, 3)).astype(np.float32)], 10) for _ in range(5)]
    hostile = [([np.full((4, 3), 1e6, np.float32)], 10)]
    robust = aggregate_updates(honest + hostile, rule, trim_fraction=0.2)[0]
    mean = aggregate_updates(honest + hostile, "mean")[0]
    assert np.abs(robust - 1.0).max() < 0.5
    assert np.abs(mean - 1.0).max() > 1e4
    assert robust.dtype == np.float32


def test_corrupt_update_kinds():
    arrays = [np.ones((2, 2), np.float32)]
    assert np.isnan(corrupt_update(arrays, "nan", np.random.default_rng(0))[0]).all()
    noisy = corrupt_update(arrays, "noise", np.random.default_rng(0))[0]
    assert np.isfinite(noisy).all() and np.abs(noisy - 1).max() > 1 and noisy.dtype == np.float32


@pytest.mark.simulation
def test_one_nan_client_in_five_is_rejected_every_round_and_accuracy_holds(tmp_path):
    base = tiny_overrides(method="fedavg", num_clients=5, fraction_fit=1.0, rounds=3, local_epochs=2,
                          alpha=100.0, aux_size=50, feature_dim=32)
    from fedpers.apps.inprocess import run_in_process

    run_simulation(build_config(dict(base, faulty_clients="4", out_dir=str(tmp_path / "nan"))))
    # the reference run without the faulty client: in-process, which gives the Ray simulation's numbers
    # (tests/test_simulation.py) without a second Ray start-up
    run_in_process(build_config(dict(base, out_dir=str(tmp_path / "clean"))))
    nan_rounds, clean_rounds = read_metrics(tmp_path / "nan"), read_metrics(tmp_path / "clean")
    assert [r["rejected_updates"] for r in nan_rounds] == [1, 1, 1]
    assert all(r["rejected_updates"] == 0 for r in clean_rounds)
    for r in nan_rounds:
        assert np.isfinite(r["global_acc"]) and np.isfinite(r["personalized_macro_acc"])
    # IID data (alpha=100): losing one client's update of five costs little
    assert abs(nan_rounds[-1]["global_acc"] - clean_rounds[-1]["global_acc"]) < 0.1
    assert nan_rounds[-1]["global_acc"] > 0.5


@pytest.mark.simulation
def test_killed_server_leaves_every_finished_round_on_disk(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedpers", "run", "--out", str(out)]
    for k, v in tiny_overrides(method="fedavg", rounds=50).items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    metrics = out / "metrics.jsonl"
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the run did not finish 3 rounds in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI, its Ray head and workers share the session
        proc.wait(timeout=30)
    lines = metrics.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is complete JSON
    assert [r["round"] for r in records] == list(range(1, len(records) + 1))
    assert len(records) < 50 and not (out / "summary.json").exists()
