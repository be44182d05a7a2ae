"""FedDyn client (Acar et al., ICLR 2021, Algorithm 1).

Local objective (line 5): ``L_i(theta) - <grad L_i(theta_i^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2``
with L_i the task loss (CE, or JDFL's joint-label loss) and the client's gradient state
grad L_i(theta_i^{t-1}) kept in ``context.state`` (``feddyn_grad``, 0 at first participation). After
training (line 6): ``grad L_i(theta_i^t) = grad L_i(theta_i^{t-1}) - alpha (theta_i^t - theta^{t-1})``.
Uploads the model only. alpha = ``feddyn_alpha``.
"""

from __future__ import annotations

import torch

from clients.server_state import ServerStateClient, params_in_state_order
from fedpers.algorithms.feddyn import feddyn_client_state, feddyn_regularizer
from fedpers.algorithms.server_state import zeros_like
from fedpers.core.models import get_arrays


class FedDynClient(ServerStateClient):
    """Dynamic-regularised local training."""
    state_model_copies = 1.0  # the dual state (gradient correction), per client (memory estimate)


    def on_download(self) -> None:
        """Snapshot theta^{t-1} and this client's gradient state."""
        self.theta_global = get_arrays(self.model, "all")
        stored = self.load_state("feddyn_grad")
        self.grad_state = stored if stored is not None else zeros_like(self.theta_global)
        self.params = params_in_state_order(self.model)
        self.global_t = self.tensors(self.theta_global)
        self.grad_t = self.tensors(self.grad_state)

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Alg. 1 line 5 on one mini-batch."""
        return self.task_loss(self.model(x), y) + feddyn_regularizer(self.params, self.grad_t, self.global_t,
                                                                     self.cfg.feddyn_alpha)

    def train(self, generator: torch.Generator) -> float:
        """Local training, then the gradient-state update (line 6), stored."""
        loss = super().train(generator)
        self.save_state("feddyn_grad", feddyn_client_state(self.grad_state, get_arrays(self.model, "all"),
                                                           self.theta_global, self.cfg.feddyn_alpha))
        return loss
