"""pFedMe (Dinh et al., NeurIPS 2020): the bilevel update, K steps on the Moreau-envelope inner
problem, the local model's step toward theta and the server's beta step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from fedpers.algorithms.ditto import personal_objective
from fedpers.core.training import sgd
from fedpers.core.schema import Key, positive, at_least_one


# pFedMe's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("pfedme_lambda", float, 15.0, "pFedMe regularisation lambda of the Moreau envelope (paper: 15)", positive),
    Key("pfedme_k", int, 5, "pFedMe inner steps K on the personalized problem per mini-batch (paper: 5)",
        at_least_one),
    Key("pfedme_personal_lr", float, 0.09,
        "pFedMe personal learning rate of the K inner steps (paper, MNIST non-convex: 0.09)", positive),
    Key("pfedme_beta", float, 1.0, "pFedMe server step beta: w <- (1-beta) w + beta avg(w_i) (paper: 1)", positive),
)


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
