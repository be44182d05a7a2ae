"""The shared shape of the strategies whose broadcast and uploads carry named sections next to the model
(SCAFFOLD, FedDyn, FedDC, FedProc; JDFL wraps them): whole-model FedAvg whose broadcast is the model plus
the server state, and whose uploads are the model plus client sections, each by name (fedpers.core.wire).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpers.core.models import array_shapes, get_arrays
from fedpers.core.validation import aggregate_updates
from fedpers.core.wire import MODEL_SECTION
from strategies.base import Updates
from strategies.fedavg import FedAvgStrategy


class ServerStateStrategy(FedAvgStrategy):
    """Whole-model FedAvg whose broadcast is ``model + server state`` (the sections after the model in
    ``broadcast_sections``, :meth:`server_sections`) and whose uploads are ``model + client sections``
    (their shapes: :meth:`upload_section_shapes`)."""

    def prepare_global_model(self) -> None:
        """Initial server state for the initial model."""
        self.reset_model_state()

    def reset_model_state(self) -> None:
        """(Re)build the server state and the expected upload shapes for the current model (called at
        start and when JDFL expands the head, before any training)."""
        self.server_state: list[np.ndarray] = self.initial_server_state()
        self.upload_shapes = array_shapes(self.model, "all")

    def initial_server_state(self) -> list[np.ndarray]:
        """Arrays broadcast next to the model, in section order (default: none)."""
        return []

    def server_sections(self) -> dict[str, list[np.ndarray]]:
        """The server state by broadcast section (default: every array in the one section after the model)."""
        names = self.broadcast_sections[1:]
        if not names:
            return {}
        if len(names) == 1:
            return {names[0]: list(self.server_state)}
        return {name: [array] for name, array in zip(names, self.server_state)}  # one array per section

    def broadcast_content(self) -> dict[str, list[np.ndarray]]:
        """The model, then the server state."""
        return {MODEL_SECTION: get_arrays(self.model, "all"),
                **{name: [np.asarray(a) for a in arrays] for name, arrays in self.server_sections().items()}}

    @staticmethod
    def section_updates(updates: Updates, name: str) -> list[tuple[list[np.ndarray], int]]:
        """(section ``name``, sample count) of each validated upload, in arrival order."""
        return [(u.sections[name], u.num_examples) for u in updates.values()]

    def aggregate_model(self, updates: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
        """The model part with the config's aggregation rule."""
        return aggregate_updates(updates, self.cfg.aggregation, self.cfg.trim_fraction)

    @staticmethod
    def plain_mean(updates: list[tuple[list[np.ndarray], int]]) -> list[np.ndarray]:
        """Unweighted mean of a section's arrays (the papers' 1/|S| sums)."""
        return aggregate_updates([(a, 1) for a, _ in updates], "mean")

    def extra_state(self) -> dict[str, Any]:  # checkpoint
        return {**super().extra_state(), **{f"server_state_{i}": np.asarray(a) for i, a in enumerate(self.server_state)}}

    def load_extra_state(self, extra: dict[str, Any]) -> None:  # resume
        super().load_extra_state(extra)
        keys = sorted((k for k in extra if k.startswith("server_state_")), key=lambda k: int(k.rsplit("_", 1)[1]))
        if keys:
            self.reset_model_state()
            self.server_state = [np.asarray(extra[k]) for k in keys]
