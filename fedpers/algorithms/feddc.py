"""FedDC (Gao et al., CVPR 2022): the drift penalty, the gradient correction, the drift update and the
server state.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fedpers.algorithms.scaffold import scaffold_client_control
from fedpers.algorithms.server_state import _f64, _like
from fedpers.core.schema import Key, positive
from fedpers.core.wire import MODEL_SECTION, Contract


# What travels, by named section (fedpers.core.wire.Contract), declared once for the strategy and the client:
# broadcast = w and the average update-rate state g (one array per model array); upload = theta_i + h_i and Delta g_i.
CONTRACT = Contract(broadcast=(MODEL_SECTION, "update_rate"),
                    upload=(MODEL_SECTION, "update_rate_delta"))

# FedDC's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("feddc_alpha", float, 0.01, "FedDC drift penalty alpha (FedDC code default 0.01)", positive),
)


def feddc_penalty(params: Sequence[torch.Tensor], drift: Sequence[torch.Tensor], global_params: Sequence[torch.Tensor],
                  alpha: float) -> torch.Tensor:
    """The drift penalty of FedDC's local objective (Eq. 7's R term): ``alpha/2 ||theta_i + h_i - w||^2``."""
    total = params[0].new_zeros(())
    for p, h, w in zip(params, drift, global_params, strict=True):
        total = total + (p + h.detach() - w.detach()).pow(2).sum()
    return 0.5 * alpha * total


def feddc_correction(g_i: Sequence[np.ndarray], g: Sequence[np.ndarray]) -> Arrays:
    """The gradient correction of FedDC's local objective (Eq. 7's G term, ``<theta_i, g - g_i>`` up to the
    1/(eta K) scaling that the update-rate states below already carry, as in the authors' code):
    the gradient direction added is ``g - g_i``."""
    return [np.asarray(a) - np.asarray(b) for a, b in zip(g, g_i, strict=True)]


def feddc_update_drift(drift: Sequence[np.ndarray], theta_i: Sequence[np.ndarray], w: Sequence[np.ndarray]) -> Arrays:
    """Local drift update (Alg. 1): ``h_i <- h_i + (theta_i - w)``."""
    return _like([h + t - ww for h, t, ww in zip(_f64(drift), _f64(theta_i), _f64(w), strict=True)], drift)


def feddc_client_gradient_state(g_i: Sequence[np.ndarray], g: Sequence[np.ndarray], w: Sequence[np.ndarray],
                                theta_i: Sequence[np.ndarray], steps: int, lr: float) -> Arrays:
    """Local update-rate state (as SCAFFOLD's option II, FedDC code): ``g_i+ = g_i - g + (w - theta_i)/(K eta)``."""
    return scaffold_client_control(g_i, g, w, theta_i, steps, lr)


def feddc_corrected_model(theta_i: Sequence[np.ndarray], drift: Sequence[np.ndarray]) -> Arrays:
    """What a FedDC client uploads for aggregation: the drift-corrected parameters ``theta_i + h_i``
    (the server's ``w = 1/|S| sum_i (theta_i + h_i)``)."""
    return _like([t + h for t, h in zip(_f64(theta_i), _f64(drift), strict=True)], theta_i)


def feddc_server_state(g: Sequence[np.ndarray], mean_delta_g: Sequence[np.ndarray], num_sampled: int,
                       num_clients: int) -> Arrays:
    """The server's average update-rate state over all N clients: ``g <- g + (1/N) sum_{i in S} Delta g_i``."""
    return _like([gg + (num_sampled / num_clients) * dg for gg, dg in zip(_f64(g), _f64(mean_delta_g), strict=True)], g)
