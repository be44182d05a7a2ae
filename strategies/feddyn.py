"""FedDyn server (Acar et al., ICLR 2021, Algorithm 1).

Broadcast and upload: the model only. The server keeps h (one array per model array, h^0 = 0) and, with
the sampled clients' models theta_i^t, sets ``h^t = h^{t-1} - alpha/N sum_i (theta_i^t - theta^{t-1})``
and ``theta^t = mean(theta_i^t) - h^t / alpha`` (lines 9-10, :func:`fedpers.algorithms.feddyn.feddyn_server_update`).
The mean of the theta_i uses the config's aggregation rule (sample-weighted by default; the paper's plain
mean for equal client sizes). alpha = ``feddyn_alpha``.
"""

from __future__ import annotations

import numpy as np

from fedpers.algorithms.feddyn import feddyn_server_update
from fedpers.algorithms.server_state import zeros_like
from fedpers.core.models import get_arrays, set_arrays
from strategies.base import Updates
from strategies.server_state import ServerStateStrategy


class FedDynStrategy(ServerStateStrategy):
    """FedDyn: dynamic-regularised clients, server state h kept on the server (not broadcast)."""

    def reset_model_state(self) -> None:
        """h = 0 for the current model shapes."""
        super().reset_model_state()
        self.h = zeros_like(get_arrays(self.model, "all"))

    def aggregate(self, server_round: int, updates: Updates):
        """Alg. 1 lines 9-10."""
        models = self.model_updates(updates)
        theta, self.h = feddyn_server_update(self.h, get_arrays(self.model, "all"), self.aggregate_model(models),
                                             num_sampled=len(updates), num_clients=self.federation.num_clients,
                                             alpha=self.cfg.feddyn_alpha)
        return theta

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install theta^t."""
        set_arrays(self.model, aggregated, "all", source="aggregate")

    def extra_state(self):  # checkpoint
        return {**super().extra_state(), **{f"feddyn_h_{i}": a for i, a in enumerate(self.h)}}

    def load_extra_state(self, extra) -> None:  # resume
        super().load_extra_state(extra)
        keys = sorted((k for k in extra if k.startswith("feddyn_h_")), key=lambda k: int(k.rsplit("_", 1)[1]))
        if keys:
            self.h = [np.asarray(extra[k]) for k in keys]
