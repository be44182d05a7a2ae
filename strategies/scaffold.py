"""SCAFFOLD server (Karimireddy et al., ICML 2020, Algorithm 1, option II control variates).

Broadcast: the global model x and the server control variate c (one array per model array). Upload: the
local model y_i and the control change Delta c_i = c_i+ - c_i. Server: ``x <- x + eta_g mean(y_i - x)``
(``scaffold_server_lr``; eta_g = 1 gives the average of the y_i) and ``c <- c + |S|/N mean(Delta c_i)``
(lines 16-17, :func:`fedpers.algorithms.scaffold.scaffold_server_update`). The model part of the upload is
aggregated with the config's rule (sample-weighted mean by default, the paper's plain mean for equal
client sizes); Delta c_i with the plain mean of Eq. line 17.

:class:`ServerStateStrategy` is the shared shape of the methods whose broadcast/upload carry arrays
next to the model (SCAFFOLD, FedDyn, FedDC, FedProc).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpers.algorithms.scaffold import scaffold_server_update
from fedpers.algorithms.server_state import zeros_like
from fedpers.models import array_shapes, get_arrays, set_arrays
from fedpers.validation import aggregate_updates
from strategies.base import Updates
from strategies.fedavg import FedAvgStrategy


class ServerStateStrategy(FedAvgStrategy):
    """Whole-model FedAvg whose broadcast is ``model + server_state`` and whose uploads are
    ``model + extra arrays`` (shapes :meth:`extra_upload_shapes`)."""

    def prepare_global_model(self) -> None:
        """Initial server state for the initial model."""
        self.reset_model_state()

    def reset_model_state(self) -> None:
        """(Re)build the server state and the expected upload shapes for the current model (called at
        start and when JDFL expands the head, before any training)."""
        self.server_state: list[np.ndarray] = self.initial_server_state()
        self.num_model_arrays = len(array_shapes(self.model, "all"))
        self.upload_shapes = array_shapes(self.model, "all") + self.extra_upload_shapes()

    def initial_server_state(self) -> list[np.ndarray]:
        """Arrays broadcast next to the model (default: none)."""
        return []

    def extra_upload_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the arrays a client uploads next to its model (default: none)."""
        return []

    def download_arrays(self) -> list[np.ndarray]:
        """The model followed by the server state."""
        return get_arrays(self.model, "all") + [np.asarray(a) for a in self.server_state]

    def split(self, updates: Updates):
        """(model updates, extra updates) of the validated uploads, each a list in arrival order."""
        n = self.num_model_arrays
        return [(a[:n], k) for a, k in updates.values()], [(a[n:], k) for a, k in updates.values()]

    def aggregate_model(self, updates: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
        """The model part with the config's aggregation rule."""
        return aggregate_updates(updates, self.cfg.aggregation, self.cfg.trim_fraction)

    @staticmethod
    def plain_mean(updates: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
        """Unweighted mean of the extra arrays (the papers' 1/|S| sums)."""
        return aggregate_updates([(a, 1) for a, _ in updates], "mean")

    def extra_state(self) -> dict[str, Any]:  # checkpoint
        return {**super().extra_state(), **{f"server_state_{i}": np.asarray(a) for i, a in enumerate(self.server_state)}}

    def load_extra_state(self, extra: dict[str, Any]) -> None:  # resume
        super().load_extra_state(extra)
        keys = sorted((k for k in extra if k.startswith("server_state_")), key=lambda k: int(k.rsplit("_", 1)[1]))
        if keys:
            self.reset_model_state()
            self.server_state = [np.asarray(extra[k]) for k in keys]


class ScaffoldStrategy(ServerStateStrategy):
    """SCAFFOLD: server control variate c broadcast with the model; Delta c_i uploaded with y_i."""

    def initial_server_state(self) -> list[np.ndarray]:
        """c = 0 (Alg. 1 line 1)."""
        return zeros_like(get_arrays(self.model, "all"))

    def extra_upload_shapes(self) -> list[tuple[int, ...]]:
        """Delta c_i has the model's shapes."""
        return array_shapes(self.model, "all")

    def aggregate(self, server_round: int, updates: Updates):
        """Alg. 1 lines 16-17."""
        models, controls = self.split(updates)
        x = get_arrays(self.model, "all")
        new_x, self.server_state = scaffold_server_update(
            x, self.server_state, self.aggregate_model(models), self.plain_mean(controls),
            num_sampled=len(updates), num_clients=self.federation.num_clients, server_lr=self.cfg.scaffold_server_lr)
        return new_x

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install x (the whole model)."""
        set_arrays(self.model, aggregated, "all", source="aggregate")
