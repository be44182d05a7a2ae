"""One clear progress line per round, with an ETA."""

from __future__ import annotations

from typing import Any


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_round_line(record: dict[str, Any], total_rounds: int, elapsed: float) -> str:
    """``fedpers | round 3/10 | global_acc 0.9120 | pers_acc 0.9530 | loss 0.2100 | 4.2 s | ETA 0:00:29``."""
    r = record["round"]
    parts = [f"fedpers | round {r}/{total_rounds}"]
    for key, label in (("global_acc", "global_acc"), ("personalized_macro_acc", "pers_acc"),
                       ("train_loss", "loss")):
        value = record.get(key)
        if value is not None:
            parts.append(f"{label} {value:.4f}")
    if record.get("rejected_updates"):
        parts.append(f"rejected {record['rejected_updates']}")
    parts.append(f"{record['round_seconds']:.1f} s")
    eta = elapsed / r * (total_rounds - r) if r else 0.0
    parts.append(f"ETA {_fmt_seconds(eta)}")
    return " | ".join(parts)
