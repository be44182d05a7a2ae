"""SCAFFOLD server (Karimireddy et al., ICML 2020, Algorithm 1, option II control variates).

Broadcast: the global model x and the server control variate c (one array per model array). Upload: the
local model y_i and the control change Delta c_i = c_i+ - c_i. Server: ``x <- x + eta_g mean(y_i - x)``
(``scaffold_server_lr``; eta_g = 1 gives the average of the y_i) and ``c <- c + |S|/N mean(Delta c_i)``
(lines 16-17, :func:`fedpers.algorithms.scaffold.scaffold_server_update`). The model part of the upload is
aggregated with the config's rule (sample-weighted mean by default, the paper's plain mean for equal
client sizes); Delta c_i with the plain mean of Eq. line 17.

Sections (fedpers.algorithms.scaffold.CONTRACT): ``model`` + ``server_control`` down,
``model`` + ``control_delta`` up.
"""

from __future__ import annotations

import numpy as np

from fedpers.algorithms import scaffold
from fedpers.algorithms.scaffold import scaffold_server_update
from fedpers.algorithms.server_state import zeros_like
from fedpers.core.models import array_shapes, get_arrays, set_arrays
from strategies.base import Updates
from strategies.server_state import ServerStateStrategy


class ScaffoldStrategy(ServerStateStrategy):
    """SCAFFOLD: server control variate c broadcast with the model; Delta c_i uploaded with y_i."""

    contract = scaffold.CONTRACT

    def initial_server_state(self) -> list[np.ndarray]:
        """c = 0 (Alg. 1 line 1)."""
        return zeros_like(get_arrays(self.model, "all"))

    def upload_section_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The model's shapes; delta c_i has the model's shapes."""
        return {**super().upload_section_shapes(), "control_delta": array_shapes(self.model, "all")}

    def aggregate(self, server_round: int, updates: Updates):
        """Alg. 1 lines 16-17."""
        x = get_arrays(self.model, "all")
        new_x, self.server_state = scaffold_server_update(
            x, self.server_state, self.aggregate_model(self.model_updates(updates)),
            self.plain_mean(self.section_updates(updates, "control_delta")),
            num_sampled=len(updates), num_clients=self.federation.num_clients, server_lr=self.cfg.scaffold_server_lr)
        return new_x

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install x (the whole model)."""
        set_arrays(self.model, aggregated, "all", source="aggregate")
