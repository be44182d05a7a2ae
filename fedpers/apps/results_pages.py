"""Results pages that no hand keeps: the marked blocks of README.md and benchmarks/README.md, written from
the studies' ``claims.json`` by ``fedpers docs`` (``--check``: exit 1 when a block is stale).

A block is an HTML comment naming what it shows, the generated lines, and an end marker::

    <!-- generated: claims benchmarks/results/pfedkdh_cifar10_seeds benchmarks/results/fedeagd_mnist_r100:teacher-adds -->
    ... (one table row per claim of the named studies; ``DIR:id+id`` keeps those claims only)
    <!-- end generated -->

    <!-- generated: table benchmarks/results/pfedkdh_cifar10_seeds -->
    ... (the study's table.md: its first table, and the line under it that says what the cells are)
    <!-- end generated -->

    <!-- generated: status pFedKDH=benchmarks/results/a,benchmarks/results/b; FedEAGD=benchmarks/results/c -->
    ... (one line per method: how many of its claims hold, fail, are undecided or not run, and how many
         exclude the paper's size; links to each study's claims.md)
    <!-- end generated -->

Paths in a marker are relative to the repository root (the folder ``fedpers docs`` runs in); links in the
generated lines are relative to the page.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from fedpers.apps.claims import verdict_words
from fedpers.core.errors import ConfigError

PAGES = ("README.md", "benchmarks/README.md")
BLOCK = re.compile(r"(?P<head><!-- generated: (?P<kind>\w+) (?P<args>[^>]*?) -->\n)(?P<body>.*?)(?P<end><!-- end generated -->)",
                   re.S)
VERDICTS = ("holds", "fails", "undecided", "not run")


def _claims_of(root: Path, study: str, page: Path) -> list[dict[str, Any]]:
    path = root / study / "claims.json"
    if not path.is_file():
        raise ConfigError(f"{page}: a generated block names {study}, which has no claims.json (run `fedpers report "
                          f"{study}` first)")
    return json.loads(path.read_text())


def _link(root: Path, page: Path, study: str, anchor: str = "") -> str:
    target = os.path.relpath(root / study / "claims.md", (root / page).parent)
    return f"{target}#{anchor}" if anchor else target


def _paper_text(r: dict[str, Any]) -> str:
    """The paper's side of a claim in a few characters: its difference, its cells, or its order."""
    if r["form"] == "delta":
        return "–" if r.get("paper_delta") is None else f"{r['paper_delta']:+.2f}"
    if r["form"] == "within":
        return "; ".join(f"{label} {c['paper']:.2f}" for label, c in r["cells"].items() if c.get("paper") is not None)
    comparisons = r.get("comparisons", [])
    diffs = [(f"{c['a']} − {c['b']} " if len(comparisons) > 1 else "") + f"{c['paper_diff']:+.2f}"
             for c in comparisons if c.get("paper_diff") is not None]
    return ", ".join(diffs) if diffs else "order"


def _ours_text(r: dict[str, Any]) -> str:
    """Our side: each comparison's difference with its headline interval, or each cell's mean."""
    if r["verdict"] == "not run" and not any(c["n"] for c in r["cells"].values()):
        return "not run"
    if r["form"] == "within":
        return "; ".join(f"{label} {c['mean']:.2f}" + (f" ({c['low']:.2f} to {c['high']:.2f})" if c.get("low") is not None else "")
                         for label, c in r["cells"].items() if c["n"])
    parts = []
    comparisons = [c for c in r.get("comparisons", []) if "diff" in c]
    for c in comparisons:
        span = f" ({c['low']:+.2f} to {c['high']:+.2f})" if c.get("low") is not None else " (no interval)"
        named = f"{c['a']} − {c['b']} " if len(comparisons) > 1 else ""
        parts.append(f"{named}{c['diff']:+.2f}{span}")
    return "; ".join(parts) or "not run"


def _gpu_note(r: dict[str, Any]) -> str:
    """Which of the claim's runs trained on a GPU (row: seeds), or nothing."""
    used = [f"{label} seed{'s' if len(c['gpu_seeds']) > 1 else ''} {', '.join(map(str, c['gpu_seeds']))}"
            for label, c in r["cells"].items() if c.get("gpu_seeds")]
    return f"; GPU: {'; '.join(used)}" if used else ""


