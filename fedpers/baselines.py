"""Math of the personalized baselines Ditto, pFedMe, FedRep, FedBABU and FedALA, as small functions of
tensors and arrays (no Flower). The clients in ``clients/`` and strategies in ``strategies/`` only wire
these to the federation.

* Ditto (Li et al., ICML 2021) and pFedMe (Dinh et al., NeurIPS 2020) both couple a personal model to
  the global one by ``lambda/2 ||theta - w||^2``: :func:`personal_objective`. pFedMe's bilevel update is
  :func:`pfedme_inner_solve` (K steps on the inner problem), :func:`pfedme_local_update` (the local model's
  step toward theta) and :func:`beta_mix` (the server's step).
* FedBABU (Oh et al., ICLR 2022) fine-tunes a copy of the whole model at evaluation: :func:`fine_tune_copy`.
* FedALA (Zhang et al., AAAI 2023): :func:`ala_combine`, :func:`ala_weight_update` and
  :func:`learn_ala_weights` (the ALA module, Alg. 1 lines 6-16).
* FedRep (Collins et al., ICML 2021) needs nothing beyond the foundation's loops (head epochs on the
  frozen body's features, then body epochs with the head frozen); see ``clients/fedrep.py``.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpers.losses import proximal_term
from fedpers.training import EVAL_BATCH, sgd, train_epochs


# --- Ditto and pFedMe: proximal coupling ---------------------------------------------------------------
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


def pfedme_inner_solve(theta: nn.Module, x: torch.Tensor, y: torch.Tensor, anchor: Sequence[torch.Tensor], *,
                       lam: float, lr: float, steps: int) -> list[float]:
    """pFedMe Alg. 1 (inner loop, the personalized problem solved approximately): ``steps`` = K steps
    ``theta <- theta - lr (grad f_i(theta; D) + lambda (theta - w))`` on the same mini-batch D, i.e. plain
    SGD on :func:`personal_objective`; ``theta`` (a model, updated in place) warm-starts from its current
    value. Returns the objective before each step."""
    params = list(theta.parameters())
    opt = sgd(params, lr)  # plain SGD: stateless, so a fresh optimizer per call changes nothing
    theta.train()
    values = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        obj = personal_objective(theta(x), y, params, anchor, lam)
        obj.backward()
        opt.step()
        values.append(float(obj.detach()))
    return values


@torch.no_grad()
def pfedme_local_update(local: Sequence[torch.Tensor], theta: Sequence[torch.Tensor], *, lr: float,
                        lam: float) -> None:
    """pFedMe Alg. 1 (local update): ``w_{i,r+1} = w_{i,r} - eta lambda (w_{i,r} - theta_i(w_{i,r}))``,
    i.e. a gradient step on the Moreau envelope F_i, whose gradient is ``lambda (w - theta_i(w))``;
    ``local`` is updated in place."""
    for w, t in zip(local, theta, strict=True):
        w.sub_(lr * lam * (w - t.detach()))


def beta_mix(previous: Sequence[np.ndarray], average: Sequence[np.ndarray], beta: float) -> list[np.ndarray]:
    """pFedMe Alg. 1 (server update): ``w^{t+1} = (1 - beta) w^t + beta * avg_{i in S^t} w_{i,R}^t``
    (beta = 1 is FedAvg's average), computed in float64, returned in the inputs' dtype."""
    out = []
    for old, avg in zip(previous, average, strict=True):
        old = np.asarray(old)
        mixed = (1.0 - beta) * old.astype(np.float64) + beta * np.asarray(avg, dtype=np.float64)
        out.append(mixed.astype(old.dtype))
    return out


# --- FedBABU: fine-tuning at evaluation --------------------------------------------------------------
def fine_tune_copy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float,
                   batch_size: int, generator: torch.Generator, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> nn.Module:
    """FedBABU (Oh et al., ICLR 2022, Sec. 4 "personalization"): a deep copy of ``model`` whose whole
    network (body and head) is fine-tuned by ``epochs`` epochs of cross-entropy SGD on the client's train
    data; ``model`` itself is not changed."""
    tuned = copy.deepcopy(model)
    for p in tuned.parameters():
        p.requires_grad_(True)
    if epochs > 0 and len(x) > 0:
        opt = sgd(tuned.parameters(), lr, momentum, weight_decay)
        train_epochs(tuned, x, y, epochs=epochs, batch_size=batch_size, optimizer=opt,
                     batch_loss=lambda xb, yb: F.cross_entropy(tuned(xb), yb), generator=generator)
    return tuned


# --- FedALA: adaptive local aggregation ----------------------------------------------------------------
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
