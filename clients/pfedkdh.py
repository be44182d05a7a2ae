"""pFedKDH client (Souza Neto et al., MLSP 2026, Sec. 3.2 and 3.4).

Each round the client loads the broadcast (theta_g, phi_g) as a frozen teacher, starts its student from
theta_k <- theta_g and its own persistent head phi_k (Algorithm 1 line 10), minimises Eq. (2) for E
epochs, uploads only theta_k and keeps phi_k (lines 12-13).

Evaluation (Sec. 3.4): **Fair** uses (theta_g, phi_k) as is. **EA** refines a copy of phi_k by
``ea_steps`` head-only SGD steps on the client's train data with theta_g frozen (no test data), and
reports the Fair accuracy as ``acc_fair`` too, since both share the same training. The EA steps are
evaluation-only: the persistent head is not changed by them (ours; the paper does not say).
"""

from __future__ import annotations

import torch

from clients.base import FedPersClient
from fedpers.algorithms import pfedkdh
from fedpers.algorithms.pfedkdh import pfedkdh_objective
from fedpers.models import backbone_parameters
from fedpers.training import accuracy_and_loss, adapt_head_copy, backbone_features, frozen_copy


class PFedKDHClient(FedPersClient):
    """Student (theta_k, phi_k) distilled from the teacher (theta_g, phi_g)."""

    contract = pfedkdh.CONTRACT
    persistent_part = "head"

    def on_download(self) -> None:
        """Snapshot the teacher (theta_g, phi_g) and the reference backbone theta_g of the proximal term."""
        self.teacher = frozen_copy(self.model)
        self.student_backbone = backbone_parameters(self.model)
        self.global_backbone = [p.detach().clone() for p in self.student_backbone]

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. (2) on one mini-batch."""
        with torch.no_grad():
            teacher_logits = self.teacher(x)
        return pfedkdh_objective(
            self.model(x), teacher_logits, y, temperature=self.cfg.temperature, lambda_kd=self.cfg.lambda_kd,
            mu=self.cfg.mu, backbone=self.student_backbone, global_backbone=self.global_backbone)

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Fair: persistent head as is. EA: head-only adaptation on train data, then test. Both heads read
        the same test features b_theta_g(x), computed once."""
        test = self.data.test
        features = backbone_features(self.model, test.x)
        with torch.no_grad():
            fair_acc, fair_loss = accuracy_and_loss(self.model.head(features), test.y)
        if self.cfg.variant == "fair":
            return fair_acc, fair_loss, {}
        train = self.data.train
        head = adapt_head_copy(self.model, train.x, train.y, steps=self.cfg.ea_steps, lr=self.cfg.ea_lr,
                               batch_size=self.cfg.batch_size, generator=generator)
        with torch.no_grad():
            head.eval()
            acc, loss = accuracy_and_loss(head(features), test.y)
        return acc, loss, {"acc_fair": fair_acc}
