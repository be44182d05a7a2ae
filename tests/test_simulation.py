"""End-to-end runs of every method in Flower's Ray simulation engine (digits, 3 clients, 2 rounds)."""

import pytest

from fedpers.registry.config import build_config
from fedpers.registry.methods import METHODS
from fedpers.core.results import read_metrics, read_summary
from fedpers.apps.simulation import run_simulation
from tests.conftest import tiny_overrides

pytestmark = pytest.mark.simulation


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_runs_end_to_end(method, tmp_path):
    cfg = build_config(tiny_overrides(method=method, variant="ea", out_dir=str(tmp_path), fraction_fit=0.67))
    run_simulation(cfg)
    rounds = read_metrics(tmp_path)
    summary = read_summary(tmp_path)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert set(r["per_client_acc"]) == {"0", "1", "2"}  # every client evaluated, not only sampled ones
        assert all(0.0 <= a <= 1.0 for a in r["per_client_acc"].values())
        assert r["personalized_macro_acc"] == pytest.approx(sum(r["per_client_acc"].values()) / 3)
        assert len(r["fit_clients"]) == 2 and r["rejected_updates"] == 0 and r["failed_clients"] == 0
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["round_seconds"] > 0
        if not METHODS[method].strategy_class().personalized_is_global:
            assert r["bytes_down"] > r["bytes_up"]  # the evaluation broadcasts come on top of fit's
        assert r["client_state_consistent"] is True
    spec = METHODS[method]
    assert summary["method"] == method and summary["metric"] == spec.metric
    assert summary["final"][spec.metric] is not None
    assert summary["bytes_up"] == sum(r["bytes_up"] for r in rounds)
    assert summary["config"]["method"] == method
    if not spec.strategy_class().has_global_model:  # fedper, fedeagd: no global head
        assert summary["final"]["global_acc"] is None
    else:
        assert 0.0 <= summary["final"]["global_acc"] <= 1.0
    if method == "pfedkdh":
        assert "personalized_macro_acc_fair" in summary["final"]


def test_spilled_client_state_gives_the_same_run(tmp_path):
    """client_state_spill keeps heads, residuals and EMA teachers on disk instead of in memory: same
    numbers, and the run's own state directory is gone afterwards."""
    base = tiny_overrides(method="fedeagd", fraction_fit=0.67, fedeagd_fusion_start=1, fedeagd_fusion_ramp=1)
    run_simulation(build_config({**base, "out_dir": str(tmp_path / "memory")}))
    run_simulation(build_config({**base, "out_dir": str(tmp_path / "disk"), "client_state_spill": True}))
    memory, disk = read_metrics(tmp_path / "memory"), read_metrics(tmp_path / "disk")
    assert [r["per_client_acc"] for r in disk] == [r["per_client_acc"] for r in memory]
    assert [r["train_loss"] for r in disk] == [r["train_loss"] for r in memory]
    assert all(r["client_state_consistent"] for r in disk)
    assert not list((tmp_path / "disk").glob("client_state*"))


def test_spill_never_removes_a_directory_it_did_not_create(tmp_path):
    """A user's own OUT/client_state (or anything else in out_dir) survives a spilled run."""
    mine = tmp_path / "run" / "client_state"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    run_simulation(build_config({**tiny_overrides(method="fedper", rounds=1), "out_dir": str(tmp_path / "run"),
                                 "client_state_spill": True}))
    assert (mine / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "run").glob("client_state*")) == ["client_state"]


