"""The config entries a strategy sends its clients next to the arrays, by name: read and written only
through these helpers, on both ends.
"""

from __future__ import annotations

from typing import Any, Mapping

SERVER_ROUND = "server_round"  # the round a fit/evaluate message belongs to; 0 = before round 1 (JDFL discovery)


def round_config(server_round: int, **extra: Any) -> dict[str, Any]:
    """The config of a round's message: its round number and the method's own ``extra`` entries."""
    return {SERVER_ROUND: int(server_round), **extra}


def server_round_of(config: Mapping[str, Any]) -> int:
    """The round a received message belongs to (0 when the server sent none: before round 1)."""
    return int(config.get(SERVER_ROUND, 0))


JDFL_ROW = "jdfl_row"  # JDFL: the client's soft-target mass over the pseudo-domains (graded/hard targets)


def float_row(values) -> bytes:
    """A row of floats as a config value: little-endian float64 bytes (exact, no text formatting)."""
    import numpy as np

    return np.asarray(values, dtype="<f8").tobytes()


def float_row_of(config: Mapping[str, Any], key: str, default: tuple[float, ...]) -> list[float]:
    """The floats :func:`float_row` sent under ``key`` (``default`` when the server sent none)."""
    import numpy as np

    raw = config.get(key)
    return [float(v) for v in np.frombuffer(raw, dtype="<f8")] if raw is not None else list(default)
