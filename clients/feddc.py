"""FedDC client (Gao et al., CVPR 2022, Algorithm 1; local drift decoupling and correction).

State in ``context.state``: the local drift h_i (``feddc_drift``) and the update-rate state g_i
(``feddc_grad``), both 0 at first participation. Receives w and the average state g. Local objective
(Eq. 7): ``L_i(theta) + alpha/2 ||theta + h_i - w||^2 + <theta, g - g_i>`` (task loss L_i: CE or JDFL's).
After K local steps: ``h_i <- h_i + (theta_i - w)``, ``g_i+ = g_i - g + (w - theta_i)/(K eta)`` (the
authors' code); uploads the corrected model ``theta_i + h_i`` and ``Delta g_i``. alpha = ``feddc_alpha``
(the FedDC code additionally divides alpha by the client's relative data size; ours: constant).
"""

from __future__ import annotations

import numpy as np
import torch

from clients.server_state import ServerStateClient, params_in_state_order
from fedpers.algorithms import feddc
from fedpers.core.errors import ClientUpdateError
from fedpers.core.models import get_arrays
from fedpers.algorithms.feddc import (feddc_client_gradient_state, feddc_corrected_model, feddc_correction,
                                      feddc_penalty, feddc_update_drift)
from fedpers.algorithms.server_state import linear_term, local_steps, zeros_like


class FedDCClient(ServerStateClient):
    """Drift-decoupled, gradient-corrected local training."""
    state_model_copies = 2.0  # the drift variable and the gradient correction, per client (memory estimate)
    contract = feddc.CONTRACT

    def on_download(self) -> None:
        """Snapshot w, g and this client's h_i, g_i."""
        self.w = get_arrays(self.model, "all")
        if len(self.server_state) != len(self.w):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: expected {2 * len(self.w)} "
                                    f"arrays (model + g), got {len(self.w) + len(self.server_state)}")
        drift, grad = self.load_state("feddc_drift"), self.load_state("feddc_grad")
        self.drift = drift if drift is not None else zeros_like(self.w)
        self.g_i = grad if grad is not None else zeros_like(self.w)
        self.params = params_in_state_order(self.model)
        self.w_t, self.drift_t = self.tensors(self.w), self.tensors(self.drift)
        self.correction = self.tensors(feddc_correction(self.g_i, self.server_state))

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """FedDC Eq. (7) on one mini-batch."""
        return (self.task_loss(self.model(x), y)
                + feddc_penalty(self.params, self.drift_t, self.w_t, self.cfg.feddc_alpha)
                + linear_term(self.params, self.correction))

    def train(self, generator: torch.Generator) -> float:
        """Local training, then drift and update-rate state updates (stored)."""
        loss = super().train(generator)
        theta = get_arrays(self.model, "all")
        steps = local_steps(len(self.data.train), self.cfg.batch_size, self.cfg.local_epochs)
        new_g = feddc_client_gradient_state(self.g_i, self.server_state, self.w, theta, steps, self.cfg.lr)
        self.drift = feddc_update_drift(self.drift, theta, self.w)
        self.delta_g = [n - o for n, o in zip(new_g, self.g_i)]
        self.corrected = feddc_corrected_model(theta, self.drift)
        self.save_state("feddc_drift", self.drift)
        self.save_state("feddc_grad", new_g)
        return loss

    def upload_arrays(self) -> list[np.ndarray]:
        """The model section: theta_i + h_i."""
        return [np.asarray(a) for a in self.corrected]

    def extra_upload(self) -> dict[str, list[np.ndarray]]:
        """Delta g_i."""
        return {"update_rate_delta": self.delta_g}
