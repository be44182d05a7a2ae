"""Ditto (Li et al., ICML 2021): the personal objective ``F_k(v) + lambda/2 ||v - w||^2`` (also pFedMe's
inner problem).
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F

from fedpers.core.losses import proximal_term
from fedpers.core.schema import Key, non_negative


# Ditto's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("ditto_lambda", float, 0.1,
        "Ditto lambda of the personal objective F_k(v) + lambda/2 ||v - w^t||^2 (ours, from the paper's grid "
        "0.05-2)", non_negative),
    Key("ditto_personal_epochs", int, 0,
        "Ditto epochs of the personal-model update per round (s of Alg. 1); 0 = local_epochs (ours)",
        non_negative),
)


def personal_objective(logits: torch.Tensor, labels: torch.Tensor, params: Sequence[torch.Tensor],
                       anchor: Sequence[torch.Tensor], lam: float) -> torch.Tensor:
    """``f(theta; batch) + lambda/2 ||theta - w||^2`` on one mini-batch, with ``f`` the cross-entropy and
    ``w`` = ``anchor`` (detached).

    * Ditto (Li et al., ICML 2021), Eq. (2) / Alg. 1: the personal objective
      ``h_k(v_k; w^t) = F_k(v_k) + lambda/2 ||v_k - w^t||^2`` with ``w^t`` the round's global model.
    * pFedMe (Dinh et al., NeurIPS 2020), Eq. (2): the inner (personalized) problem
      ``theta_i(w) = argmin_theta f_i(theta) + lambda/2 ||theta - w||^2`` (the Moreau envelope of f_i),
      with ``w`` the client's local copy of the global model.
    """
    return F.cross_entropy(logits, labels) + proximal_term(list(params), list(anchor), lam)
