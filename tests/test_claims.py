"""Claims as data (fedpers/apps/claims.py): each claim form on hand-made runs whose answers are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from fedpers.apps.claims import (RowRun, compare, interval, parse_claims, pool_claims, pooled_comparison,
                                 pooled_markdown, size_answer)
from fedpers.core.errors import ConfigError
from fedpers.apps.report import write_study_claims
from fedpers.apps.sweep import MethodEntry, PlannedRun, Sweep, load_sweep

SPLIT = {"aux_size": 0, "client_label_counts": {"0": {"train": [1]}}, "client_train_sizes": [5, 5, 5, 5]}


def make_run(tmp_path, label: str, seed: int, per_client: list[float], *, metric="personalized_macro_acc",
             split=None, with_clients=True) -> PlannedRun:
    """A finished run whose final value is the mean of ``per_client`` (fractions)."""
    d = tmp_path / "runs" / label / f"seed{seed}"
    d.mkdir(parents=True)
    value = float(np.mean(per_client))
    record = {"round": 10, metric: value}
    if with_clients:
        record["per_client_acc"] = {str(k): v for k, v in enumerate(per_client)}
    (d / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (d / "summary.json").write_text(json.dumps({"metric": metric, "final": {metric: value},
                                                **(split or SPLIT)}))
    return PlannedRun(label, "mnist", 0.05, seed, str(d), {})


def verdicts(tmp_path, rows: list[str], runs: list[PlannedRun], claims: list[dict], paper=None) -> dict:
    sweep = Sweep([MethodEntry(r, r) for r in rows], ["mnist"], [0.05], [0, 1, 2], paper=paper or {},
                  claims=claims)
    write_study_claims(sweep, runs, tmp_path)
    return {r["id"]: r for r in json.loads((tmp_path / "claims.json").read_text())}


def test_interval_is_students_t():
    mean, low, high = interval([1.0, 2.0, 4.0])
    half = stats.t.ppf(0.975, 2) * np.std([1.0, 2.0, 4.0], ddof=1) / math.sqrt(3)
    assert mean == pytest.approx(7 / 3) and low == pytest.approx(7 / 3 - half) and high == pytest.approx(7 / 3 + half)
    assert interval([3.0]) is None


def test_order_holds_fails_and_is_undecided_paired_over_clients(tmp_path):
    up = [0.90, 0.92, 0.95, 0.91]
    runs = [make_run(tmp_path, "A", 0, [u + 0.02 for u in up]),  # 2 points above B on every client
            make_run(tmp_path, "B", 0, up),
            make_run(tmp_path, "C", 0, [0.91, 0.91, 0.96, 0.90])]  # around B: +1, -1, +1, -1 points
    got = verdicts(tmp_path, ["A", "B", "C"], runs, [
        {"id": "a-over-b", "order": ["A", "B"]},
        {"id": "b-over-a", "order": ["B", "A"]},
        {"id": "c-over-b", "order": ["C", "B"]}])
    assert got["a-over-b"]["verdict"] == "holds" and got["a-over-b"]["seed_note"] == "one seed"
    c = got["a-over-b"]["comparisons"][0]
    assert c["paired"] == "clients" and c["pairs"] == 4 and c["diff"] == pytest.approx(2.0)
    assert c["low"] == pytest.approx(2.0) and c["higher"] == 4  # no spread: the interval is the point
    assert got["b-over-a"]["verdict"] == "fails"
    assert got["c-over-b"]["verdict"] == "undecided"
    text = (tmp_path / "claims.md").read_text()
    # the runs record no last-5 mean: that reading has not run
    assert "| [a-over-b](#a-over-b) | final | holds, one seed | – | 1 | last5: not run |" in text
    assert "| [b-over-a](#b-over-a) | final | fails, one seed | – | 1 | last5: not run |" in text


def test_an_order_compares_every_row_with_every_later_one(tmp_path):
    runs = [make_run(tmp_path, "A", 0, [0.95] * 4), make_run(tmp_path, "B", 0, [0.94, 0.96, 0.94, 0.96]),
            make_run(tmp_path, "C", 0, [0.90, 0.90, 0.91, 0.91])]
    got = verdicts(tmp_path, ["A", "B", "C"], runs, [{"id": "abc", "order": ["A", "B", "C"]}])["abc"]
    assert [(c["a"], c["b"], c["verdict"]) for c in got["comparisons"]] == [
        ("A", "B", "undecided"), ("A", "C", "holds"), ("B", "C", "holds")]
    assert got["verdict"] == "undecided"


def test_without_per_client_values_seeds_are_paired_and_one_seed_gives_no_interval(tmp_path):
    one = [make_run(tmp_path / "one", "A", 0, [0.99], with_clients=False),
           make_run(tmp_path / "one", "B", 0, [0.50], with_clients=False)]
    got = verdicts(tmp_path / "one", ["A", "B"], one, [{"id": "x", "order": ["A", "B"]}])["x"]
    assert got["verdict"] == "undecided" and "low" not in got["comparisons"][0] and got["seed_note"] == "one seed"
    assert "one seed and no per-client values to pair" in (tmp_path / "one" / "claims.md").read_text()
    # three seeds, A above B by 2, 2.5 and 3 points: paired over seeds
    three = [make_run(tmp_path / "three", "A", s, [0.92 + 0.005 * s], with_clients=False) for s in range(3)]
    three += [make_run(tmp_path / "three", "B", s, [0.90], with_clients=False) for s in range(3)]
    got = verdicts(tmp_path / "three", ["A", "B"], three, [{"id": "x", "order": ["A", "B"]}])["x"]
    c = got["comparisons"][0]
    assert c["paired"] == "seeds" and c["pairs"] == 3 and c["diff"] == pytest.approx(2.5)
    assert (c["low"], c["high"]) == pytest.approx(interval([2.0, 2.5, 3.0])[1:])
    assert got["verdict"] == "holds" and "seed_note" not in got and got["n"] == 3
    assert c["per_seed"] == {str(s): pytest.approx(d) for s, d in enumerate([2.0, 2.5, 3.0])}
    assert "  - per seed: +2.00 (seed 0), +2.50 (seed 1), +3.00 (seed 2)" in (tmp_path / "three" / "claims.md").read_text()


def test_from_three_seeds_the_seed_is_the_unit_and_the_pooled_pairs_are_for_reading_only(tmp_path):
    """A is 1, 1 and 3 points above B on every client of seeds 0, 1, 2: the 12 pooled pairs have a narrow
    interval above 0, but the headline is the 3 seeds' own differences (2 degrees of freedom), which spans
    0; with two seeds the clients of the two runs are paired and the verdict says "two seeds"."""
    base = [0.90, 0.92, 0.95, 0.91]
    for seeds in (3, 2):
        where = tmp_path / f"seeds{seeds}"
        runs = [make_run(where, "A", s, [b + d for b in base]) for s, d in enumerate([0.01, 0.01, 0.03][:seeds])]
        runs += [make_run(where, "B", s, base) for s in range(seeds)]
        got = verdicts(where, ["A", "B"], runs, [{"id": "x", "order": ["A", "B"]},
                                                 {"id": "y", "delta": {"a": "B", "b": "A", "paper": -2.0}}])
        c = got["x"]["comparisons"][0]
        text = (where / "claims.md").read_text()
        if seeds == 2:
            assert c["paired"] == "clients" and c["pairs"] == 8 and "pooled_clients" not in c
            assert got["x"]["verdict"] == "holds" and got["x"]["seed_note"] == "two seeds"
            assert "| [x](#x) | final | holds, two seeds | – | 2 |" in text
            continue
        assert c["paired"] == "seeds" and c["pairs"] == 3 and c["client_pairs"] == 12
        low, high = interval([1.0, 1.0, 3.0])[1:]
        assert (c["low"], c["high"]) == pytest.approx((low, high))
        pooled = interval([1.0] * 8 + [3.0] * 4)
        assert (c["pooled_clients"]["low"], c["pooled_clients"]["high"]) == pytest.approx(pooled[1:])
        assert low < 0 < pooled[1]  # the pooled pairs would hold; the seeds do not yet
        # a delta claimed negative (B below A) is judged on its side: undecided too; the paper's -2.0 lies
        # inside B − A's interval
        assert got["x"]["verdict"] == got["y"]["verdict"] == "undecided" and "seed_note" not in got["x"]
        assert got["y"]["size"] == "consistent"
        assert "| [x](#x) | final | undecided | – | 3 |" in text
        assert f"- A − B: +1.67 points; 95 % {low:+.2f} to {high:+.2f} over 3 seeds, the seed the unit: **undecided**" in text
        assert (f"  - the 12 client pairs pooled over the seeds (12 higher, 0 lower): 95 % {pooled[1]:+.2f} to "
                f"{pooled[2]:+.2f}, for reading only") in text


def test_the_seed_interval_covers_a_known_effect_where_pooled_client_pairs_do_not():
    """Data with a known answer: 20 client differences per seed, each seed shifted by its own run effect
    (sd 1 point) around a true difference of 0.5, client noise sd 2. Over 400 simulated studies of 3 seeds
    the headline interval (seeds as the unit) holds the true 0.5 about 95 % of the time; the interval of the
    60 client pairs pooled over seeds, which treats them as independent, far less often."""
    rng = np.random.default_rng(0)
    true, hits_seeds, hits_pooled, studies = 0.5, 0, 0, 400
    for _ in range(studies):
        a, b = {}, {}
        for seed in range(3):
            diffs = true + rng.normal(0, 1.0) + rng.normal(0, 2.0, size=20)
            clients = {str(c): 50.0 + d for c, d in enumerate(diffs)}
            a[seed] = RowRun(seed, float(np.mean(list(clients.values()))), clients, SPLIT)
            b[seed] = RowRun(seed, 50.0, {str(c): 50.0 for c in range(20)}, SPLIT)
        c = compare(a, b)
        hits_seeds += c["low"] <= true <= c["high"]
        hits_pooled += c["pooled_clients"]["low"] <= true <= c["pooled_clients"]["high"]
    assert 0.92 <= hits_seeds / studies <= 0.98
    assert hits_pooled / studies < 0.80


def test_the_papers_size_inside_or_outside_our_interval():
    assert size_answer(-0.14, 0.65, 1.82) == "excluded: ours smaller"
    assert size_answer(-0.14, 0.65, 0.30) == "consistent"
    assert size_answer(2.0, 3.0, 1.0) == "excluded: ours larger"
    # a difference the paper claims negative: ours "smaller" is nearer 0 than the paper's
    assert size_answer(-0.5, 0.2, -1.0, direction=-1.0) == "excluded: ours smaller"
    assert size_answer(-3.0, -2.0, -1.0, direction=-1.0) == "excluded: ours larger"
    assert size_answer(None, None, 1.0) is None and size_answer(0.0, 1.0, None) is None


def test_each_claim_is_also_judged_at_the_final_round_and_the_last_five(tmp_path):
    """A run whose last round favours A while the last 5 evaluated rounds do not: the claim's own reading
    (final) is +5, the last-5 reading 0, and claims.md gives both."""
    def run(label, final, mean5):
        d = tmp_path / "runs" / label / "seed0"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(json.dumps({"round": 10, "personalized_macro_acc": final}) + "\n")
        (d / "summary.json").write_text(json.dumps({
            "metric": "personalized_macro_acc", "final": {"personalized_macro_acc": final},
            "mean_last_5_evaluated": {"personalized_macro_acc": mean5}, **SPLIT}))
        return PlannedRun(label, "mnist", 0.05, 0, str(d), {})
    runs = [run("A", 0.95, 0.90), run("B", 0.90, 0.90)]
    got = verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "delta": {"a": "A", "b": "B", "paper": 5.0}}])["x"]
    assert got["value"] == "final" and got["comparisons"][0]["diff"] == pytest.approx(5.0)
    (last5,) = got["other_readings"]
    assert last5["value"] == "last5" and last5["comparisons"][0]["diff"] == pytest.approx(0.0)
    assert last5["verdict"] == "undecided" and last5["seed_note"] == "one seed"
    text = (tmp_path / "claims.md").read_text()
    assert "- last5: **undecided, one seed**; A − B +0.00 (no interval)" in text
    best = verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "value": "best", "order": ["A", "B"]}])["x"]
    assert [o["value"] for o in best["other_readings"]] == ["final", "last5"]


def test_an_order_whose_rows_finished_different_seeds_pairs_each_comparison_on_its_own_seeds(tmp_path):
    """A and B at seeds 0-2, C at seeds 0-1: A − B has the seed as its unit, A − C and B − C pair the
    clients of their two common seeds, and the claim's n is the smallest (two seeds)."""
    base = [0.90, 0.92, 0.95, 0.91]
    runs = [make_run(tmp_path, "A", s, [b + 0.02 + 0.001 * s for b in base]) for s in range(3)]
    runs += [make_run(tmp_path, "B", s, [b + 0.01 for b in base]) for s in range(3)]
    runs += [make_run(tmp_path, "C", s, base) for s in range(2)]
    got = verdicts(tmp_path, ["A", "B", "C"], runs, [{"id": "x", "order": ["A", "B", "C"]}])["x"]
    assert [(c["paired"], c["n"]) for c in got["comparisons"]] == [("seeds", 3), ("clients", 2), ("clients", 2)]
    assert got["verdict"] == "holds" and got["n"] == 2 and got["seed_note"] == "two seeds"


