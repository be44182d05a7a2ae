"""Loss terms that more than one method uses (FedProx, Ditto and pFedKDH: the proximal term), as small pure
functions of tensors; a loss of one method is in its own math module (``fedpers/algorithms/<method>.py``)."""

from __future__ import annotations

from typing import Sequence

import torch


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
