"""FedProx client: cross-entropy plus the proximal term ``mu/2 ||w - w^t||^2`` (Li et al. 2020, Eq. 2)."""

import torch
import torch.nn.functional as F

from clients.fedavg import FedAvgClient
from fedpers.core.losses import proximal_term


class FedProxClient(FedAvgClient):
    """Local objective h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2."""

    def on_download(self) -> None:
        """Keep a detached copy of the global model w^t for the proximal term."""
        self.global_params = [p.detach().clone() for p in self.model.parameters()]

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """FedProx Eq. (2) on one mini-batch."""
        return F.cross_entropy(self.model(x), y) + proximal_term(
            list(self.model.parameters()), self.global_params, self.cfg.mu)
