"""Math of the global federated optimizers that JDFL is evaluated on (SCAFFOLD, FedDyn, FedDC, FedProc)
and of MOON, as small pure functions of tensors / numpy arrays. Each cites its paper's equation.

Server-side state (SCAFFOLD's c, FedDyn's h, FedDC's g, FedProc's prototypes) is a list of numpy arrays
in the order of :func:`fedpers.models.parameter_names` (``all``) unless noted.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

Arrays = list[np.ndarray]


def _f64(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _like(out: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> Arrays:
    return [np.asarray(o).astype(np.asarray(r).dtype) for o, r in zip(out, ref, strict=True)]


def zeros_like(arrays: Sequence[np.ndarray]) -> Arrays:
    """Zero state shaped like ``arrays`` (float32)."""
    return [np.zeros(np.shape(a), dtype=np.float32) for a in arrays]


def linear_term(params: Sequence[torch.Tensor], direction: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_l <theta_l, v_l>`` with ``v`` detached: a loss term whose gradient is exactly ``v``. Adding it
    to the loss applies a gradient correction through any optimizer (SCAFFOLD's ``c - c_i``, FedDyn's
    ``-grad L_i(theta_i^{t-1})``, FedDC's ``g - g_i``)."""
    total = params[0].new_zeros(())
    for p, v in zip(params, direction, strict=True):
        total = total + (p * v.detach()).sum()
    return total


def local_steps(num_samples: int, batch_size: int, epochs: int) -> int:
    """K: mini-batch SGD steps of one local training (``epochs * ceil(n / B)``)."""
    return max(1, epochs * math.ceil(num_samples / batch_size))


# --- SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1) ----------------------------------------------


def scaffold_correction(c: Sequence[np.ndarray], c_i: Sequence[np.ndarray]) -> Arrays:
    """Alg. 1 line 10: local steps use ``g_i(y) - c_i + c``; the correction added to the gradient is
    ``c - c_i``."""
    return [np.asarray(a) - np.asarray(b) for a, b in zip(c, c_i, strict=True)]


def scaffold_client_control(c_i: Sequence[np.ndarray], c: Sequence[np.ndarray], x: Sequence[np.ndarray],
                            y: Sequence[np.ndarray], steps: int, lr: float) -> Arrays:
    """Alg. 1 line 12, option II: ``c_i+ = c_i - c + (x - y_i) / (K eta_l)``."""
    return _like([ci - cc + (xx - yy) / (steps * lr)
                  for ci, cc, xx, yy in zip(_f64(c_i), _f64(c), _f64(x), _f64(y), strict=True)], c_i)


def scaffold_server_update(x: Sequence[np.ndarray], c: Sequence[np.ndarray], mean_y: Sequence[np.ndarray],
                           mean_delta_c: Sequence[np.ndarray], num_sampled: int, num_clients: int,
                           server_lr: float = 1.0) -> tuple[Arrays, Arrays]:
    """Alg. 1 lines 16-17: ``x <- x + eta_g mean(y_i - x)`` and ``c <- c + |S|/N mean(Delta c_i)``.
    ``mean_y`` is the average of the uploaded models (so ``mean(Delta y) = mean_y - x``)."""
    new_x = [xx + server_lr * (my - xx) for xx, my in zip(_f64(x), _f64(mean_y), strict=True)]
    new_c = [cc + (num_sampled / num_clients) * dc for cc, dc in zip(_f64(c), _f64(mean_delta_c), strict=True)]
    return _like(new_x, x), _like(new_c, c)


# --- FedDyn (Acar et al., ICLR 2021, Algorithm 1) --------------------------------------------------------


def feddyn_regularizer(params: Sequence[torch.Tensor], grad_state: Sequence[torch.Tensor],
                       global_params: Sequence[torch.Tensor], alpha: float) -> torch.Tensor:
    """Alg. 1 line 5: the dynamic regulariser of client i,
    ``- <grad L_i(theta_i^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2`` (added to L_i(theta))."""
    total = -linear_term(params, grad_state)
    for p, g in zip(params, global_params, strict=True):
        total = total + 0.5 * alpha * (p - g.detach()).pow(2).sum()
    return total


def feddyn_client_state(grad_state: Sequence[np.ndarray], theta_i: Sequence[np.ndarray],
                        theta_global: Sequence[np.ndarray], alpha: float) -> Arrays:
    """Alg. 1 line 6: ``grad L_i(theta_i^t) = grad L_i(theta_i^{t-1}) - alpha (theta_i^t - theta^{t-1})``."""
    return _like([g - alpha * (t - tg) for g, t, tg in
                  zip(_f64(grad_state), _f64(theta_i), _f64(theta_global), strict=True)], grad_state)