def test_an_order_reads_the_papers_difference_from_its_table(tmp_path):
    # A is 0.5 points above B on every client: the interval is the point, far below the paper's 1.82
    runs = [make_run(tmp_path, "A", 0, [0.92, 0.93, 0.92, 0.93]), make_run(tmp_path, "B", 0, [0.915, 0.925, 0.915, 0.925])]
    paper = {"A": {"mnist_a0.05": 92.33}, "B": {"mnist_a0.05": 90.51}}
    got = verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "order": ["A", "B"]}], paper)["x"]
    c = got["comparisons"][0]
    assert c["paper_diff"] == pytest.approx(1.82) and c["size"] == got["size"]
    assert c["size"] == size_answer(c["low"], c["high"], 1.82) == "excluded: ours smaller"


def test_the_clients_that_carry_a_paired_difference_are_named_with_their_test_sizes(tmp_path):
    """One client of 4 test samples 25 points down (one sample) and the rest level: it is named first, with
    its size, and the mean without it is 0; the rest follow by |difference|, seed, then client number."""
    split = {**SPLIT, "client_label_counts": {str(c): {"train": [9], "test": [n]} for c, n in
                                              enumerate([40, 40, 4, 40, 40, 40, 40, 40, 40, 40, 40, 40])}}
    base = [0.9] * 12
    runs = [make_run(tmp_path, "A", 0, [0.9] * 2 + [0.65] + [0.9] * 7 + [0.925, 0.9], split=split),
            make_run(tmp_path, "B", 0, base, split=split)]
    got = verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "order": ["A", "B"]}])["x"]
    c = got["comparisons"][0]
    assert [(x["seed"], x["client"], x["test_samples"]) for x in c["largest"]] == [(0, "2", 4), (0, "10", 40), (0, "0", 40)]
    assert [x["diff"] for x in c["largest"]] == pytest.approx([-25.0, 2.5, 0.0])
    assert c["diff"] == pytest.approx(-22.5 / 12) and c["mean_without_largest"] == pytest.approx(2.5 / 11)
    assert ("  - largest per-client differences: seed 0 client 2 (4 test samples) -25.00; seed 0 client 10 "
            "(40 test samples) +2.50; seed 0 client 0 (40 test samples) +0.00; the mean without the first: +0.23"
            ) in (tmp_path / "claims.md").read_text()