def test_ast_parse_is_one_call_at_a_time_for_the_simulation_engine(monkeypatch):
    """CPython 3.11's AST constructor is not thread-safe (gh-106905) and the engine parses the app
    references in two threads: the guard must serialize parses, and installing it twice must not nest it
    (the lock is not reentrant: a nested guard would hang)."""
    import ast
    import threading
    import time

    from fedpers.apps.flower_internals import serialize_ast_parse

    inside, seen = [0], []

    def slow_parse(source, *args, **kwargs):
        inside[0] += 1
        seen.append(inside[0])
        time.sleep(0.02)
        inside[0] -= 1
        return source

    monkeypatch.setattr(ast, "parse", slow_parse)
    serialize_ast_parse()
    serialize_ast_parse()
    threads = [threading.Thread(target=ast.parse, args=(f"x = {i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert seen == [1] * 6 and ast.parse("y = 2") == "y = 2"


def test_two_thousand_clients_train_and_evaluate_only_their_samples(tmp_path):
    """2,000 clients (digits images, 3 train and 1 test each), 1 % trained and 20 evaluated per
    round, state on disk, in the Ray simulation: it finishes, every round trains and evaluates exactly its
    seeded samples, and only clients that took part hold state on disk."""
    import numpy as np
    from sklearn.datasets import load_digits

    from fedpers.core.federation import get_federation
    from fedpers.registry.methods import strategy_class_for

    digits = load_digits()
    x = np.resize(digits.images.astype(np.float32), (8000, 8, 8))
    y = np.resize(digits.target, 8000)
    data = tmp_path / "digits8000.npz"
    np.savez(data, x_train=x[:6000], y_train=y[:6000], x_test=x[6000:], y_test=y[6000:])
    cfg = build_config(tiny_overrides(method="pfedkdh", dataset=str(data), partition="iid", num_clients=2000,
                                      fraction_fit=0.01, eval_clients=20, rounds=2, aux_size=100,
                                      min_samples_per_client=1, client_state_spill=True,
                                      client_state_dir=str(tmp_path / "state"), out_dir=str(tmp_path / "run")))
    run_simulation(cfg)
    rounds = read_metrics(tmp_path / "run")
    roster = strategy_class_for(cfg)(cfg, get_federation(cfg)).roster
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert len(r["fit_clients"]) == 20 and r["failed_clients"] == 0 and r["rejected_updates"] == 0
        assert r["evaluated_clients"] == 20
        assert {int(k) for k in r["per_client_acc"]} == roster.evaluation_sample(r["round"])
    assert read_summary(tmp_path / "run")["evaluation_sample"] == 20
    trained = {p for r in rounds for p in r["fit_clients"]}
    took_part = trained | {int(k) for r in rounds for k in r["per_client_acc"]}
    on_disk = {int(d.name.split("-")[1]) for d in (tmp_path / "state").glob("partition-*")}
    assert trained <= on_disk <= took_part


@pytest.mark.parametrize("method", ["fedeagd", "pfedkdh"])
def test_the_inprocess_engine_gives_the_simulations_run(method, tmp_path):
    """``--engine inprocess`` is the same experiment as Flower's Ray simulation: same clients sampled, same
    per-client accuracies every round and the same losses to float precision, for methods whose clients
    keep state between rounds (EMA teachers and residuals; private heads and the server's recalibrated
    teacher head)."""
    from fedpers.apps.inprocess import run_in_process

    base = tiny_overrides(method=method, variant="ea", fraction_fit=0.67, fedeagd_fusion_start=1, fedeagd_fusion_ramp=1)
    run_simulation(build_config({**base, "out_dir": str(tmp_path / "ray")}))
    run_in_process(build_config({**base, "out_dir": str(tmp_path / "inprocess")}))
    ray_rounds, own_rounds = read_metrics(tmp_path / "ray"), read_metrics(tmp_path / "inprocess")
    assert [r["fit_clients"] for r in own_rounds] == [r["fit_clients"] for r in ray_rounds]
    assert [r["per_client_acc"] for r in own_rounds] == [r["per_client_acc"] for r in ray_rounds]
    # a Ray client actor runs torch on 1 thread, this process on all cores: sums of another order, so the
    # losses agree to float precision (exactly, with OMP_NUM_THREADS=1 everywhere)
    assert [r["train_loss"] for r in own_rounds] == pytest.approx([r["train_loss"] for r in ray_rounds], rel=1e-6)
    assert read_summary(tmp_path / "inprocess")["final"] == read_summary(tmp_path / "ray")["final"]
