"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1, option II): the gradient correction, the
client control variate and the server update.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedpers.algorithms.server_state import _f64, _like
from fedpers.core.schema import Key, positive
from fedpers.core.wire import MODEL_SECTION, Contract


# What travels, by named section (fedpers.core.wire.Contract), declared once for the strategy and the client:
# broadcast = x and the server control variate c (one array per model array); upload = y_i and Delta c_i = c_i+ - c_i.
CONTRACT = Contract(broadcast=(MODEL_SECTION, "server_control"),
                    upload=(MODEL_SECTION, "control_delta"))

# SCAFFOLD's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("scaffold_server_lr", float, 1.0, "SCAFFOLD global step size eta_g (paper: 1)", positive),
)


def scaffold_correction(c: Sequence[np.ndarray], c_i: Sequence[np.ndarray]) -> Arrays:
    """Alg. 1 line 10: local steps use ``g_i(y) - c_i + c``; the correction added to the gradient is
    ``c - c_i``."""
    return [np.asarray(a) - np.asarray(b) for a, b in zip(c, c_i, strict=True)]


def scaffold_client_control(c_i: Sequence[np.ndarray], c: Sequence[np.ndarray], x: Sequence[np.ndarray],
                            y: Sequence[np.ndarray], steps: int, lr: float) -> Arrays:
    """Alg. 1 line 12, option II: ``c_i+ = c_i - c + (x - y_i) / (K eta_l)``."""
    return _like([ci - cc + (xx - yy) / (steps * lr)
                  for ci, cc, xx, yy in zip(_f64(c_i), _f64(c), _f64(x), _f64(y), strict=True)], c_i)


def scaffold_server_update(x: Sequence[np.ndarray], c: Sequence[np.ndarray], mean_y: Sequence[np.ndarray],
                           mean_delta_c: Sequence[np.ndarray], num_sampled: int, num_clients: int,
                           server_lr: float = 1.0) -> tuple[Arrays, Arrays]:
    """Alg. 1 lines 16-17: ``x <- x + eta_g mean(y_i - x)`` and ``c <- c + |S|/N mean(Delta c_i)``.
    ``mean_y`` is the average of the uploaded models (so ``mean(Delta y) = mean_y - x``)."""
    new_x = [xx + server_lr * (my - xx) for xx, my in zip(_f64(x), _f64(mean_y), strict=True)]
    new_c = [cc + (num_sampled / num_clients) * dc for cc, dc in zip(_f64(c), _f64(mean_delta_c), strict=True)]
    return _like(new_x, x), _like(new_c, c)