def test_runs_on_other_splits_are_not_paired_per_client(tmp_path):
    other = {**SPLIT, "client_train_sizes": [4, 6, 5, 5]}
    runs = [make_run(tmp_path, "A", 0, [0.95, 0.95]), make_run(tmp_path, "B", 0, [0.90, 0.90], split=other)]
    got = verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "order": ["A", "B"]}])["x"]
    assert got["comparisons"][0]["paired"] == "seeds" and got["verdict"] == "undecided"


def test_delta_follows_the_papers_sign_and_says_whether_its_value_is_inside(tmp_path):
    runs = [make_run(tmp_path, "A", 0, [0.92, 0.93, 0.92, 0.93]), make_run(tmp_path, "B", 0, [0.91, 0.91, 0.91, 0.92])]
    got = verdicts(tmp_path, ["A", "B"], runs, [
        {"id": "costs", "delta": {"a": "A", "b": "B", "paper": 1.09}},
        {"id": "gains", "delta": {"a": "A", "b": "B", "paper": -0.5}}])
    assert got["costs"]["verdict"] == "holds" and got["costs"]["comparisons"][0]["diff"] == pytest.approx(1.25)
    assert got["costs"]["size"] == "consistent"  # the paper's 1.09 inside our interval
    assert got["gains"]["verdict"] == "fails"  # the paper says A is below B; A is above


