"""Loss functions of the methods, as small pure functions of tensors."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(q_g^T || q_k^T), averaged over the batch: the distillation term of pFedKDH Eq. (2) (Hinton et
    al.'s softened softmax ``q_i^T = exp(z_i/T) / sum_j exp(z_j/T)``), without the ``lambda_KD T^2`` factor.
    The teacher is detached: no gradient flows into it."""
    log_student = F.log_softmax(student_logits / temperature, dim=1)
    log_teacher = F.log_softmax(teacher_logits.detach() / temperature, dim=1)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")


def squared_distance(params: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> torch.Tensor:
    """``||theta - theta_ref||_2^2`` summed over all tensors (reference detached)."""
    total = params[0].new_zeros(())
    for p, r in zip(params, reference, strict=True):
        total = total + (p - r.detach()).pow(2).sum()
    return total


def proximal_term(params: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], mu: float) -> torch.Tensor:
    """``mu/2 ||theta - theta_g||^2``: the proximal term of FedProx (Li et al. 2020, Eq. 2) and the third
    term of pFedKDH Eq. (2)."""
    if mu == 0:
        return params[0].new_zeros(())
    return 0.5 * mu * squared_distance(params, reference)
