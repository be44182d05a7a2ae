"""Sampled evaluation (config key ``eval_clients``): a seeded draw of its own, the same clients for every
method at one seed, records that say how many clients they average, with or without carried evaluations."""

from __future__ import annotations

import pytest

from fedpers.registry.config import build_config
from fedpers.core.federation import get_federation
from fedpers.apps.inprocess import run_in_process
from fedpers.registry.methods import strategy_class_for
from fedpers.core.results import read_metrics, read_summary
from tests.conftest import tiny_overrides


def strategy(**keys):
    cfg = build_config(tiny_overrides(num_clients=8, **keys))
    return strategy_class_for(cfg)(cfg, get_federation(cfg))


def test_the_draw_is_seeded_the_same_for_every_method_and_new_each_round():
    fedavg, pfedkdh, fedper = (strategy(method=m, eval_clients=3) for m in ("fedavg", "pfedkdh", "fedper"))
    draws = [fedavg.roster.evaluation_sample(r) for r in range(1, 6)]
    assert all(len(d) == 3 and d <= set(range(8)) for d in draws)
    assert draws == [pfedkdh.roster.evaluation_sample(r) for r in range(1, 6)] == [fedper.roster.evaluation_sample(r) for r in range(1, 6)]
    assert len({frozenset(d) for d in draws}) > 1  # a new sample each round
    other_seed = strategy(method="fedavg", eval_clients=3, seed=1)
    assert [other_seed.roster.evaluation_sample(r) for r in range(1, 6)] != draws
    assert strategy(method="fedavg").roster.evaluation_sample(1) is None  # default: every client
    assert strategy(method="fedavg", eval_clients=8).roster.evaluation_sample(1) is None  # all of them


@pytest.mark.parametrize("method, carried", [("pfedkdh", True), ("pfedkdh", False), ("fedavg", False)])
def test_records_average_the_sampled_clients_only(method, carried, tmp_path):
    cfg = build_config(tiny_overrides(method=method, num_clients=5, fraction_fit=0.6, rounds=3, eval_clients=2,
                                      evaluate_with_next_fit=carried, out_dir=str(tmp_path)))
    run_in_process(cfg)
    rounds = read_metrics(tmp_path)
    sampler = strategy_class_for(cfg)(cfg, get_federation(cfg))
    for r in rounds:
        assert r["evaluated_clients"] == 2
        assert {int(k) for k in r["per_client_acc"]} == sampler.roster.evaluation_sample(r["round"])
    assert read_summary(tmp_path)["evaluation_sample"] == 2


def test_the_report_says_when_a_figure_is_a_sample(tmp_path):
    from fedpers.apps.report import write_tables
    from fedpers.apps.sweep import MethodEntry, Sweep

    sweep = Sweep([MethodEntry("FedPer", "fedper")], ["mnist"], [0.05], [0])
    cell = {"values": [99.0], "seeds": [0], "curves": [[(1, 99.0)]], "best": [(1, 99.0)], "splits": {}}
    md, _ = write_tables(sweep, {("FedPer", "mnist", 0.05): {**cell, "sample": 100}}, tmp_path)
    assert "average a sample of 100 clients per evaluation (eval_clients)" in md.read_text()
    md, _ = write_tables(sweep, {("FedPer", "mnist", 0.05): {**cell, "sample": None}}, tmp_path)
    assert "a sample of" not in md.read_text()


def test_among_the_trained_the_draw_takes_only_clients_drawn_for_fit_so_far():
    """eval_among=trained: the evaluated clients are drawn from the union of the rounds' fit draws up to the
    evaluated round (all of them with eval_clients 0), the same for every method at one seed."""
    import numpy as np

    fedavg, fedper = (strategy(method=m, fraction_fit=0.25, eval_clients=3, eval_among="trained")
                      for m in ("fedavg", "fedper"))
    drawn = set()
    for r in range(1, 6):
        drawn |= {int(p) for p in np.random.default_rng([0, r]).choice(8, size=2, replace=False)}
        assert fedavg.roster.drawn_for_fit_by(r) == sorted(drawn)
        sample = fedavg.roster.evaluation_sample(r)
        assert sample == fedper.roster.evaluation_sample(r)
        assert sample <= drawn and len(sample) == min(3, len(drawn))
    every = strategy(method="fedavg", fraction_fit=0.25, eval_among="trained")
    assert every.roster.evaluation_sample(1) == set(every.roster.drawn_for_fit_by(1))
    assert len(every.roster.evaluation_sample(1)) == 2
    # the draws do not depend on the order the rounds are asked in (a resumed run asks a later round first)
    assert strategy(method="fedavg", fraction_fit=0.25, eval_among="trained").roster.drawn_for_fit_by(5) == sorted(drawn)


def test_a_record_among_the_trained_averages_only_clients_that_have_trained(tmp_path):
    cfg = build_config(tiny_overrides(method="fedper", num_clients=6, fraction_fit=0.34, rounds=2,
                                      eval_among="trained", out_dir=str(tmp_path)))
    run_in_process(cfg)
    rounds = read_metrics(tmp_path)
    trained = set()
    for r in rounds:
        trained |= set(r["fit_clients"])
        assert {int(k) for k in r["per_client_acc"]} == trained
    assert read_summary(tmp_path)["evaluated_among"] == "trained"