def test_within_uses_the_interval_over_seeds_or_the_point_of_one_seed(tmp_path):
    paper = {"A": {"mnist_a0.05": 90.0}, "B": {"mnist_a0.05": 90.0}, "C": {"mnist_a0.05": 90.0}}
    runs = [make_run(tmp_path, "A", s, [v]) for s, v in enumerate([0.900, 0.905, 0.895])]  # tight around 90
    runs += [make_run(tmp_path, "B", s, [v]) for s, v in enumerate([0.80, 0.81, 0.79])]  # 10 points off
    runs += [make_run(tmp_path, "C", s, [v]) for s, v in enumerate([0.89, 0.99, 0.80])]  # too wide to tell
    got = verdicts(tmp_path, ["A", "B", "C"], runs, [
        {"id": "a", "within": {"rows": ["A"], "tolerance": 1.5}},
        {"id": "b", "within": {"rows": ["B"], "tolerance": 1.5}},
        {"id": "c", "within": {"rows": "C", "tolerance": 1.5}},
        {"id": "all", "within": {"rows": "all", "tolerance": 1.5}}], paper)
    assert (got["a"]["verdict"], got["b"]["verdict"], got["c"]["verdict"]) == ("holds", "fails", "undecided")
    assert got["all"]["verdict"] == "fails"
    one = [make_run(tmp_path / "one", "A", 0, [0.91])]
    got = verdicts(tmp_path / "one", ["A"], one, [{"id": "a", "within": {"rows": ["A"], "tolerance": 1.5}}], paper)
    assert got["a"]["verdict"] == "holds" and got["a"]["seed_note"] == "one seed"


