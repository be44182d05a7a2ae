"""FedDC server (Gao et al., CVPR 2022, Algorithm 1: local drift decoupling and correction).

Broadcast: the global model w and the average update-rate state g (one array per model array, g = 0 at
start). Upload: the drift-corrected local model theta_i + h_i and the change Delta g_i of the client's
update-rate state. Server: ``w = mean_i(theta_i + h_i)`` (config's aggregation rule; sample-weighted by
default, the paper's plain mean for equal sizes) and ``g <- g + (1/N) sum_i Delta g_i`` (the average of
all N clients' g_i, kept incrementally as in the authors' code; :func:`fedpers.algorithms.feddc.feddc_server_state`).
"""

from __future__ import annotations

import numpy as np

from fedpers.algorithms import feddc
from fedpers.algorithms.feddc import feddc_server_state
from fedpers.algorithms.server_state import zeros_like
from fedpers.core.models import array_shapes, get_arrays, set_arrays
from strategies.base import Updates
from strategies.server_state import ServerStateStrategy


class FedDCStrategy(ServerStateStrategy):
    """FedDC: w from drift-corrected uploads; g broadcast with w."""

    contract = feddc.CONTRACT

    def initial_server_state(self) -> list[np.ndarray]:
        """g = 0."""
        return zeros_like(get_arrays(self.model, "all"))

    def upload_section_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The model's shapes; delta g_i has the model's shapes."""
        return {**super().upload_section_shapes(), "update_rate_delta": array_shapes(self.model, "all")}

    def aggregate(self, server_round: int, updates: Updates):
        """w = mean(theta_i + h_i); g += |S|/N mean(Delta g_i)."""
        deltas = self.section_updates(updates, "update_rate_delta")
        self.server_state = feddc_server_state(self.server_state, self.plain_mean(deltas), len(updates),
                                               self.federation.num_clients)
        return self.aggregate_model(self.model_updates(updates))

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install w."""
        set_arrays(self.model, aggregated, "all", source="aggregate")
