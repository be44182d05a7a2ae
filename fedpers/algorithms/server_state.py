"""Pieces shared by the global optimizers whose clients keep arrays in the model's parameter order
(SCAFFOLD, FedDyn, FedDC): zeros, the linear gradient term and the local step count.

Server-side state (SCAFFOLD's c, FedDyn's h, FedDC's g) is a list of numpy arrays in the order of
:func:`fedpers.core.models.parameter_names` (``all``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch


Arrays = list[np.ndarray]


def _f64(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _like(out: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> Arrays:
    return [np.asarray(o).astype(np.asarray(r).dtype) for o, r in zip(out, ref, strict=True)]


def zeros_like(arrays: Sequence[np.ndarray]) -> Arrays:
    """Zero state shaped like ``arrays`` (float32)."""
    return [np.zeros(np.shape(a), dtype=np.float32) for a in arrays]


def linear_term(params: Sequence[torch.Tensor], direction: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_l <theta_l, v_l>`` with ``v`` detached: a loss term whose gradient is exactly ``v``. Adding it
    to the loss applies a gradient correction through any optimizer (SCAFFOLD's ``c - c_i``, FedDyn's
    ``-grad L_i(theta_i^{t-1})``, FedDC's ``g - g_i``)."""
    total = params[0].new_zeros(())
    for p, v in zip(params, direction, strict=True):
        total = total + (p * v.detach()).sum()
    return total


def local_steps(num_samples: int, batch_size: int, epochs: int) -> int:
    """K: mini-batch SGD steps of one local training (``epochs * ceil(n / B)``)."""
    return max(1, epochs * math.ceil(num_samples / batch_size))