def test_a_row_that_has_not_run_is_not_run_not_a_failure(tmp_path):
    runs = [make_run(tmp_path, "A", 0, [0.5, 0.5])]
    got = verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "order": ["B", "A"]}])["x"]
    assert got["verdict"] == "not run" and "B" in got["why"] and got["n"] == 0
    assert "| [x](#x) | final | not run | – | 0 | last5: not run |" in (tmp_path / "claims.md").read_text()


def test_a_difference_rests_on_the_seeds_both_rows_finished(tmp_path):
    """A row with more seeds than the row it is compared with: the difference, n and the rows' cells are of
    the common seeds (named), so a cell's mean is of the runs its difference pairs, not of seed 1's other
    split as well; rows finished only at different seeds are not run."""
    runs = [make_run(tmp_path / "more", "A", 0, [0.92, 0.92]), make_run(tmp_path / "more", "A", 1, [0.99, 0.99]),
            make_run(tmp_path / "more", "B", 0, [0.90, 0.91])]
    got = verdicts(tmp_path / "more", ["A", "B"], runs, [{"id": "x", "order": ["A", "B"]}])["x"]
    assert got["cells"]["A"] == {"n": 1, "finished": 2, "paper": None, "mean": pytest.approx(92.0), "sd": None}
    assert got["cells"]["B"]["n"] == got["cells"]["B"]["finished"] == 1 and got["cell_seeds"] == [0]
    c = got["comparisons"][0]
    assert c["seeds"] == [0] and c["diff"] == pytest.approx(1.5) and got["n"] == 1 and got["seed_note"] == "one seed"
    text = (tmp_path / "more" / "claims.md").read_text()
    assert "over 2 client pairs of seed 0 (2 higher, 0 lower)" in text
    assert "| A | – | 92.00 | 1 (of 2 finished) |" in text and "| B | – | 90.50 | 1 |" in text
    assert "Cells at seed 0: the seed that every row of the claim finished (each difference names" in text
    # a within claim judges each cell on its own seeds
    got = verdicts(tmp_path / "more", ["A", "B"], runs, [{"id": "w", "within": {"rows": ["A"], "tolerance": 10}}],
                   paper={"A": {"mnist_a0.05": 95.0}})["w"]
    assert got["cells"]["A"]["n"] == 2 and got["cells"]["A"]["mean"] == pytest.approx(95.5)
    apart = [make_run(tmp_path / "apart", "A", 1, [0.92]), make_run(tmp_path / "apart", "B", 0, [0.90])]
    got = verdicts(tmp_path / "apart", ["A", "B"], apart, [{"id": "x", "order": ["A", "B"]}])["x"]
    assert (got["verdict"], got["n"], got["why"]) == ("not run", 0, "no seed that both A and B finished")


