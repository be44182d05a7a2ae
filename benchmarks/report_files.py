"""One way for a benchmark to write its figures: ``benchmarks/results/<stem>.md`` and ``.json`` (a stem may
name a folder: ``scale/table``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_report(stem: str, markdown: str, data: Any) -> None:
    """Write ``markdown`` to results/<stem>.md and ``data`` to results/<stem>.json, and print the markdown."""
    (RESULTS / stem).parent.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.md").write_text(markdown)
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(markdown)
