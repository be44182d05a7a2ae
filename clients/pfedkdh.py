"""pFedKDH client (Souza Neto et al., MLSP 2026, Sec. 3.2 and 3.4).

Each round the client loads the broadcast (theta_g, phi_g) as a frozen teacher, starts its student from
theta_k <- theta_g and its own persistent head phi_k (Algorithm 1 line 10), minimises Eq. (2) for E
epochs, uploads only theta_k and keeps phi_k (lines 12-13).

Evaluation (Sec. 3.4): **Fair** uses (theta_g, phi_k) as is. **EA** refines a copy of phi_k by
``ea_steps`` head-only SGD steps (or ``ea_epochs`` epochs) on the client's train data with theta_g frozen
(no test data), and reports the Fair accuracy as ``acc_fair`` too, since both share the same training. The EA steps are
evaluation-only: the persistent head is not changed by them (ours; the paper does not say).
"""

from __future__ import annotations

import torch

from clients.base import FedPersClient
from fedpers.algorithms import pfedkdh
from fedpers.algorithms.pfedkdh import (adapt_head_copies, adaptation_steps, parse_adaptation_lengths,
                                       pfedkdh_objective)
from fedpers.core.models import backbone_parameters
from fedpers.core.training import accuracy_and_loss, backbone_features, frozen_copy


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
        """Fair: persistent head as is. EA: head-only adaptation on train data, then test (and each length
        of ``ea_also`` as ``acc_ea<length>``). Every head reads the same test features b_theta_g(x),
        computed once."""
        test = self.data.test
        features = backbone_features(self.model, test.x)
        with torch.no_grad():
            fair_acc, fair_loss = accuracy_and_loss(self.model.head(features), test.y)
        if self.cfg.variant == "fair":
            return fair_acc, fair_loss, {}
        n, batch, drop = len(self.data.train), self.cfg.batch_size, self.cfg.drop_last_batch
        main = (adaptation_steps(self.cfg.ea_epochs, "epochs", n, batch, drop_last=drop) if self.cfg.ea_epochs > 0
                else self.cfg.ea_steps)
        also = {token: adaptation_steps(count, unit, n, batch, drop_last=drop)
                for token, count, unit in parse_adaptation_lengths(self.cfg.ea_also)}
        heads = self.adapted_heads([main, *also.values()], generator)
        extra = {"acc_fair": fair_acc}
        with torch.no_grad():
            acc, loss = accuracy_and_loss(heads[main].eval()(features), test.y)
            for token, steps in also.items():
                extra[f"acc_ea{token}"] = accuracy_and_loss(heads[steps].eval()(features), test.y)[0]
        return acc, loss, extra

    def adapted_heads(self, steps: list[int], generator: torch.Generator) -> dict[int, torch.nn.Module]:
        """The EA head copies after each count of ``steps``, adapted once per message: the validation pass
        (same seed, same train data) gets the very heads the test pass used."""
        if getattr(self, "_adapted", None) is None:
            train = self.data.train
            self._adapted = adapt_head_copies(self.model, train.x, train.y, steps=steps, lr=self.cfg.ea_lr,
                                              batch_size=self.cfg.batch_size, generator=generator,
                                              drop_last=self.cfg.drop_last_batch)
        return self._adapted
