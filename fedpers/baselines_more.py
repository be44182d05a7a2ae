"""Math of the personalized baselines FedProto, pFedSim, FedAS and FedFed, as small functions of tensors
and arrays (no Flower). ``clients/`` and ``strategies/`` only wire these to the federation.

* FedProto (Tan et al., AAAI 2022): class prototypes :func:`class_prototypes`, their count-weighted
  server average :func:`aggregate_prototypes`, the local loss :func:`fedproto_loss` (Eq. 8) and
  nearest-prototype inference :func:`nearest_prototype`.
* pFedSim (Tan et al., arXiv:2305.15706): classifier similarity :func:`classifier_similarity` and the
  aggregation weights :func:`pfedsim_weights` of a client's personalized feature extractor.
* FedAS (Yang et al., CVPR 2024): parameter alignment :func:`align_backbone` (loss
  :func:`fedas_alignment_loss`) and the Fisher-information weights of client synchronization
  (:func:`fisher_trace`, :func:`fisher_weights`).
* FedFed (Yang et al., NeurIPS 2023): the feature-distillation module :class:`FeatureDistiller`, its
  training objective :func:`fedfed_distill_loss` and the noisy performance-sensitive features
  :func:`sensitive_features`.

Where a paper leaves a detail open we follow the authors' public code (named in each docstring); what
is ours is marked "ours".
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpers.training import EVAL_BATCH, minibatches, sgd


# --- FedProto ------------------------------------------------------------------------------------------
def class_prototypes(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """FedProto local prototypes (Eq. 4; our equation numbers other than Eq. 8 are from memory):
    ``C_i^(j) = 1/|D_i,j| sum_{(x,y) in D_i,j} f_i(x)``, the mean backbone feature of every class j on
    client i's data (zeros for classes it does not hold), and the class counts ``|D_i,j|`` (float32, as
    every uploaded array)."""
    feats = features.detach().double()
    sums = torch.zeros(num_classes, feats.shape[1], dtype=torch.float64, device=feats.device)
    sums.index_add_(0, y, feats)
    counts = torch.bincount(y, minlength=num_classes).double()
    protos = sums / counts.clamp_min(1.0)[:, None]
    return protos.float().cpu().numpy(), counts.float().cpu().numpy()


def aggregate_prototypes(local: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """FedProto global prototypes (Eq. 6): ``C_bar^(j) = sum_{i in N_j} |D_i,j| C_i^(j) / sum_{i in N_j}
    |D_i,j|``, the count-weighted mean over the clients N_j that hold class j, computed in float64.

    Returns (prototypes C x d, availability mask C: 1 where some client reported the class this round).
    As FedProto's code, the global prototypes are rebuilt from each round's uploads only; a class that no
    uploading client holds has no global prototype that round (mask 0, zeros)."""
    if not local:
        raise ValueError("no prototypes to aggregate")
    num = np.zeros(np.shape(local[0][0]), dtype=np.float64)
    den = np.zeros(len(num), dtype=np.float64)
    for protos, counts in local:
        counts = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
        num += np.asarray(protos, dtype=np.float64) * counts[:, None]
        den += counts
    seen = den > 0
    out = np.zeros_like(num)
    out[seen] = num[seen] / den[seen, None]
    return out.astype(np.float32), seen.astype(np.float32)


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


# --- pFedSim ------------------------------------------------------------------------------------------
def classifier_similarity(w_i: np.ndarray, w_j: np.ndarray) -> float:
    """pFedSim client similarity: the cosine similarity of two clients' classifier weights, row by row
    (one row per class), averaged over classes and floored at 0:
    ``s_ij = max(0, 1/C sum_c cos(W_i[c], W_j[c]))`` (as the authors' code in FL-bench)."""
    a = np.asarray(w_i, dtype=np.float64).reshape(len(w_i), -1)
    b = np.asarray(w_j, dtype=np.float64).reshape(len(w_j), -1)
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    cos = np.sum(a * b, axis=1) / np.maximum(na * nb, 1e-12)
    return float(max(0.0, cos.mean()))


def pfedsim_weights(similarity_row: np.ndarray, self_index: int, self_similarity: float = 0.9999) -> np.ndarray:
    """pFedSim aggregation weights of client k's personalized feature extractor from row k of the
    similarity matrix (identity at start, entries s_kj in [0, 1]).

    As the authors' code (FL-bench ``pFedSimServer.generate_client_params``): when client k has no
    positive similarity to anybody yet (row sum <= 1), it keeps its own extractor (one-hot weights);
    otherwise ``s_kk <- 0.9999``, ``w_kj = -log(1 - s_kj)``, normalised to sum 1. ``-log(1 - s)`` grows
    without bound as s -> 1, so the most similar clients dominate and dissimilar ones (s = 0) get 0."""
    row = np.clip(np.asarray(similarity_row, dtype=np.float64), 0.0, 1.0)
    out = np.zeros_like(row)
    if row.sum() <= 1.0:
        out[self_index] = 1.0
        return out
    row = row.copy()
    row[self_index] = self_similarity
    w = -np.log(np.clip(1.0 - row, 1e-12, None))
    return w / w.sum()


# --- FedAS --------------------------------------------------------------------------------------------
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
                   lr: float, epochs: int, batch_size: int, generator: torch.Generator) -> list[float]:
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
        for idx in minibatches(len(x), batch_size, generator, x.device):
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
    mean_b(-log p_theta(y|x))||^2`` (eval mode, batches of ``batch_size`` in data order)."""
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    total = 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        nll = F.cross_entropy(model(xb), yb)
        grads = torch.autograd.grad(nll, params)
        total += float(sum(g.pow(2).sum() for g in grads))
    return total


def fisher_weights(traces: Sequence[float], fallback: Sequence[float]) -> np.ndarray:
    """FedAS aggregation weights (server ``aggregate_wrt_fisher``): ``w_k = FIM_k / sum_j FIM_j`` over the
    uploading clients; negative or non-finite traces count as 0, and when no trace is positive the weights
    are the ``fallback`` (sample counts), normalised (ours)."""
    t = np.asarray([v if math.isfinite(v) and v > 0 else 0.0 for v in traces], dtype=np.float64)
    if t.sum() <= 0:
        t = np.asarray(fallback, dtype=np.float64)
    return t / t.sum()


# --- FedFed -------------------------------------------------------------------------------------------
class FeatureDistiller(nn.Module):
    """FedFed's feature-distillation module: a small convolutional VAE whose reconstruction is the
    performance-robust part ``x_r = G(x)`` of an input; the performance-sensitive part is ``x_s = x - x_r``.

    Sizes are ours (FedFed uses a ResNet-style VAE): encoder conv 3x3 (``width`` channels) + ReLU + conv
    3x3 stride 2 to ``2 * latent`` channels (mean and log-variance of a spatial latent at half resolution);
    decoder transposed conv 4x4 stride 2 + ReLU + conv 3x3 back to the input channels, resized to the input
    size when it is odd."""

    def __init__(self, in_channels: int, width: int = 32, latent: int = 4):
        super().__init__()
        self.latent = latent
        self.encoder = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, 2 * latent, 3, stride=2, padding=1))
        self.decoder = nn.Sequential(nn.ConvTranspose2d(latent, width, 4, stride=2, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, in_channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_r, mu, logvar); z is sampled in training mode and is mu in eval mode."""
        mu, logvar = self.encoder(x).chunk(2, dim=1)
        logvar = logvar.clamp(-10.0, 10.0)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        robust = self.decoder(z)
        if robust.shape[-2:] != x.shape[-2:]:
            robust = F.interpolate(robust, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return robust, mu, logvar


def add_gaussian_noise(x: torch.Tensor, std: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x + N(0, std^2)`` element-wise (FedFed's privacy noise on shared features, mean 0)."""
    if std == 0:
        return x.clone()
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)
    return x + std * noise


def fedfed_distill_loss(model: nn.Module, distiller: FeatureDistiller, x: torch.Tensor, y: torch.Tensor, *,
                        noise_stds: Sequence[float], w_rec: float, w_kl: float, w_ce: float,
                        w_x_ce: float) -> torch.Tensor:
    """FedFed feature-distillation objective on one mini-batch (in the form of the authors' code as
    ported to FL-bench):

    ``w_rec ||G(x) - x||^2 + w_kl KL(q(z|x) || N(0, I)) + w_ce mean_s CE(f(x_s + n_s), y) + w_x_ce CE(f(x), y)``

    with ``x_s = x - G(x)`` and ``n_s ~ N(0, sigma_s^2)`` for each sigma_s in ``noise_stds``. Minimising it
    makes the robust part x_r = G(x) a low-capacity reconstruction of x (information bottleneck) while the
    noisy sensitive part x_s keeps what the classifier needs; both the distiller G and the classifier f
    get gradients. The KL term is averaged over samples and latent entries (ours; FL-bench divides the
    sum by batch x 3 x latent size)."""
    robust, mu, logvar = distiller(x)
    sensitive = x - robust
    noisy = torch.cat([add_gaussian_noise(sensitive, s) for s in noise_stds]) if noise_stds else sensitive
    reps = max(len(noise_stds), 1)
    logits = model(torch.cat([noisy, x]))
    n = len(x)
    ce_sensitive = F.cross_entropy(logits[:n * reps], y.repeat(reps))
    ce_x = F.cross_entropy(logits[n * reps:], y)
    rec = F.mse_loss(robust, x)
    kl = -0.5 * torch.mean(1 + logvar - mu.pow(2) - logvar.exp())
    return w_rec * rec + w_kl * kl + w_ce * ce_sensitive + w_x_ce * ce_x


@torch.no_grad()
def sensitive_features(distiller: FeatureDistiller, x: torch.Tensor, noise_std: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """FedFed's shared data: the performance-sensitive features ``x_s = x - G(x)`` of a
    client's inputs (distiller in eval mode: z = mu) protected by Gaussian noise ``x_s + N(0, sigma^2)``."""
    distiller.eval()
    out = []
    for i in range(0, len(x), EVAL_BATCH):
        xb = x[i:i + EVAL_BATCH]
        robust, _, _ = distiller(xb)
        out.append(xb - robust)
    sens = torch.cat(out) if out else x.clone()
    return add_gaussian_noise(sens, noise_std, generator)
