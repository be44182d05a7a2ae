"""FedProto (Tan et al., AAAI 2022): the local loss (Eq. 8) and nearest-prototype inference; the
prototypes themselves are :mod:`fedpers.algorithms.prototypes`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedpers.core.schema import Key, non_negative, one_of
from fedpers.core.wire import Contract


# What travels, by named section (fedpers.core.wire.Contract), declared once for the strategy and the client:
# broadcast = the global prototypes (C x d) and which classes have one (C,); no model; upload = the client's class
# prototypes (C x d) and class counts (C,).
CONTRACT = Contract(broadcast=("global_prototypes", "prototype_mask"), upload=("class_prototypes", "class_counts"))

# FedProto's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedproto_lambda", float, 1.0,
        "FedProto weight lambda of the prototype term of Eq. 8 (paper code: ld = 1)", non_negative),
    Key("fedproto_infer", str, "global",
        "FedProto inference: nearest global prototype (paper code) | nearest local prototype | head "
        "(the classifier); the other two are reported as extra metrics", one_of("global", "local", "head")),
)


def fedproto_loss(logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor,
                  available: torch.Tensor, lam: float) -> torch.Tensor:
    """FedProto local objective (Eq. 8) on one mini-batch:
    ``L_S(F(x), y) + lambda * || f(x) - C_bar^(y) ||^2``, the cross-entropy plus the distance of each
    sample's feature to the global prototype of its class. As in FedProto's code the squared distance is
    ``nn.MSELoss`` (mean over samples and feature entries). Samples of classes without a global prototype
    (mask 0, e.g. round 1) add no regulariser term."""
    ce = F.cross_entropy(logits, y)
    if lam == 0:
        return ce
    keep = available[y]
    if not bool(keep.any()):
        return ce
    return ce + lam * F.mse_loss(features[keep], prototypes[y[keep]].detach())


def prototype_distances(features: torch.Tensor, prototypes: torch.Tensor, available: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distance of every feature to every prototype (N x C); +inf for classes without
    a prototype."""
    d = torch.cdist(features.double(), prototypes.double()).pow(2)
    return d.masked_fill(~available[None, :], float("inf"))


def nearest_prototype(features: torch.Tensor, prototypes: torch.Tensor, available: torch.Tensor) -> torch.Tensor:
    """FedProto inference (prototype-based, as the paper and its code): the predicted class of a sample
    is the class of the prototype nearest (squared L2) to its feature, among the classes that have one."""
    return prototype_distances(features, prototypes, available).argmin(dim=1)
