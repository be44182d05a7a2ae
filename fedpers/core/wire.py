"""The config entries a strategy sends its clients next to the arrays, by name: read and written only
through these helpers, on both ends.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Mapping

SERVER_ROUND = "server_round"  # the round a fit/evaluate message belongs to; 0 = before round 1 (JDFL discovery)


def round_config(server_round: int, **extra: Any) -> dict[str, Any]:
    """The config of a round's message: its round number and the method's own ``extra`` entries."""
    return {SERVER_ROUND: int(server_round), **extra}


def server_round_of(config: Mapping[str, Any]) -> int:
    """The round a received message belongs to (0 when the server sent none: before round 1)."""
    return int(config.get(SERVER_ROUND, 0))


# --- the partition a message is for (client_layout=pool) ---------------------------------------------
# In a pooled simulation a few nodes serve every client: each fit/evaluate message names the partition it
# is for, and the node builds that client for that message alone. The reply names its partition too
# (the client's ``partition_id`` metric), and the server checks the two agree.
PARTITION_ID = "partition_id"


def for_partition(config: Mapping[str, Any], partition_id: int) -> dict[str, Any]:
    """A message's ``config`` that names the partition (client) a pooled node is to serve with it."""
    return {**config, PARTITION_ID: int(partition_id)}


def partition_of_message(config: Mapping[str, Any]) -> int | None:
    """The partition a message names (:func:`for_partition`); None for a message of a node that holds one
    partition of its own (its node config's ``partition-id``)."""
    value = config.get(PARTITION_ID)
    return None if value is None else int(value)


VALIDATION_PREFIX = "val_"  # in an evaluate reply's metrics: the same metric on the client's validation split


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


# --- an evaluation carried by the next round's fit message (config key evaluate_with_next_fit) ----------
# Round t's evaluation of a client sampled again in round t + 1 travels with that fit message instead of
# a message of its own: the fit message carries the same broadcast the evaluate message would have (the
# model aggregated in round t), the client runs round t's evaluation on it before it trains, and the fit
# reply carries the results under CARRIED_PREFIX.
EVALUATE_ROUND = "evaluate_round"  # in a fit message's config: first evaluate as that round's evaluate message
CARRIED_PREFIX = "evaluated:"  # in a fit reply's metrics: the carried evaluation's loss, examples and metrics
_CARRIED_LOSS = CARRIED_PREFIX + "loss"
_CARRIED_EXAMPLES = CARRIED_PREFIX + "num_examples"


def with_evaluation(config: Mapping[str, Any], evaluate_round: int) -> dict[str, Any]:
    """A fit message's ``config`` that also asks for the evaluation of ``evaluate_round``."""
    return {**config, EVALUATE_ROUND: int(evaluate_round)}


def evaluate_round_of(config: Mapping[str, Any]) -> int | None:
    """The round whose evaluation a fit message carries (None: a plain fit message)."""
    value = config.get(EVALUATE_ROUND)
    return None if value is None else int(value)


