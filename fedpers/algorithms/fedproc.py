"""FedProc (Mu et al., FGCS 2023): the prototype-contrastive loss and its weight schedule; the
prototypes themselves are :mod:`fedpers.algorithms.prototypes`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.algorithms.prototypes import aggregate_prototypes
from fedpers.core.schema import Key, positive
from fedpers.core.wire import MODEL_SECTION, Contract


# What travels, by named section (fedpers.core.wire.Contract), declared once for the strategy and the client:
# broadcast = the model, the global prototypes (C x F) and which classes have one (C,); upload = the model, the
# client's class prototypes (C x F) and class counts (C,).
CONTRACT = Contract(broadcast=(MODEL_SECTION, "global_prototypes", "prototype_mask"),
                    upload=(MODEL_SECTION, "class_prototypes", "class_counts"))

# FedProc's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedproc_tau", float, 0.5, "FedProc prototype-contrastive temperature (ours)", positive),
)


def prototype_contrastive_loss(features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor,
                               tau: float, available: torch.Tensor | None = None) -> torch.Tensor:
    """FedProc's global prototypical contrastive loss: for a sample with feature z and class y,
    ``-log( exp(cos(z, c_y)/tau) / sum_k exp(cos(z, c_k)/tau) )`` over the global prototypes c_k
    (classes without a prototype yet are left out; samples of such classes contribute 0)."""
    z = F.normalize(features, dim=1)
    c = F.normalize(prototypes.detach(), dim=1)
    logits = z @ c.T / tau
    if available is not None:
        logits = logits.masked_fill(~available[None, :], float("-inf"))
        keep = available[y]
        if not bool(keep.any()):
            return features.new_zeros(())
        return F.cross_entropy(logits[keep], y[keep]) * keep.float().mean()
    return F.cross_entropy(logits, y)


def fedproc_weight(server_round: int, rounds: int) -> float:
    """FedProc's hybrid local loss ``alpha_t L_pc + (1 - alpha_t) L_ce`` with the weight of the
    prototype term decaying over rounds, ``alpha_t = 1 - t/T`` (features first, then the classifier).
    Recalled from the FedProc paper (not in the JDFL paper); see the client docstring."""
    return float(min(1.0, max(0.0, 1.0 - server_round / max(rounds, 1))))


def fedproc_global_prototypes(local: Sequence[tuple[np.ndarray, np.ndarray]],
                              previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FedProc's global prototypes after a round: the count-weighted mean of the uploaded class prototypes
    (:func:`~fedpers.algorithms.prototypes.aggregate_prototypes`); a class no client reported this round
    keeps its ``previous`` prototype. Returns (prototypes, mask of the classes reported this round)."""
    this_round, seen = aggregate_prototypes(local)
    return np.where(seen[:, None] > 0, this_round, previous).astype(np.float32), seen
