"""Checks of client updates before the server aggregates them."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def update_problem(arrays: Sequence[np.ndarray], expected_shapes: Sequence[tuple[int, ...]],
                   num_examples: int, max_examples: int | None = None) -> str | None:
    """Why a client update must not be aggregated, or None when it is well-formed: wrong number of
    arrays, a wrong shape, a non-float dtype, NaN/Inf values, or an implausible sample count."""
    if not isinstance(num_examples, (int, np.integer)) or isinstance(num_examples, bool) or num_examples <= 0:
        return f"implausible sample count {num_examples!r}"
    if max_examples is not None and num_examples > max_examples:
        return f"sample count {num_examples} above the bound {max_examples}"
    if len(arrays) != len(expected_shapes):
        return f"{len(arrays)} arrays instead of {len(expected_shapes)}"
    for i, (arr, shape) in enumerate(zip(arrays, expected_shapes)):
        if tuple(np.shape(arr)) != tuple(shape):
            return f"array {i} has shape {tuple(np.shape(arr))}, expected {tuple(shape)}"
        if not np.issubdtype(np.asarray(arr).dtype, np.floating):
            return f"array {i} has dtype {np.asarray(arr).dtype}, expected floating point"
        if not np.isfinite(arr).all():
            return f"array {i} contains NaN or Inf"
    return None


def weighted_average(updates: Sequence[tuple[Sequence[np.ndarray], int]]) -> list[np.ndarray]:
    """Sample-weighted average ``sum_k n_k theta_k / sum_k n_k`` (FedAvg; pFedKDH Eq. 4 on backbones),
    accumulated in float64 and returned in the inputs' dtype."""
    if not updates:
        raise ValueError("no updates to average")
    total = float(sum(n for _, n in updates))
    first = updates[0][0]
    out = [np.zeros(np.shape(a), dtype=np.float64) for a in first]
    for arrays, n in updates:
        w = n / total
        for acc, a in zip(out, arrays, strict=True):
            acc += w * np.asarray(a, dtype=np.float64)
    return [o.astype(np.asarray(a).dtype) for o, a in zip(out, first)]


def aggregate_updates(updates: Sequence[tuple[Sequence[np.ndarray], int]], rule: str = "mean",
                      trim_fraction: float = 0.1) -> list[np.ndarray]:
    """Aggregate the shared part: ``mean`` = :func:`weighted_average` (FedAvg / pFedKDH Eq. 4);
    ``median`` and ``trimmed_mean`` = Flower's coordinate-wise median (Yin et al. 2018) and trimmed mean
    (``trim_fraction`` cut from each end), which bound the influence of a minority of hostile clients."""
    if rule == "mean":
        return weighted_average(updates)
    from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

    lists = [([np.asarray(a) for a in arrays], n) for arrays, n in updates]
    if rule == "median":
        out = aggregate_median(lists)
    elif rule == "trimmed_mean":
        out = aggregate_trimmed_avg(lists, trim_fraction)
    else:
        raise ValueError(f"unknown aggregation rule '{rule}'")
    return [np.asarray(o, dtype=np.asarray(a).dtype) for o, a in zip(out, lists[0][0])]


def corrupt_update(arrays: Sequence[np.ndarray], fault: str, rng: np.random.Generator) -> list[np.ndarray]:
    """Fault injection for robustness studies: ``nan`` fills the arrays with NaN; ``noise`` adds
    N(0, 10^2) to every entry (a finite but hostile update)."""
    if fault == "nan":
        return [np.full_like(a, np.nan) for a in arrays]
    if fault == "noise":
        return [(a + rng.normal(0.0, 10.0, size=a.shape)).astype(a.dtype) for a in arrays]
    raise ValueError(f"unknown fault '{fault}'")
