"""MOON (Li et al., CVPR 2021): the model-contrastive loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedpers.core.schema import Key, positive, non_negative


# MOON's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("moon_mu", float, 1.0, "MOON weight mu of the model-contrastive loss (paper: 1 or 5)", non_negative),
    Key("moon_tau", float, 0.5, "MOON temperature tau (paper: 0.5)", positive),
)


def moon_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """MOON Eq. (2): ``l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )``
    with cosine similarity; z_glob from the received global model, z_prev from the client's previous
    local model (both detached). Averaged over the batch."""
    pos = F.cosine_similarity(z, z_global.detach(), dim=1) / tau
    neg = F.cosine_similarity(z, z_prev.detach(), dim=1) / tau
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))
