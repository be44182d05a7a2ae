"""Refactoring safety net: short digits runs of every method (and JDFL over two optimizers) give the numbers
recorded in ``tests/fixtures/regression`` (``python -m tests.regression_runs`` records them). Counts, ids and
accuracies must be equal; other floats equal to 1e-9 relative (a reordered sum may move the last bits)."""

from __future__ import annotations

import json
import math

import pytest

from tests.regression_runs import FIXTURES, run, run_names


def differences(expected, got, where: str = "") -> list[str]:
    """Where ``got`` differs from ``expected`` (exact, except floats that are not accuracies: 1e-9 rel)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        if set(expected) != set(got):
            return [f"{where}: keys {sorted(set(expected) ^ set(got))} differ"]
        return [d for k in sorted(expected) for d in differences(expected[k], got[k], f"{where}.{k}")]
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(expected)} items recorded, {len(got)} now"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]")]
    if (isinstance(expected, float) and isinstance(got, float) and "acc" not in where
            and math.isclose(expected, got, rel_tol=1e-9, abs_tol=0.0)):
        return []
    return [] if expected == got and type(expected) is type(got) else [f"{where}: recorded {expected!r}, now {got!r}"]


def test_every_method_has_a_recorded_run():
    assert sorted(p.stem for p in FIXTURES.glob("*.jsonl")) == sorted(run_names())


def test_differences_names_the_field_that_moved():
    assert differences({"acc": 0.5, "loss": 1.0}, {"acc": 0.5, "loss": 1.0 + 1e-12}) == []
    assert differences({"acc": 0.5}, {"acc": 0.5 + 1e-12}) == [f".acc: recorded 0.5, now {0.5 + 1e-12!r}"]
    assert differences({"n": 3}, {"n": 3.0}) == [".n: recorded 3, now 3.0"]


@pytest.mark.parametrize("name", run_names())
def test_run_gives_the_recorded_numbers(name, tmp_path):
    recorded = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    got = json.loads(json.dumps(run(name, tmp_path / "run")))  # through JSON, as recorded
    assert differences(recorded, got) == []
