"""FedProc server (Mu et al., FGCS 2023): FedAvg on the model plus global class prototypes.

Broadcast: the model, the global prototypes (C x feature_dim) and a 0/1 availability mask (C,) of the
classes that have a prototype yet. Upload: the model, the client's class prototypes (mean backbone
feature per class after local training) and its class counts. Server: sample-weighted model average;
global prototype of class k = count-weighted mean of the clients' class-k prototypes
(:func:`fedpers.algorithms.fedproc.fedproc_global_prototypes`); classes nobody reported keep their prototype.
"""

from __future__ import annotations

import numpy as np

from fedpers.algorithms import fedproc
from fedpers.algorithms.fedproc import fedproc_global_prototypes
from fedpers.core.models import set_arrays
from strategies.base import Updates
from strategies.server_state import ServerStateStrategy


class FedProcStrategy(ServerStateStrategy):
    """FedProc: global class prototypes next to the model."""

    contract = fedproc.CONTRACT

    def _dims(self) -> tuple[int, int]:
        return self.federation.num_classes, int(self.model.head.in_features)

    def initial_server_state(self) -> list[np.ndarray]:
        """No prototypes yet: zeros and an all-zero availability mask."""
        c, f = self._dims()
        return [np.zeros((c, f), np.float32), np.zeros(c, np.float32)]

    def upload_section_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The model's shapes, local prototypes (C x F) and class counts (C,)."""
        c, f = self._dims()
        return {**super().upload_section_shapes(), "class_prototypes": [(c, f)], "class_counts": [(c,)]}

    def aggregate(self, server_round: int, updates: Updates):
        """Model average; count-weighted prototype average."""
        previous, available = self.server_state
        local = [(u.sections["class_prototypes"][0], u.sections["class_counts"][0]) for u in updates.values()]
        prototypes, seen = fedproc_global_prototypes(local, previous)
        self.server_state = [prototypes, np.maximum(available, seen)]
        return self.aggregate_model(self.model_updates(updates))

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install the averaged model."""
        set_arrays(self.model, aggregated, "all", source="aggregate")