def feddyn_server_update(h: Sequence[np.ndarray], theta_prev: Sequence[np.ndarray],
                         mean_theta: Sequence[np.ndarray], num_sampled: int, num_clients: int,
                         alpha: float) -> tuple[Arrays, Arrays]:
    """Alg. 1 lines 9-10: ``h^t = h^{t-1} - alpha (1/m) sum_{i in P_t} (theta_i^t - theta^{t-1})`` (m = N
    clients; the sum is ``|P_t| (mean_theta - theta^{t-1})``) and
    ``theta^t = mean_{P_t}(theta_i^t) - h^t / alpha``. Returns (theta^t, h^t)."""
    new_h = [hh - alpha * (num_sampled / num_clients) * (mt - tp)
             for hh, mt, tp in zip(_f64(h), _f64(mean_theta), _f64(theta_prev), strict=True)]
    new_theta = [mt - hh / alpha for mt, hh in zip(_f64(mean_theta), new_h, strict=True)]
    return _like(new_theta, theta_prev), _like(new_h, h)


# --- FedDC (Gao et al., CVPR 2022, Algorithm 1; local drift decoupling and correction) --------------------


def feddc_penalty(params: Sequence[torch.Tensor], drift: Sequence[torch.Tensor], global_params: Sequence[torch.Tensor],
                  alpha: float) -> torch.Tensor:
    """The drift penalty of FedDC's local objective (Eq. 7's R term): ``alpha/2 ||theta_i + h_i - w||^2``."""
    total = params[0].new_zeros(())
    for p, h, w in zip(params, drift, global_params, strict=True):
        total = total + (p + h.detach() - w.detach()).pow(2).sum()
    return 0.5 * alpha * total


def feddc_correction(g_i: Sequence[np.ndarray], g: Sequence[np.ndarray]) -> Arrays:
    """The gradient correction of FedDC's local objective (Eq. 7's G term, ``<theta_i, g - g_i>`` up to the
    1/(eta K) scaling that the update-rate states below already carry, as in the authors' code):
    the gradient direction added is ``g - g_i``."""
    return [np.asarray(a) - np.asarray(b) for a, b in zip(g, g_i, strict=True)]


def feddc_update_drift(drift: Sequence[np.ndarray], theta_i: Sequence[np.ndarray], w: Sequence[np.ndarray]) -> Arrays:
    """Local drift update (Alg. 1): ``h_i <- h_i + (theta_i - w)``."""
    return _like([h + t - ww for h, t, ww in zip(_f64(drift), _f64(theta_i), _f64(w), strict=True)], drift)


def feddc_client_gradient_state(g_i: Sequence[np.ndarray], g: Sequence[np.ndarray], w: Sequence[np.ndarray],
                                theta_i: Sequence[np.ndarray], steps: int, lr: float) -> Arrays:
    """Local update-rate state (as SCAFFOLD's option II, FedDC code): ``g_i+ = g_i - g + (w - theta_i)/(K eta)``."""
    return scaffold_client_control(g_i, g, w, theta_i, steps, lr)


def feddc_corrected_model(theta_i: Sequence[np.ndarray], drift: Sequence[np.ndarray]) -> Arrays:
    """What a FedDC client uploads for aggregation: the drift-corrected parameters ``theta_i + h_i``
    (the server's ``w = 1/|S| sum_i (theta_i + h_i)``)."""
    return _like([t + h for t, h in zip(_f64(theta_i), _f64(drift), strict=True)], theta_i)


def feddc_server_state(g: Sequence[np.ndarray], mean_delta_g: Sequence[np.ndarray], num_sampled: int,
                       num_clients: int) -> Arrays:
    """The server's average update-rate state over all N clients: ``g <- g + (1/N) sum_{i in S} Delta g_i``."""
    return _like([gg + (num_sampled / num_clients) * dg for gg, dg in zip(_f64(g), _f64(mean_delta_g), strict=True)], g)


# --- FedProc (Mu et al., FGCS 2023) ---------------------------------------------------------------------


@torch.no_grad()
def class_prototypes(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Local class prototypes: the mean feature of each class on the client's data (zeros for absent
    classes) and the class counts."""
    sums = torch.zeros(num_classes, features.shape[1], dtype=torch.float64, device=features.device)
    sums.index_add_(0, y, features.double())
    counts = torch.bincount(y, minlength=num_classes).double()
    protos = sums / counts.clamp_min(1)[:, None]
    return protos.float().cpu().numpy(), counts.float().cpu().numpy()


def aggregate_prototypes(local: Sequence[tuple[np.ndarray, np.ndarray]], previous: np.ndarray) -> np.ndarray:
    """Global prototype of class k: the count-weighted mean of the clients' class-k prototypes; a class
    no client reported this round keeps its previous prototype."""
    num = np.zeros_like(previous, dtype=np.float64)
    den = np.zeros(len(previous), dtype=np.float64)
    for protos, counts in local:
        num += np.asarray(protos, dtype=np.float64) * np.asarray(counts, dtype=np.float64)[:, None]
        den += counts
    out = np.asarray(previous, dtype=np.float64).copy()
    seen = den > 0
    out[seen] = num[seen] / den[seen, None]
    return out.astype(np.float32)


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


# --- MOON (Li et al., CVPR 2021) --------------------------------------------------------------------------


def moon_contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """MOON Eq. (2): ``l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )``
    with cosine similarity; z_glob from the received global model, z_prev from the client's previous
    local model (both detached). Averaged over the batch."""
    pos = F.cosine_similarity(z, z_global.detach(), dim=1) / tau
    neg = F.cosine_similarity(z, z_prev.detach(), dim=1) / tau
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))
