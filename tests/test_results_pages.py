"""Results pages no hand keeps (fedpers/apps/results_pages.py): the generated blocks of README.md and
benchmarks/README.md equal what the committed claims.json files say, and a block is written from claims as
expected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedpers.apps.results_pages import stale_pages, write_pages
from fedpers.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_pages_are_not_stale():
    assert stale_pages(ROOT) == [], "run `fedpers docs` in the repository root and commit the pages"


def _study(root: Path, name: str, results: list[dict]) -> None:
    d = root / "results" / name
    d.mkdir(parents=True)
    (d / "claims.json").write_text(json.dumps(results))


DELTA = {"id": "teacher", "form": "delta", "value": "final", "verdict": "undecided", "n": 3, "size": "excluded: ours smaller",
         "paper_delta": 1.09, "cells": {"A": {"n": 3}, "B": {"n": 3}},
         "comparisons": [{"a": "A", "b": "B", "diff": -0.004, "low": -0.33, "high": 0.33, "paper_diff": 1.09}],
         "other_readings": [{"value": "last5", "verdict": "fails", "seed_note": "one seed"}]}
WITHIN = {"id": "near", "form": "within", "value": "final", "verdict": "holds", "n": 1, "seed_note": "one seed",
          "size": None, "cells": {"A": {"n": 1, "mean": 91.0, "paper": 90.0, "low": None, "high": None}}}
NOT_RUN = {"id": "later", "form": "order", "value": "best", "verdict": "not run", "n": 0, "cells": {"A": {"n": 0}}}


def test_blocks_are_written_from_the_claims(tmp_path):
    _study(tmp_path, "one", [DELTA, WITHIN])
    _study(tmp_path, "two", [NOT_RUN])
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("intro\n<!-- generated: claims results/one:teacher results/two -->\nstale line\n<!-- end generated -->\n"
                    "<!-- generated: status X=results/one,results/two -->\n<!-- end generated -->\ntail\n")
    assert stale_pages(tmp_path, ("docs/page.md",)) == ["docs/page.md"]
    assert write_pages(tmp_path, ("docs/page.md",)) == ["docs/page.md"]
    text = page.read_text()
    assert "stale line" not in text and text.startswith("intro\n") and text.endswith("tail\n")
    assert ("| one | [teacher](../results/one/claims.md#teacher) | final | +1.09 | -0.00 (-0.33 to +0.33) | undecided | "
            "excluded: ours smaller | 3 | last5: fails, one seed |") in text
    assert "near" not in text  # the block chose one claim of study one
    assert "| two | [later](../results/two/claims.md#later) | best | order | not run | not run | – | 0 | – |" in text
    assert ("| X | 3 | 1 | 0 | 1 | 1 | 1 | [one](../results/one/claims.md), [two](../results/two/claims.md) |") in text
    assert stale_pages(tmp_path, ("docs/page.md",)) == []


def test_a_block_naming_what_does_not_exist_is_one_clear_line(tmp_path):
    _study(tmp_path, "one", [DELTA])
    page = tmp_path / "page.md"
    page.write_text("<!-- generated: claims results/none -->\n<!-- end generated -->\n")
    with pytest.raises(ConfigError, match="names results/none, which has no claims.json"):
        write_pages(tmp_path, ("page.md",))
    page.write_text("<!-- generated: claims results/one:nosuch -->\n<!-- end generated -->\n")
    with pytest.raises(ConfigError, match="results/one has no claim nosuch"):
        write_pages(tmp_path, ("page.md",))


def test_docs_check_exits_1_when_stale(tmp_path):
    _study(tmp_path, "one", [DELTA])
    (tmp_path / "README.md").write_text("<!-- generated: status X=results/one -->\n<!-- end generated -->\n")

    def docs(*args):
        return subprocess.run([sys.executable, "-m", "fedpers", "docs", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    stale = docs("--check")
    assert stale.returncode == 1 and "README.md: generated blocks are stale" in stale.stdout
    assert docs().returncode == 0 and docs("--check").returncode == 0


STUDIES = sorted(p.parent.name for p in (ROOT / "benchmarks" / "results").glob("*/sweep.json"))
GENERATED = ("table.md", "table.csv", "claims.md", "claims.json", "versus.md", "validation.md", "round_statistics.md")


@pytest.mark.parametrize("study", STUDIES)
def test_each_committed_study_report_is_what_fedpers_report_writes_now(study, tmp_path):
    """`fedpers report DIR` alone (the study's own report options) rewrites every committed table and
    verdict byte for byte: no study file is kept by hand, and none is stale after a change of the rule."""
    import shutil

    from fedpers.apps.report import report

    copy = tmp_path / study
    shutil.copytree(ROOT / "benchmarks" / "results" / study, copy,
                    ignore=shutil.ignore_patterns("*.png", "checkpoint", "client_state"))
    report(copy)
    for name in GENERATED:
        committed = ROOT / "benchmarks" / "results" / study / name
        if committed.exists():
            assert (copy / name).read_text() == committed.read_text(), (
                f"benchmarks/results/{study}/{name} is stale: run `fedpers report benchmarks/results/{study}`")
