"""FedDyn (Acar et al., ICLR 2021): the dynamic regularizer, the client's gradient state and the server
update.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from fedpers.algorithms.server_state import _f64, _like, linear_term
from fedpers.core.schema import Key, positive


# FedDyn's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("feddyn_alpha", float, 0.01, "FedDyn regularisation alpha (paper grid 0.1/0.01/0.001; ours 0.01)", positive),
)


def feddyn_regularizer(params: Sequence[torch.Tensor], grad_state: Sequence[torch.Tensor],
                       global_params: Sequence[torch.Tensor], alpha: float) -> torch.Tensor:
    """Alg. 1 line 5: the dynamic regulariser of client i,
    ``- <grad L_i(theta_i^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2`` (added to L_i(theta))."""
    total = -linear_term(params, grad_state)
    for p, g in zip(params, global_params, strict=True):
        total = total + 0.5 * alpha * (p - g.detach()).pow(2).sum()
    return total


def feddyn_client_state(grad_state: Sequence[np.ndarray], theta_i: Sequence[np.ndarray],
                        theta_global: Sequence[np.ndarray], alpha: float) -> Arrays:
    """Alg. 1 line 6: ``grad L_i(theta_i^t) = grad L_i(theta_i^{t-1}) - alpha (theta_i^t - theta^{t-1})``."""
    return _like([g - alpha * (t - tg) for g, t, tg in
                  zip(_f64(grad_state), _f64(theta_i), _f64(theta_global), strict=True)], grad_state)


def feddyn_server_update(h: Sequence[np.ndarray], theta_prev: Sequence[np.ndarray],
                         mean_theta: Sequence[np.ndarray], num_sampled: int, num_clients: int,
                         alpha: float) -> tuple[Arrays, Arrays]:
    """Alg. 1 lines 9-10: ``h^t = h^{t-1} - alpha (1/m) sum_{i in P_t} (theta_i^t - theta^{t-1})`` (m = N
    clients; the sum is ``|P_t| (mean_theta - theta^{t-1})``) and
    ``theta^t = mean_{P_t}(theta_i^t) - h^t / alpha``. Returns (theta^t, h^t)."""
    new_h = [hh - alpha * (num_sampled / num_clients) * (mt - tp)
             for hh, mt, tp in zip(_f64(h), _f64(mean_theta), _f64(theta_prev), strict=True)]
    new_theta = [mt - hh / alpha for mt, hh in zip(_f64(mean_theta), new_h, strict=True)]
    return _like(new_theta, theta_prev), _like(new_h, h)
