"""FedAS (Yang et al., CVPR 2024): parameter alignment and the Fisher-information weights of client
synchronization. Where the paper leaves a detail open we follow the authors' public code.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpers.algorithms.prototypes import class_prototypes
from fedpers.core.training import EVAL_BATCH, minibatches, sgd
from fedpers.core.schema import Key, positive, non_negative, at_least_one
from fedpers.core.wire import MODEL_SECTION, Contract


# What travels, by named section (fedpers.core.wire.Contract), declared once for the strategy and the client:
# broadcast = the feature extractor; upload = the trained feature extractor and the trace of its Fisher
# information (one (1,) array).
CONTRACT = Contract(download_part="backbone", upload_part="backbone", upload=(MODEL_SECTION, "fisher_trace"))

# FedAS's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedas_align_lr", float, 0.01, "FedAS parameter-alignment SGD learning rate (paper code: 0.01)", positive),
    Key("fedas_align_epochs", int, 1, "FedAS parameter-alignment epochs (paper code: 1; 0 = no alignment)",
        non_negative),
    Key("fedas_align_batch", int, 16, "FedAS parameter-alignment batch size (paper code: 16)", at_least_one),
)


def fedas_alignment_loss(features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor,
                         available: torch.Tensor) -> torch.Tensor:
    """FedAS parameter-alignment loss on one mini-batch (authors' code, ``clientAS.set_parameters``):
    ``sum_{c in batch, c has a prototype} MSE(f_global(x)[y == c], p_c)`` with p_c the class-c prototype
    of the client's *previous local* model; only the received shared parameters get gradients."""
    loss = features.new_zeros(())
    for c in torch.unique(y).tolist():
        if bool(available[c]):
            sel = features[y == c]
            loss = loss + F.mse_loss(sel, prototypes[c].detach().expand_as(sel))
    return loss


def align_backbone(model: nn.Module, previous: nn.Module, x: torch.Tensor, y: torch.Tensor, *, num_classes: int,
                   lr: float, epochs: int, batch_size: int, generator: torch.Generator,
                   drop_last: bool) -> list[float]:
    """FedAS federated parameter alignment: before local training, the received shared
    parameters (``model.backbone``) are fine-tuned on the local data so that their features match the
    class prototypes of the client's previous local model ``previous`` (computed once, eval mode, no
    gradient): ``epochs`` epochs of SGD (lr ``lr``, batches of ``batch_size``) on
    :func:`fedas_alignment_loss`. Only ``model.backbone`` changes; ``previous`` is untouched. Returns
    the mean loss of each epoch."""
    previous.eval()
    with torch.no_grad():
        feats = torch.cat([previous.backbone(x[i:i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])
    protos, counts = class_prototypes(feats, y, num_classes)
    prototypes = torch.as_tensor(protos, device=x.device)
    available = torch.as_tensor(counts > 0, device=x.device)
    params = list(model.backbone.parameters())
    opt = sgd(params, lr)
    model.train()
    history = []
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in minibatches(len(x), batch_size, generator, x.device, drop_last=drop_last):
            opt.zero_grad(set_to_none=True)
            loss = fedas_alignment_loss(model.backbone(x[idx]), y[idx], prototypes, available)
            if loss.requires_grad:
                loss.backward()
                opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        history.append(total / max(count, 1))
    return history


def fisher_trace(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """FedAS client synchronization: the trace of the empirical Fisher information of the trained local
    model on its data, as the authors' code computes it: ``sum_batches sum_params ||grad_theta
    mean_b(-log p_theta(y|x))||^2`` (eval mode, batches of ``batch_size`` in data order). A parameter the
    forward pass does not reach (the SE-CNN's residual branch while its gate is shut) has a zero gradient
    and adds nothing."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    total = 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        nll = F.cross_entropy(model(xb), yb)
        grads = torch.autograd.grad(nll, params, allow_unused=True)
        total += float(sum(g.pow(2).sum() for g in grads if g is not None))
    return total


def fisher_weights(traces: Sequence[float], fallback: Sequence[float]) -> np.ndarray:
    """FedAS aggregation weights (server ``aggregate_wrt_fisher``): ``w_k = FIM_k / sum_j FIM_j`` over the
    uploading clients; negative or non-finite traces count as 0, and when no trace is positive the weights
    are the ``fallback`` (sample counts), normalised (ours)."""
    t = np.asarray([v if math.isfinite(v) and v > 0 else 0.0 for v in traces], dtype=np.float64)
    if t.sum() <= 0:
        t = np.asarray(fallback, dtype=np.float64)
    return t / t.sum()
