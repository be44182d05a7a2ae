"""FedALA (Zhang et al., AAAI 2023): the ALA module (Alg. 1 lines 6-16), element-wise learned
aggregation weights of the top layers.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpers.core.training import EVAL_BATCH
from fedpers.core.schema import Key, positive, at_least_one


# FedALA's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedala_eta", float, 1.0, "FedALA learning rate eta of the ALA weights W (paper: 1.0)", positive),
    Key("fedala_rand_percent", int, 80, "FedALA share s (%) of local train data used to learn W (paper: 80)",
        lambda v: None if 1 <= v <= 100 else "must be in 1..100"),
    Key("fedala_layer_idx", int, 2,
        "FedALA top parameter tensors aggregated with W, as FedALA's code counts them (paper: 2 = the head)",
        at_least_one),
    Key("fedala_threshold", float, 0.01,
        "FedALA start phase: learn W until the std of the last fedala_num_pre_loss losses is below this "
        "(paper: 0.01; the authors' ALA module defaults to 0.1)", positive),
    Key("fedala_num_pre_loss", int, 10, "FedALA start phase: losses in the convergence test (paper code: 10)",
        at_least_one),
    Key("fedala_max_start_epochs", int, 100, "FedALA start phase: at most this many epochs (ours; FedALA: no cap)",
        at_least_one),
)


def ala_combine(local: Sequence[torch.Tensor], global_: Sequence[torch.Tensor],
                weights: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """FedALA (Zhang et al., AAAI 2023) adaptive local aggregation of the top layers:
    ``theta_hat = theta_local + (theta_global - theta_local) * W`` (element-wise; W = 1 takes the global
    value, W = 0 keeps the local one). The lower layers take the global values (W = 1 there)."""
    return [l + (g - l) * w for l, g, w in zip(local, global_, weights, strict=True)]


def ala_weight_update(weights: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                      local: Sequence[torch.Tensor], global_: Sequence[torch.Tensor],
                      eta: float) -> list[torch.Tensor]:
    """FedALA weight learning step: ``W <- clip_[0,1](W - eta * grad_theta_hat L * (theta_global -
    theta_local))`` (the chain rule through :func:`ala_combine`), so W always stays in [0, 1]."""
    return [torch.clamp(w - eta * gr * (g - l), 0.0, 1.0)
            for w, gr, l, g in zip(weights, grads, local, global_, strict=True)]


def top_parameter_names(model: nn.Module, count: int) -> list[str]:
    """Names of the last ``count`` parameter tensors of ``model`` (FedALA's ``params[-layer_idx:]``)."""
    names = [n for n, _ in model.named_parameters()]
    if not 1 <= count <= len(names):
        raise ValueError(f"fedala_layer_idx={count} must be between 1 and the model's {len(names)} parameter tensors")
    return names[-count:]


def learn_ala_weights(model: nn.Module, top_names: Sequence[str], local_top: Sequence[torch.Tensor],
                      global_top: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], x: torch.Tensor,
                      y: torch.Tensor, *, batch_size: int, eta: float, start_phase: bool, threshold: float,
                      num_pre_loss: int, max_epochs: int) -> tuple[list[torch.Tensor], int, float]:
    """FedALA's ALA module (Alg. 1 lines 6-16) on the sampled local data ``(x, y)``: on a temporary copy
    of ``model`` (which holds the global model), only the top tensors ``top_names`` are set to
    :func:`ala_combine` (``local_top``, ``global_top``, W) and W is learned by :func:`ala_weight_update`
    on the cross-entropy, one pass over the data in a fixed order per epoch (as FedALA's loader).

    In the start phase (the client's first ALA) W is trained until the standard deviation of the last
    ``num_pre_loss`` epoch losses falls below ``threshold`` (FedALA), at most ``max_epochs`` epochs (ours);
    afterwards one epoch. The lower layers are frozen and run in eval mode (ours: dropout off); when only
    the head is learned, the frozen body's features are computed once. ``model`` is not changed.
    Returns (W, epochs run, last loss)."""
    temp = copy.deepcopy(model)
    temp.eval()
    for p in temp.parameters():
        p.requires_grad_(False)
    named = dict(temp.named_parameters())
    top = [named[n] for n in top_names]
    for p in top:
        p.requires_grad_(True)
    weights = [w.detach().clone() for w in weights]
    local_top = [t.detach() for t in local_top]
    global_top = [t.detach() for t in global_top]
    with torch.no_grad():
        for p, new in zip(top, ala_combine(local_top, global_top, weights)):
            p.copy_(new)

    head_only = all(n.split(".", 1)[0] == "head" for n in top_names) and hasattr(temp, "backbone")
    if head_only:  # the frozen body's features are constants: compute them once
        with torch.no_grad():
            inputs = torch.cat([temp.backbone(x[i:i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])
        forward = getattr(temp, "classify", temp.head)
    else:
        inputs, forward = x, temp

    losses: list[float] = []
    epochs, last = 0, float("nan")
    if len(x) == 0:
        return weights, 0, last
    while True:
        for start in range(0, len(inputs), batch_size):
            for p in top:
                p.grad = None
            loss = F.cross_entropy(forward(inputs[start:start + batch_size]), y[start:start + batch_size])
            loss.backward()
            with torch.no_grad():
                weights = ala_weight_update(weights, [p.grad for p in top], local_top, global_top, eta)
                for p, new in zip(top, ala_combine(local_top, global_top, weights)):
                    p.copy_(new)
            last = float(loss.detach())
        losses.append(last)
        epochs += 1
        if not start_phase or epochs >= max_epochs:
            break
        if len(losses) > num_pre_loss and float(np.std(losses[-num_pre_loss:])) < threshold:
            break
    return weights, epochs, last