def claims_rows(root: Path, page: Path, args: str) -> list[str]:
    """The lines of a ``claims`` block: a table with one row per claim of the named studies."""
    lines = ["| study | claim | reading | paper | ours (95 %) | sign | paper's size | n | other readings |",
             "|---|---|---|---|---|---|---|---|---|"]
    for item in args.split():
        study, _, chosen = item.partition(":")
        results = _claims_of(root, study, page)
        keep = set(chosen.split("+")) if chosen else None
        if keep is not None and keep - {r["id"] for r in results}:
            raise ConfigError(f"{page}: {study} has no claim {', '.join(sorted(keep - {r['id'] for r in results}))}")
        for r in results:
            if keep is not None and r["id"] not in keep:
                continue
            others = "; ".join(f"{o['value']}: {verdict_words(o)}" for o in r.get("other_readings", [])) or "–"
            lines.append(f"| {Path(study).name} | [{r['id']}]({_link(root, page, study, r['id'])}) | {r['value']} | "
                         f"{_paper_text(r)} | {_ours_text(r)}{_gpu_note(r)} | {verdict_words(r)} | {r.get('size') or '–'} | {r['n']} | "
                         f"{others} |")
    return lines


def status_rows(root: Path, page: Path, args: str) -> list[str]:
    """The lines of a ``status`` block: per method, its claims' verdicts counted, with links."""
    lines = ["| method | claims | holds | fails | undecided | not run | paper's size excluded | studies |",
             "|---|---|---|---|---|---|---|---|"]
    for part in filter(None, (p.strip() for p in args.split(";"))):
        method, _, studies = part.partition("=")
        dirs = [s.strip() for s in studies.split(",") if s.strip()]
        if not method or not dirs:
            raise ConfigError(f"{page}: a status block lists METHOD=DIR,DIR; ..., got {part!r}")
        results = [r for d in dirs for r in _claims_of(root, d, page)]
        counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
        excluded = sum(str(r.get("size") or "").startswith("excluded") for r in results)
        links = ", ".join(f"[{Path(d).name}]({_link(root, page, d)})" for d in dirs)
        lines.append(f"| {method.strip()} | {len(results)} | {counts['holds']} | {counts['fails']} | "
                     f"{counts['undecided']} | {counts['not run']} | {excluded} | {links} |")
    return lines


def table_rows(root: Path, page: Path, args: str) -> list[str]:
    """The lines of a ``table`` block: the first table of the study's ``table.md`` and its note (what the
    cells are: which round, mean ± sample SD over which seeds)."""
    path = root / args / "table.md"
    if not path.is_file():
        raise ConfigError(f"{page}: a generated block names {args}, which has no table.md (run `fedpers report "
                          f"{args}` first)")
    lines = path.read_text().splitlines()
    table = []
    for line in lines:
        if not line.startswith("|"):
            break
        table.append(line)
    note = next((line for line in lines if line and line[0].isalpha() and "accuracy in %" in line), None)
    return table + ([""] + [note] if note else [])


RENDERERS = {"claims": claims_rows, "status": status_rows, "table": table_rows}


def rewrite(root: Path, page: str) -> tuple[str, str]:
    """(the page as it is, the page with every generated block written anew)."""
    path = root / page
    text = path.read_text()

    def fill(m: re.Match) -> str:
        kind = m.group("kind")
        if kind not in RENDERERS:
            raise ConfigError(f"{page}: unknown generated block {kind!r} ({', '.join(RENDERERS)})")
        body = "\n".join(RENDERERS[kind](root, Path(page), m.group("args").strip())) + "\n"
        return m.group("head") + body + m.group("end")

    return text, BLOCK.sub(fill, text)


def stale_pages(root: Path, pages: tuple[str, ...] = PAGES) -> list[str]:
    """The pages whose generated blocks differ from what the claims say now."""
    return [page for page in pages if (root / page).is_file() and len(set(rewrite(root, page))) == 2]


def write_pages(root: Path, pages: tuple[str, ...] = PAGES) -> list[str]:
    """Rewrite the generated blocks of ``pages``; returns the pages that changed."""
    changed = []
    for page in pages:
        if not (root / page).is_file():
            continue
        old, new = rewrite(root, page)
        if new != old:
            (root / page).write_text(new)
            changed.append(page)
    return changed