def carried_metrics(loss: float, num_examples: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluate reply (``loss``, ``num_examples``, ``metrics``) as entries of a fit reply's metrics."""
    return {_CARRIED_LOSS: float(loss), _CARRIED_EXAMPLES: int(num_examples),
            **{CARRIED_PREFIX + key: value for key, value in metrics.items()}}


def carried_evaluation_of(metrics: Mapping[str, Any]) -> tuple[float, int, dict[str, Any]] | None:
    """The evaluate reply :func:`carried_metrics` put in a fit reply's ``metrics`` (None: none carried)."""
    if _CARRIED_LOSS not in metrics or _CARRIED_EXAMPLES not in metrics:
        return None
    rest = {key[len(CARRIED_PREFIX):]: value for key, value in metrics.items()
            if key.startswith(CARRIED_PREFIX) and key not in (_CARRIED_LOSS, _CARRIED_EXAMPLES)}
    return float(metrics[_CARRIED_LOSS]), int(metrics[_CARRIED_EXAMPLES]), rest


# --- the arrays of a message, in named sections ---------------------------------------------------------
# A message's arrays are named sections, concatenated in the order the method declares them once (its
# Contract: ``broadcast`` / ``upload``, the ``contract`` of its strategy and its client). The sender puts
# each section's number of arrays next to them (the config of a fit or evaluate message, the metrics of a
# fit reply) under ARRAYS_PREFIX + name; the receiver splits by name and refuses a message whose sections
# are not the declared ones or whose counts do not add up.
MODEL_SECTION = "model"  # the model part a method broadcasts or uploads (download_part / upload_part)
ARRAYS_PREFIX = "arrays:"


@dataclass(frozen=True)
class Contract:
    """What a method's strategy and its client exchange, declared once for both (``contract`` on each
    class; tests/test_layers.py checks they are the same): the part of the model in the broadcast's and
    the upload's ``model`` section (``all`` | ``backbone`` | ``head``, fedpers.core.models), and the named
    sections of each message, in order."""

    download_part: str = "all"
    upload_part: str = "all"
    broadcast: tuple[str, ...] = (MODEL_SECTION,)
    upload: tuple[str, ...] = (MODEL_SECTION,)


WHOLE_MODEL = Contract()  # FedAvg and its family, Ditto, pFedMe, FedALA, pFedSim, FedDyn, MOON, FedProx
BACKBONE_ONLY = Contract("backbone", "backbone")  # FedPer, FedRep, FedBABU, FedEAGD: the head never leaves


class ContractSide:
    """The strategy's and the client's base: their ``contract`` and its parts as read-only attributes, so
    that no method declares a part of it on one side only."""

    contract: Contract = WHOLE_MODEL

    @property
    def download_part(self) -> str:
        """The part of the model the broadcast's model section holds."""
        return self.contract.download_part

    @property
    def upload_part(self) -> str:
        """The part of the model an upload's model section holds."""
        return self.contract.upload_part

    @property
    def broadcast_sections(self) -> tuple[str, ...]:
        """The broadcast's named sections, in order."""
        return self.contract.broadcast

    @property
    def upload_sections(self) -> tuple[str, ...]:
        """An upload's named sections, in order."""
        return self.contract.upload


class SectionError(ValueError):
    """A message's arrays are not the sections its method declares."""


def join_sections(sections: Mapping[str, Any], names: tuple[str, ...]) -> tuple[list, dict[str, int]]:
    """The arrays of a message (``sections`` in the declared order ``names``) and the entries that count
    them; raises SectionError when ``sections`` are not exactly ``names`` (the sender's own check)."""
    if set(sections) != set(names):
        raise SectionError(f"sections {sorted(sections)} sent, but the method declares {list(names)}")
    arrays = [array for name in names for array in sections[name]]
    return arrays, {ARRAYS_PREFIX + name: len(sections[name]) for name in names}


def section_counts_of(entries: Mapping[str, Any]) -> dict[str, int]:
    """The section-count entries of a message's config or metrics (to pass on with the same arrays)."""
    return {key: value for key, value in entries.items() if key.startswith(ARRAYS_PREFIX)}


def split_sections(arrays: list, entries: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, list]:
    """The sections ``names`` of a received message's ``arrays``, split by the counts in ``entries`` (its
    config or metrics). A message of one section may come without counts (all arrays are that section).
    Raises SectionError naming what differs from the declaration."""
    counts = {key[len(ARRAYS_PREFIX):]: value for key, value in section_counts_of(entries).items()}
    if not counts and len(names) == 1:
        return {names[0]: list(arrays)}
    if set(counts) != set(names):
        raise SectionError(f"sections {sorted(counts)} received, but the method declares {list(names)}")
    bad = [name for name in names
           if isinstance(counts[name], bool) or not isinstance(counts[name], numbers.Integral) or counts[name] < 0]
    if bad:
        raise SectionError(f"section '{bad[0]}': array count {counts[bad[0]]!r} is not a non-negative integer")
    if sum(counts[name] for name in names) != len(arrays):
        raise SectionError(f"{len(arrays)} arrays received, but the sections count "
                           f"{', '.join(f'{name}={counts[name]}' for name in names)}")
    out, start = {}, 0
    for name in names:
        out[name] = list(arrays[start:start + int(counts[name])])
        start += int(counts[name])
    return out
