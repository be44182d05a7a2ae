"""SCAFFOLD client (Karimireddy et al., ICML 2020, Algorithm 1, option II).

Receives x and c; keeps its control variate c_i in ``context.state`` (``scaffold_ci``, 0 at first
participation). Local steps follow ``y <- y - eta_l (g_i(y) - c_i + c)`` (line 10): the correction
``c - c_i`` enters the gradient through :func:`fedpers.algorithms.server_state.linear_term`, so the task loss (CE, or
JDFL's joint-label loss) is unchanged. After K local steps: ``c_i+ = c_i - c + (x - y_i)/(K eta_l)``
(line 12, option II); uploads y_i and Delta c_i = c_i+ - c_i and stores c_i+.

:class:`ServerStateClient` is the shared shape of the clients whose broadcast carries arrays next to the
model (``server_state``) and whose upload appends client arrays (:meth:`extra_upload`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.fedavg import FedAvgClient
from fedpers.algorithms.scaffold import scaffold_client_control, scaffold_correction
from fedpers.algorithms.server_state import linear_term, local_steps, zeros_like
from fedpers.errors import ClientUpdateError
from fedpers.models import get_arrays, parameter_names
from fedpers.wire import server_round_of


def params_in_state_order(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The model's parameters in :func:`parameter_names` (``all``) order; every state entry must be a
    trainable parameter (true for cnn, se_cnn and gn_cnn: no buffers)."""
    named = dict(model.named_parameters())
    names = parameter_names(model, "all")
    missing = [n for n in names if n not in named]
    if missing:
        raise ClientUpdateError(f"state entries without a parameter (buffers) are not supported: {missing[:3]}")
    return [named[n] for n in names]


class ServerStateClient(FedAvgClient):
    """FedAvg client whose broadcast is ``model + server_state`` and whose upload is ``model + extras``."""

    expected_server_arrays: int | None = None  # None: any number

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Split the broadcast: the first arrays are the model, the rest the server state."""
        n = len(parameter_names(self.model, "all"))
        extra = [np.asarray(a) for a in parameters[n:]]
        if self.expected_server_arrays is not None and len(extra) != self.expected_server_arrays:
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: expected "
                                    f"{n + self.expected_server_arrays} arrays, got {len(parameters)}")
        if not all(np.isfinite(a).all() for a in extra):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: server state is not finite")
        self.server_state = extra
        super().prepare(list(parameters[:n]))

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Remember the round (some losses depend on it), then the base fit."""
        self.server_round = server_round_of(config)
        return super().fit(parameters, config)

    def tensors(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Arrays as float tensors on the client's device."""
        return [torch.as_tensor(np.asarray(a), dtype=torch.float32, device=self.device) for a in arrays]

    def extra_upload(self) -> list[np.ndarray]:
        """Arrays appended to the uploaded model (default: none)."""
        return []

    def upload_arrays(self) -> list[np.ndarray]:
        """Model, then :meth:`extra_upload`."""
        return get_arrays(self.model, "all") + [np.asarray(a, np.float32) for a in self.extra_upload()]


class ScaffoldClient(ServerStateClient):
    """Control-variate-corrected local SGD."""
    state_model_copies = 1.0  # the control variate c_i, per client (memory estimate)

    expected_server_arrays = None  # = number of model arrays, checked in on_download

    def on_download(self) -> None:
        """Snapshot x, c and this client's c_i; the correction c - c_i."""
        self.x = get_arrays(self.model, "all")
        if len(self.server_state) != len(self.x):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: expected {2 * len(self.x)} "
                                    f"arrays (model + control variate), got {len(self.x) + len(self.server_state)}")
        stored = self.load_state("scaffold_ci")
        self.c_i = stored if stored is not None else zeros_like(self.x)
        self.params = params_in_state_order(self.model)
        self.correction = self.tensors(scaffold_correction(self.server_state, self.c_i))

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Task loss + <theta, c - c_i> (gradient g_i - c_i + c)."""
        return self.task_loss(self.model(x), y) + linear_term(self.params, self.correction)

    def train(self, generator: torch.Generator) -> float:
        """K corrected steps, then c_i+ (option II), stored; Delta c_i kept for the upload."""
        loss = super().train(generator)
        steps = local_steps(len(self.data.train), self.cfg.batch_size, self.cfg.local_epochs)
        new_ci = scaffold_client_control(self.c_i, self.server_state, self.x, get_arrays(self.model, "all"),
                                         steps, self.cfg.lr)
        self.delta_c = [n - o for n, o in zip(new_ci, self.c_i)]
        self.save_state("scaffold_ci", new_ci)
        return loss

    def extra_upload(self) -> list[np.ndarray]:
        """Delta c_i."""
        return self.delta_c