def test_within_judges_the_cells_that_ran_and_one_outside_fails_it_before_the_rest_run(tmp_path):
    paper = {"A": {"mnist_a0.05": 90.0}, "B": {"mnist_a0.05": 90.0}, "C": {"mnist_a0.05": 90.0}}
    near = [make_run(tmp_path / "near", "A", s, [v]) for s, v in enumerate([0.900, 0.905, 0.895])]
    got = verdicts(tmp_path / "near", ["A", "B"], near, [{"id": "w", "within": {"rows": ["A", "B"], "tolerance": 1.5}}],
                   paper)["w"]
    assert got["verdict"] == "not run" and got["cells"]["A"]["verdict"] == "holds" and got["n"] == 3
    assert "verdict" not in got["cells"]["B"] and got["why"] == "no finished run of B"
    far = near + [make_run(tmp_path / "near", "C", 0, [0.80])]  # 10 points below, one seed
    got = verdicts(tmp_path / "near", ["A", "B", "C"], far,
                   [{"id": "w", "within": {"rows": ["A", "B", "C"], "tolerance": 1.5}}], paper)["w"]
    assert got["verdict"] == "fails" and got["cells"]["C"]["verdict"] == "fails" and got["seed_note"] == "one seed"
    assert got["why"] == "decided by the cells that ran; no finished run of B"
    assert "**Verdict (final): fails, one seed** (decided by the cells that ran; no finished run of B)" in (
        tmp_path / "near" / "claims.md").read_text()


