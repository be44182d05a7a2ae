"""Numbers in prose come from generated files: every decimal number inside a ``<!-- numbers from: DIR, ... -->``
block of README.md and benchmarks/README.md appears in the generated ``.md`` / ``.json`` files of the named
results directories (``table.md``, ``claims.md``, ``versus.md``, ``validation.md``, ``sweep.json``, ...;
not the per-run files). Integers (rounds, client counts) are not checked: they are settings or counts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- numbers from: (?P<dirs>[^>]*?) -->(?P<body>.*?)<!-- end numbers -->", re.S)
DECIMAL = re.compile(r"(?<![\w.])[-+−]?(\d+\.\d+)(?![\w.]*\d)")
DOCS = ["README.md", "benchmarks/README.md"]


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
