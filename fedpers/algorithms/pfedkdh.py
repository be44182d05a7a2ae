"""pFedKDH (Souza Neto et al., MLSP 2026): the client objective of Eq. (2).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from fedpers.losses import distillation_kl, proximal_term


def pfedkdh_objective(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, *,
                      temperature: float, lambda_kd: float, mu: float,
                      backbone: Sequence[torch.Tensor], global_backbone: Sequence[torch.Tensor]) -> torch.Tensor:
    """pFedKDH local objective, Eq. (2), on one mini-batch:
    ``(1 - lambda_KD) CE(h_phi_k(b_theta_k(x)), y) + lambda_KD T^2 KL(q_g^T || q_k^T)
    + mu/2 ||theta_k - theta_g^t||^2``."""
    ce = F.cross_entropy(student_logits, labels)
    kd = distillation_kl(student_logits, teacher_logits, temperature)
    return ((1.0 - lambda_kd) * ce + lambda_kd * temperature**2 * kd
            + proximal_term(backbone, global_backbone, mu))
