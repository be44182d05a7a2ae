"""Refactoring safety net: short digits runs of every method (and JDFL over two optimizers) give the numbers
recorded in ``tests/fixtures/regression`` (``python -m tests.regression_runs`` records them). Counts, ids and
accuracies must be equal; other floats (losses, drift statistics) equal to :data:`LOSS_REL_TOL`."""

from __future__ import annotations

import json
import math

import pytest

from tests.regression_runs import FIXTURES, overrides_of, run, run_names

# Recorded on an earlier session's machine; re-run on an AMD EPYC (AVX2, the same torch 2.14.1 and MKL) every
# accuracy of every run was the same and the losses moved by at most 7.7e-7 relative (MKL's and ATen's
# vector kernels sum in another order). A change of a method's arithmetic moves them by far more.
LOSS_REL_TOL = 1e-5


def differences(expected, got, where: str = "") -> list[str]:
    """Where ``got`` differs from ``expected`` (exact, except floats that are not accuracies: ``LOSS_REL_TOL``)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        if set(expected) != set(got):
            return [f"{where}: keys {sorted(set(expected) ^ set(got))} differ"]
        return [d for k in sorted(expected) for d in differences(expected[k], got[k], f"{where}.{k}")]
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(expected)} items recorded, {len(got)} now"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]")]
    if (isinstance(expected, float) and isinstance(got, float) and "acc" not in where
            and math.isclose(expected, got, rel_tol=LOSS_REL_TOL, abs_tol=0.0)):
        return []
    return [] if expected == got and type(expected) is type(got) else [f"{where}: recorded {expected!r}, now {got!r}"]


def test_every_method_has_a_recorded_run():
    assert sorted(p.stem for p in FIXTURES.glob("*.jsonl")) == sorted(run_names())


def test_differences_names_the_field_that_moved():
    assert differences({"acc": 0.5, "loss": 1.0}, {"acc": 0.5, "loss": 1.0 + 1e-6}) == []
    assert differences({"loss": 1.0}, {"loss": 1.0 + 1e-4}) == [f".loss: recorded 1.0, now {1.0 + 1e-4!r}"]
    assert differences({"acc": 0.5}, {"acc": 0.5 + 1e-12}) == [f".acc: recorded 0.5, now {0.5 + 1e-12!r}"]
    assert differences({"n": 3}, {"n": 3.0}) == [".n: recorded 3, now 3.0"]


@pytest.mark.parametrize("name", run_names())
def test_run_gives_the_recorded_numbers(name, tmp_path):
    recorded = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    got = json.loads(json.dumps(run(name, tmp_path / "run")))  # through JSON, as recorded
    assert differences(recorded, got) == []


@pytest.mark.parametrize("name", run_names())
def test_evaluations_carried_by_the_next_fit_give_the_recorded_numbers(name, tmp_path):
    """evaluate_with_next_fit: round 1's evaluation of the clients sampled in round 2 comes with their fit
    message. Every number of the recording is the same (accuracies exact, each client's too) but the bytes
    sent down, which lose exactly the evaluate broadcasts not sent: one per client of round 2, where the
    method evaluates on clients and its fit broadcast is the evaluate broadcast."""
    from fedpers.registry.config import build_config
    from fedpers.registry.methods import strategy_class_for

    recorded = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    got = json.loads(json.dumps(run(name, tmp_path / "run", evaluate_with_next_fit=True)))
    strip = lambda rounds: [{k: v for k, v in r.items() if k != "bytes_down"} for r in rounds]  # noqa: E731
    assert differences(strip(recorded), strip(got)) == []
    cls = strategy_class_for(build_config(overrides_of(name, tmp_path)))
    carries = cls.fit_carries_evaluation and not cls.personalized_is_global
    first, last = recorded[0], recorded[-1]
    saved = first["bytes_down"] - got[0]["bytes_down"]
    next_clients = len(recorded[1]["fit_clients"])
    # one evaluate broadcast = the last round's (never carried) bytes down over its messages
    per_message = last["bytes_down"] // (len(last["fit_clients"]) + last["evaluated_clients"])
    assert saved == (next_clients * per_message if carries else 0)
    assert got[-1]["bytes_down"] == last["bytes_down"]