@pytest.mark.parametrize("claim, words", [
    ({"order": ["A", "B"]}, "non-empty 'id'"),
    ({"id": "x"}, "exactly one of order, delta, within"),
    ({"id": "x", "order": ["A", "Z"]}, "'Z' is not a row of the study"),
    ({"id": "x", "order": ["A"]}, "two or more rows"),
    ({"id": "x", "delta": {"a": "A", "b": "B", "paper": "big"}}, "delta 'paper' must be a number"),
    ({"id": "x", "within": {"rows": ["A"], "tolerance": 1}}, "no mnist_a0.05 number for A"),
    ({"id": "x", "order": ["A", "B"], "value": "mean"}, "'value' must be one of final, best, last5"),
    ({"id": "x", "order": ["A", "B"], "column": "cifar10_a0.1"}, "'column' must be one of mnist_a0.05"),
    ({"id": "x", "order": ["A", "B"], "verdict": "holds"}, "unknown entries ['verdict']"),
    ({"id": "x", "within": {"rows": "all", "tolerance": 1}}, "no row has a mnist_a0.05 number"),
    ({"id": "x", "delta": {"a": "A", "b": "A", "paper": 1.0}}, "'A' is compared with itself"),
    ({"id": "x", "order": ["B", "A", "B"]}, "'B' is compared with itself"),
])
def test_a_bad_claim_is_one_clear_line(claim, words):
    with pytest.raises(ConfigError, match="claim") as info:
        parse_claims([claim], ["A", "B"], ["mnist_a0.05"], {}, "sweep s.yaml")
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_sweep_file_with_claims_is_checked_when_loaded(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("base: {dataset: digits}\ndatasets: [digits]\nalphas: [0.5]\nseeds: [0]\n"
                    "methods: [fedavg, fedper]\nclaims:\n  - {id: x, order: [fedper, fedprox]}\n")
    with pytest.raises(ConfigError, match="'fedprox' is not a row of the study"):
        load_sweep(path)
    path.write_text(path.read_text().replace("fedprox", "fedavg"))
    assert load_sweep(path).claims == [{"id": "x", "order": ["fedper", "fedavg"]}]


def test_runs_trained_on_a_gpu_are_named_in_the_cells(tmp_path):
    runs = [make_run(tmp_path, "A", s, [0.92, 0.93]) for s in range(2)] + [make_run(tmp_path, "B", 0, [0.90, 0.91])]
    summary = tmp_path / "runs" / "A" / "seed1" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "config": {"device": "cuda:0"}}))
    got = verdicts(tmp_path, ["A", "B"], runs, [{"id": "w", "within": {"rows": ["A"], "tolerance": 5}}],
                   paper={"A": {"mnist_a0.05": 92.0}})["w"]
    assert got["cells"]["A"]["gpu_seeds"] == [1]
    assert "| A | 92.00 | 92.50 ± 0.00 (GPU: seed 1) | 2 |" in (tmp_path / "claims.md").read_text()


def test_a_negative_tolerance_and_a_metric_no_run_records_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match="within 'tolerance' must be 0 or more points, got -1"):
        parse_claims([{"id": "x", "within": {"rows": ["A"], "tolerance": -1}}], ["A"], ["mnist_a0.05"],
                     {"A": {"mnist_a0.05": 90.0}}, "sweep s.yaml")
    runs = [make_run(tmp_path, "A", 0, [0.9, 0.9]), make_run(tmp_path, "B", 0, [0.8, 0.8])]
    with pytest.raises(ConfigError, match="claim metric 'personalized_macro_acc_fair': the finished run .* does not "
                                          "record it \\(it records personalized_macro_acc\\)"):
        verdicts(tmp_path, ["A", "B"], runs, [{"id": "x", "order": ["A", "B"], "metric": "personalized_macro_acc_fair"}])


@pytest.mark.parametrize("change, words", [
    ("methods: [fedavg, fedper]", "'methods' is empty"),
    ("seeds: [0]", "'seeds' is empty"),
    ("alphas: [0.5]", "'alphas' is empty"),
])
def test_an_empty_study_is_refused(tmp_path, change, words):
    body = "base: {dataset: digits}\ndatasets: [digits]\nalphas: [0.5]\nseeds: [0]\nmethods: [fedavg, fedper]\n"
    empty = {"methods": "methods: []", "seeds": "seeds: []", "alphas": "alphas: []"}[change.split(":")[0]]
    path = tmp_path / "s.yaml"
    path.write_text(body.replace(change, empty))
    with pytest.raises(ConfigError, match=words):
        load_sweep(path)


def test_paper_numbers_for_a_row_or_column_the_study_lacks_are_refused(tmp_path):
    body = "base: {dataset: digits}\ndatasets: [digits]\nalphas: [0.5]\nseeds: [0]\nmethods: [fedavg, fedper]\n"
    path = tmp_path / "s.yaml"
    path.write_text(body + "paper:\n  fedprox: {digits_a0.5: 90}\n")
    with pytest.raises(ConfigError, match="'paper' gives numbers for 'fedprox', not a row of the study"):
        load_sweep(path)
    path.write_text(body + "paper:\n  fedavg: {digits_a0.1: 90}\n")
    with pytest.raises(ConfigError, match="'paper' gives fedavg numbers for digits_a0.1, not a column of the study"):
        load_sweep(path)


