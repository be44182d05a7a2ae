"""Numbers in prose come from generated files: every decimal number inside a ``<!-- numbers from: DIR, ... -->``
block of README.md and benchmarks/README.md appears in the generated ``.md`` / ``.json`` files of the named
results directories (``table.md``, ``claims.md``, ``versus.md``, ``validation.md``, ``sweep.json``, ...;
not the per-run files). Integers (rounds, client counts) are not checked: they are settings or counts.

A value with its spread (``87.45±1.01``, ``-0.22 ± 0.09``) is checked as a pair: the two numbers stand
together in a generated file (written ``a±b`` / ``a ± b``, or as adjacent table cells ``| a | b |``), so a
spread copied from another cell is caught even where both numbers occur somewhere. The sign of the value is
not compared (a difference may be quoted from the other side).

Runs on a GPU are named where they are used: a study with a run whose ``summary.json`` records
``device: cuda`` has a numbers block in benchmarks/README.md that says GPU, and README.md names the study."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- numbers from: (?P<dirs>[^>]*?) -->(?P<body>.*?)<!-- end numbers -->", re.S)
DECIMAL = re.compile(r"(?<![\w.])[-+−]?(\d+\.\d+)(?![\w.]*\d)")
DOCS = ["README.md", "benchmarks/README.md"]
PAIR = re.compile(r"(?<![\w.])[-+−]?(\d+\.\d+)\s*±\s*(\d+\.\d+)(?![\w.]*\d)")
CELLS = re.compile(r"\|\s*[-+−]?(\d+\.\d+)\s*\|\s*(\d+\.\d+)\s*(?=\|)")


def blocks(doc: str) -> list[tuple[list[Path], str]]:
    """(the results directories it names, its text) of each numbers block of ``doc``."""
    path = ROOT / doc
    out = []
    for m in BLOCK.finditer(path.read_text()):
        dirs = [path.parent / d.strip() for d in m.group("dirs").split(",") if d.strip()]
        out.append((dirs, m.group("body")))
    return out


def generated_numbers(dirs: list[Path]) -> set[str]:
    """Every decimal number (unsigned, as written) in the generated files of ``dirs``."""
    found: set[str] = set()
    for d in dirs:
        for f in sorted(d.glob("*.md")) + sorted(d.glob("*.json")):
            found |= set(DECIMAL.findall(f.read_text()))
    return found


def test_the_study_sections_are_fenced():
    named: set[str] = set()
    for dirs, _ in blocks("benchmarks/README.md"):
        named |= {d.name for d in dirs}
    studies = {p.parent.name for p in (ROOT / "benchmarks" / "results").glob("*/claims.md")}
    assert studies and studies <= named, f"study results without a numbers block: {sorted(studies - named)}"


def generated_pairs(dirs: list[Path]) -> set[tuple[str, str]]:
    """Every (value, spread) pair, value unsigned, written ``a±b`` or as adjacent table cells in ``dirs``."""
    found: set[tuple[str, str]] = set()
    for d in dirs:
        for f in sorted(d.glob("*.md")) + sorted(d.glob("*.json")):
            text = f.read_text()
            found |= set(PAIR.findall(text)) | set(CELLS.findall(text))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_value_with_its_spread_in_a_block_stands_together_in_the_files(doc):
    for dirs, body in blocks(doc):
        allowed = generated_pairs(dirs)
        unknown = sorted({f"{a} ± {b}" for a, b in PAIR.findall(body) if (a, b) not in allowed})
        assert not unknown, f"{doc}: value ± spread not found together in {[str(d.relative_to(ROOT)) for d in dirs]}: {unknown}"


def gpu_studies() -> set[str]:
    """The studies of benchmarks/results with a run trained on a GPU (``device: cuda`` in its summary.json)."""
    found = set()
    for s in (ROOT / "benchmarks" / "results").glob("*/runs/**/summary.json"):
        if '"device": "cuda' in s.read_text():
            found.add(s.relative_to(ROOT / "benchmarks" / "results").parts[0])
    return found


def test_runs_on_a_gpu_are_named_where_they_are_used():
    studies = gpu_studies()
    for dirs, body in blocks("benchmarks/README.md"):
        for d in dirs:
            if d.name in studies:
                assert "GPU" in body, f"benchmarks/README.md: the {d.name} section does not say which runs a GPU ran"
    readme = (ROOT / "README.md").read_text()
    missing = sorted(s for s in studies if f"`{s}`" not in readme.split("## Results", 1)[-1])
    assert not missing, f"README.md's Results section does not name the studies with GPU runs: {missing}"


def device_counts() -> dict[str, int]:
    """How many committed study runs record each ``config.device`` in their summary.json."""
    counts: dict[str, int] = {}
    for s in (ROOT / "benchmarks" / "results").glob("*/runs/**/summary.json"):
        device = json.loads(s.read_text()).get("config", {}).get("device", "cpu")
        counts[device] = counts.get(device, 0) + 1
    return counts


# The sentence each page opens its results with: "N of the M committed (study) runs" trained on a GPU.
RUN_COUNT = re.compile(r"(\d+) of\s+the (\d+) committed(?: study)? runs")


@pytest.mark.parametrize("doc", DOCS)
def test_the_stated_run_counts_are_the_committed_runs(doc):
    counts = device_counts()
    found = RUN_COUNT.findall((ROOT / doc).read_text())
    assert found, f"{doc}: no 'N of the M committed runs' sentence"
    for on_gpu, total in found:
        assert (int(on_gpu), int(total)) == (counts.get("cuda", 0), sum(counts.values())), (
            f"{doc}: says {on_gpu} of {total} committed runs on a GPU; benchmarks/results holds "
            f"{counts.get('cuda', 0)} of {sum(counts.values())}")
    for on_cpu in re.findall(r"the other (\d+) say `cpu`", (ROOT / doc).read_text()):
        assert int(on_cpu) == counts.get("cpu", 0), f"{doc}: says {on_cpu} runs on the CPU, {counts.get('cpu', 0)} are"


@pytest.mark.parametrize("doc", DOCS)
def test_every_decimal_number_in_a_block_comes_from_the_generated_files(doc):
    checked = 0
    for dirs, body in blocks(doc):
        for d in dirs:
            assert d.is_dir(), f"{doc}: numbers block names {d}, which does not exist"
        allowed = generated_numbers(dirs)
        unknown = sorted({n for n in DECIMAL.findall(body) if n not in allowed})
        assert not unknown, f"{doc}: numbers not in {[str(d.relative_to(ROOT)) for d in dirs]}: {unknown}"
        checked += 1
    # a page whose every number sits in generated blocks (README.md) needs no numbers block
    assert checked or "<!-- generated: " in (ROOT / doc).read_text(), f"{doc} has no numbers block"


def test_a_number_not_in_the_files_is_caught(tmp_path):
    (tmp_path / "table.md").write_text("| FedPer | 99.42±0.00 |\n")
    allowed = generated_numbers([tmp_path])
    assert "99.42" in allowed and "0.00" in allowed
    assert [n for n in DECIMAL.findall("FedPer leads with 99.42, and EA has -1.10") if n not in allowed] == ["1.10"]


def test_a_spread_copied_from_another_cell_is_caught(tmp_path):
    (tmp_path / "table.md").write_text("| FedPer | 87.45±1.01 (n=3) |\n| Fair | 84.84±1.02 (n=3) |\n")
    (tmp_path / "versus.md").write_text("| FedAvg | mnist | 0 | 20 | 50 | -0.22 | 0.09 | 3/15/2 |\n")
    allowed = generated_pairs([tmp_path])
    prose = "EA ends at 87.45±1.02, Fair at 84.84 ± 1.02, and the gap is +0.22 ± 0.09 (SE)"
    assert [p for p in PAIR.findall(prose) if p not in allowed] == [("87.45", "1.02")]
