"""The one results format: ``metrics.jsonl`` (one JSON line per round) and ``summary.json``.

``metrics.jsonl`` is appended and flushed after every round, so a crash keeps every finished round.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

ROUND_FIELDS = ("round", "global_acc", "personalized_macro_acc", "per_client_acc", "train_loss",
                "bytes_up", "bytes_down", "round_seconds")


def _clean(value: Any) -> Any:
    """JSON-safe copy: NaN/Inf become null, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultsWriter:
    """Writes one run's results into ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, tensorboard: bool = False):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.summary_path = self.out_dir / "summary.json"
        self.metrics_path.write_text("")  # a new run starts a new file
        if self.summary_path.exists():
            self.summary_path.unlink()

    def append_round(self, record: dict[str, Any]) -> None:
        """Append one round's record and flush it to disk."""
        missing = [f for f in ROUND_FIELDS if f not in record]
        if missing:
            raise ValueError(f"round record lacks {missing}")
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(_clean(record), sort_keys=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round" \
                        and math.isfinite(value):
                    self.tensorboard.add_scalar(key, value, global_step=record["round"])
            self.tensorboard.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` atomically."""
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_clean(summary), indent=2) + "\n")
        os.replace(tmp, self.summary_path)


def read_metrics(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All round records of a run."""
    path = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_summary(out_dir: str | os.PathLike) -> dict[str, Any]:
    """A run's summary."""
    return json.loads((Path(out_dir) / "summary.json").read_text())