def test_a_difference_pooled_over_studies_makes_every_study_seed_a_unit():
    """Three units over two studies: the mean and Student's t interval of the three, each study's own mean
    beside it; above 0, below 0 or across it; fewer than three units give no interval."""
    got = pooled_comparison({"A": {"0": 3.0, "1": 4.0}, "B": {"0": 5.0}})
    mean, low, high = interval([3.0, 4.0, 5.0])
    assert got["n"] == 3 and got["diff"] == pytest.approx(4.0) and got["sd"] == pytest.approx(1.0)
    assert (got["low"], got["high"]) == pytest.approx((low, high)) and low == pytest.approx(4 - 4.302653 / 3 ** 0.5)
    assert got["verdict"] == "holds" and got["units"] == {"A/0": 3.0, "A/1": 4.0, "B/0": 5.0}
    assert got["per_study"] == {"A": {"n": 2, "mean": 3.5}, "B": {"n": 1, "mean": 5.0}}
    assert pooled_comparison({"A": {"0": -3.0, "1": -4.0}, "B": {"0": -5.0}})["verdict"] == "fails"
    assert pooled_comparison({"A": {"0": 1.0, "1": 2.0}, "B": {"0": -4.0}})["verdict"] == "undecided"
    two = pooled_comparison({"A": {"0": 3.0}, "B": {"0": 5.0}})
    assert two["diff"] == pytest.approx(4.0) and "low" not in two and two["verdict"] == "undecided"


def test_claims_the_studies_share_are_pooled_from_their_claims_json(tmp_path):
    """Two studies judged by the real report: study 1 has A 1, 1, 3 points above B at seeds 0-2 (undecided
    on its own), study 2 has A 2 and 2 points above at seeds 0-1; pooled, the five units hold (and B below A
    by the paper's delta holds too). A reading the runs do not record is not run. A claim only study 1
    makes is left out and named."""
    base = [0.90, 0.92, 0.95, 0.91]
    studies = {}
    for name, shifts, extra in (("one", [0.01, 0.01, 0.03], [{"id": "only-here", "order": ["B", "A"]}]),
                                ("two", [0.02, 0.02], [])):
        where = tmp_path / name
        runs = [make_run(where, "A", s, [b + d for b in base]) for s, d in enumerate(shifts)]
        runs += [make_run(where, "B", s, base) for s in range(len(shifts))]
        verdicts(where, ["A", "B"], runs, [{"id": "x", "order": ["A", "B"]},
                                           {"id": "y", "delta": {"a": "B", "b": "A", "paper": -2.0}}, *extra])
        studies[name] = json.loads((where / "claims.json").read_text())
    pooled, left_out = pool_claims(studies)
    assert left_out == {"only-here": ["one"]} and [p["id"] for p in pooled] == ["x", "y"]
    # a delta the paper has negative (B below A) is judged on its side: B − A's units lie below 0, so it holds
    assert pooled[1]["readings"][0]["comparisons"][0]["verdict"] == "fails"
    assert pooled[1]["readings"][0]["verdict"] == "holds"
    final, last5 = pooled[0]["readings"]
    assert last5 == {"value": "last5", "comparisons": [], "verdict": "not run", "n": 0}  # the runs record final only
    c = final["comparisons"][0]
    assert sorted(c["units"].values()) == pytest.approx([1.0, 1.0, 2.0, 2.0, 3.0])
    assert (c["low"], c["high"]) == pytest.approx(interval([1.0, 1.0, 3.0, 2.0, 2.0])[1:])
    assert c["low"] > 0 and final["verdict"] == "holds" and final["n"] == 5
    assert c["per_study"]["one"]["mean"] == pytest.approx(5 / 3) and c["per_study"]["two"]["n"] == 2
    text = pooled_markdown(pooled, left_out, "pooled")
    low, high = interval([1.0, 1.0, 3.0, 2.0, 2.0])[1:]
    assert f"| final | A − B | +1.67 (3) | +2.00 (2) | +1.80 | {low:+.2f} to {high:+.2f} | 5 | **holds** |" in text
    assert "| last5 | not run in every study | – | – | – | – | 0 | **not run** |" in text
    assert "Not pooled (a claim not every study judged alike, or a within claim): only-here (one)." in text
