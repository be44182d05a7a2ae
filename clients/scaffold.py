"""SCAFFOLD client (Karimireddy et al., ICML 2020, Algorithm 1, option II).

Receives x and c; keeps its control variate c_i in ``context.state`` (``scaffold_ci``, 0 at first
participation). Local steps follow ``y <- y - eta_l (g_i(y) - c_i + c)`` (line 10): the correction
``c - c_i`` enters the gradient through :func:`fedpers.algorithms.server_state.linear_term`, so the task loss (CE, or
JDFL's joint-label loss) is unchanged. After K local steps: ``c_i+ = c_i - c + (x - y_i)/(K eta_l)``
(line 12, option II); uploads y_i and Delta c_i = c_i+ - c_i and stores c_i+.

Sections (fedpers.algorithms.scaffold.CONTRACT): ``model`` + ``server_control`` down,
``model`` + ``control_delta`` up.
"""

from __future__ import annotations

import numpy as np
import torch

from clients.server_state import ServerStateClient, params_in_state_order
from fedpers.algorithms import scaffold
from fedpers.algorithms.scaffold import scaffold_client_control, scaffold_correction
from fedpers.algorithms.server_state import linear_term, local_steps, zeros_like
from fedpers.core.errors import ClientUpdateError
from fedpers.core.models import get_arrays


class ScaffoldClient(ServerStateClient):
    """Control-variate-corrected local SGD."""
    state_model_copies = 1.0  # the control variate c_i, per client (memory estimate)
    contract = scaffold.CONTRACT

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

    def extra_upload(self) -> dict[str, list[np.ndarray]]:
        """Delta c_i."""
        return {"control_delta": self.delta_c}
