"""The shared shape of the clients whose broadcast carries named sections next to the model (the server
state: SCAFFOLD's c, FedDC's g, FedProc's prototypes) and whose upload adds sections of their own
(:meth:`ServerStateClient.extra_upload`), each by name (fedpers.core.wire).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.fedavg import FedAvgClient
from fedpers.core.errors import ClientUpdateError
from fedpers.core.models import get_arrays, parameter_names
from fedpers.core.wire import MODEL_SECTION, server_round_of


def params_in_state_order(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The model's parameters in :func:`parameter_names` (``all``) order; every state entry must be a
    trainable parameter (true of every model kind: no buffers)."""
    named = dict(model.named_parameters())
    names = parameter_names(model, "all")
    missing = [n for n in names if n not in named]
    if missing:
        raise ClientUpdateError(f"state entries without a parameter (buffers) are not supported: {missing[:3]}")
    return [named[n] for n in names]


class ServerStateClient(FedAvgClient):
    """FedAvg client whose broadcast is ``model + server state`` and whose upload is ``model + extras``."""

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """The broadcast's sections after the model are the server state (``self.server_state``, their
        arrays in section order), checked finite; then the model is loaded."""
        extra = [np.asarray(a) for name in self.broadcast_sections if name != MODEL_SECTION
                 for a in self.received[name]]
        if not all(np.isfinite(a).all() for a in extra):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: server state is not finite")
        self.server_state = extra
        super().prepare(parameters)

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Remember the round (some losses depend on it), then the base fit."""
        self.server_round = server_round_of(config)
        return super().fit(parameters, config)

    def tensors(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Arrays as float tensors on the client's device."""
        return [torch.as_tensor(np.asarray(a), dtype=torch.float32, device=self.device) for a in arrays]

    def extra_upload(self) -> dict[str, list[np.ndarray]]:
        """The upload's sections after the model, by name (default: none)."""
        return {}

    def upload_content(self) -> dict[str, list[np.ndarray]]:
        """The model section (:meth:`upload_arrays`), then :meth:`extra_upload`."""
        return {MODEL_SECTION: self.upload_arrays(),
                **{name: [np.asarray(a, np.float32) for a in arrays] for name, arrays in self.extra_upload().items()}}

    def upload_arrays(self) -> list[np.ndarray]:
        """The whole model."""
        return get_arrays(self.model, "all")
