"""FedEAGD's math, as small pure functions (no Flower).

FedEAGD (per-sample drift-aware historical distillation with progressive gated residual fusion). We work
from a paper summary (``shared/papers/fedeagd-summary.txt``) that states the rules in words but gives no
equation numbers; each function quotes the rule it implements. Values the summary leaves out are config
keys whose defaults are ours (:data:`KEYS` below, and docs/methods.md).

* EMA teacher: ``theta_T <- beta theta_T + (1 - beta) theta_k`` (:func:`ema_update`).
* Per-sample drift: ``d_i = 1 - cos(z_i, t_i)`` with ``z_i`` the current shared representation and ``t_i``
  the EMA teacher's representation of the same sample (:func:`representation_drift`).
* Distillation coefficient: ``lambda_i = min(lambda_0 (1 + d_i), lambda_max)`` (:func:`distillation_coefficient`).
* Weighted historical distillation: ``1/B sum_i lambda_i l(z_i, t_i)`` (:func:`historical_distillation`).
* Fusion schedule: ``alpha_t = 0`` before the activation round, linear to 1 over the ramp, then 1
  (:func:`fusion_coefficient`); fused feature ``z + alpha_t r_k(z)``.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.core.schema import Key, non_negative, unit_interval, one_of


# FedEAGD's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedeagd_ema_decay", float, 0.9,
        "FedEAGD EMA-teacher decay beta per participation: T <- beta T + (1-beta) theta_k (ours)", unit_interval),
    Key("fedeagd_kd_base", float, 0.5, "FedEAGD base distillation coefficient lambda_0 (ours)", non_negative),
    Key("fedeagd_kd_max", float, 1.0,
        "FedEAGD upper bound of the coefficient min(lambda_0 (1 + d), bound) (ours)", non_negative),
    Key("fedeagd_kd_form", str, "mse",
        "FedEAGD per-sample historical distillation loss: cosine (1 - cos) | mse (ours: mse, chosen on "
        "validation accuracy on CIFAR-100 Practical)",
        one_of("cosine", "mse")),
    Key("fedeagd_fusion_start", int, 20, "FedEAGD round at which the residual gate starts to open (ours)",
        non_negative),
    Key("fedeagd_fusion_ramp", int, 20, "FedEAGD rounds over which the gate rises linearly to 1 (ours)",
        non_negative),
    Key("fedeagd_teacher", bool, True, "FedEAGD historical EMA teacher on (false = ablation: no teacher)"),
    Key("fedeagd_teacher_source", str, "trained",
        "FedEAGD extractor the EMA teacher averages in after each participation: trained (the one the client "
        "trained) | received (the shared extractor the server broadcast: the history of the shared "
        "representation) (ours: trained)", one_of("trained", "received")),
    Key("fedeagd_kd_weighting", str, "adaptive",
        "FedEAGD coefficient: adaptive (drift-based) | fixed (ablation, fedeagd_kd_fixed for every sample)",
        one_of("adaptive", "fixed")),
    Key("fedeagd_kd_fixed", float, 0.5, "FedEAGD coefficient of the fixed-weighting ablation (summary: 0.50)",
        non_negative),
    Key("fedeagd_fusion", str, "progressive",
        "FedEAGD residual fusion: progressive | always (ablation: on from round 0) | off (ablation)",
        one_of("progressive", "always", "off")),
    Key("fedeagd_residual_init", str, "zero",
        "FedEAGD residual's output layer at the start: zero (opening the gate does not perturb the "
        "features) | default (PyTorch's Linear init, seeded; the gate's ramp then eases it in) (ours: zero)",
        one_of("zero", "default")),
)

# The statistics of one round's training a FedEAGD client reports in its fit metrics, by name; the server
# reads exactly these (max_drift as a maximum over clients, the rest as sample-weighted means) and writes
# each into its round record as ``fedeagd_<name>``. They say whether the teacher and the per-sample
# weighting can change the training at the run's values: the mean drift and coefficient, the coefficient's
# spread over the client's samples (10th / 50th / 90th percentile, and the share of samples clipped at the
# bound), and the distillation term's share of the client's loss (:func:`mechanism_statistics`).
FIT_STATISTICS = ("mean_drift", "max_drift", "mean_kd_coef", "kd_coef_p10", "kd_coef_p50", "kd_coef_p90",
                  "kd_coef_at_bound", "kd_loss_share")
COEFFICIENT_QUANTILES = (0.1, 0.5, 0.9)

DistillForm = Literal["cosine", "mse"]
FusionMode = Literal["progressive", "always", "off"]
COS_EPS = 1e-8


def representation_drift(current: torch.Tensor, historical: torch.Tensor) -> torch.Tensor:
    """Per-sample drift ``d_i = 1 - cos(z_i, t_i)`` between the current shared representation ``z_i`` and
    the historical (EMA-teacher) representation ``t_i`` of the same sample; shape ``(B,)``, values in
    [0, 2] (0: same direction, 1: orthogonal). Summary: "for each sample, the cosine similarity between
    the current shared representation and the teacher representation gives the drift"."""
    z = current.flatten(1)
    t = historical.flatten(1)
    return 1.0 - F.cosine_similarity(z, t, dim=1, eps=COS_EPS)


def distillation_coefficient(drift: torch.Tensor, base: float, upper: float) -> torch.Tensor:
    """Per-sample coefficient ``lambda_i = min(base * (1 + d_i), upper)``. Summary: "the base coefficient
    times one plus drift, clipped at a preset upper bound, so stronger drift yields stronger but bounded
    supervision". The drift is detached: the coefficient is a weight, not a path for gradients (ours)."""
    return torch.clamp(base * (1.0 + drift.detach()), max=upper)


def per_sample_distillation(current: torch.Tensor, historical: torch.Tensor, form: DistillForm) -> torch.Tensor:
    """Per-sample historical distillation loss ``l(z_i, t_i)``, shape ``(B,)``; the teacher is detached.

    ``cosine``: ``1 - cos(z_i, t_i)`` (the drift itself, with gradient; scale-free).
    ``mse``: ``mean_j (z_ij - t_ij)^2`` (feature regression; ours by default, chosen on validation)."""
    z = current.flatten(1)
    t = historical.detach().flatten(1)
    if form == "cosine":
        return 1.0 - F.cosine_similarity(z, t, dim=1, eps=COS_EPS)
    if form == "mse":
        return (z - t).pow(2).mean(dim=1)
    raise ValueError(f"unknown distillation form {form!r}")


def historical_distillation(current: torch.Tensor, historical: torch.Tensor, coefficients: torch.Tensor,
                            form: DistillForm) -> torch.Tensor:
    """Batch mean of the coefficient-weighted per-sample distillation loss ``1/B sum_i lambda_i l(z_i, t_i)``
    (summary: "the historical distillation loss is weighted per sample by" the coefficient)."""
    return (coefficients.detach() * per_sample_distillation(current, historical, form)).mean()


def fedeagd_coefficients(current: torch.Tensor, historical: torch.Tensor, *, adaptive: bool, base: float,
                         upper: float, fixed: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(drift, coefficients) of one batch: adaptive ``min(base (1 + d), upper)``, or the fixed-coefficient
    ablation (every sample gets ``fixed``; the summary's ablation uses 0.50)."""
    with torch.no_grad():
        drift = representation_drift(current, historical)
    if adaptive:
        return drift, distillation_coefficient(drift, base, upper)
    return drift, torch.full_like(drift, float(fixed))


def fusion_coefficient(server_round: int, start: int, ramp: int, mode: FusionMode = "progressive") -> float:
    """Gate ``alpha_t`` of the personalized residual in round ``t`` (rounds count from 1).

    ``progressive`` (summary: "zero before an activation round, rising linearly to one over a preset
    ramp-up period, then staying at one"): ``0`` for ``t < start``; ``min(1, (t - start + 1) / ramp)`` for
    ``t >= start``, so the first active round ``start`` has ``1/ramp`` and round ``start + ramp - 1`` has 1
    (ours: the summary does not say whether the activation round itself is at 0); ``ramp = 0`` is a step
    to 1 at ``start``. Ablations: ``always`` = 1 from round 0, ``off`` = 0 always."""
    if mode == "always":
        return 1.0
    if mode == "off":
        return 0.0
    if mode != "progressive":
        raise ValueError(f"unknown fusion mode {mode!r}")
    if server_round < start:
        return 0.0
    if ramp <= 0:
        return 1.0
    return float(min(1.0, (server_round - start + 1) / ramp))


def ema_update(teacher: Sequence[np.ndarray], student: Sequence[np.ndarray], decay: float) -> list[np.ndarray]:
    """EMA teacher update ``theta_T <- decay * theta_T + (1 - decay) * theta_k``, array by array, computed
    in float64 and returned in the teacher's dtype. Summary: the EMA teacher "compresses the client's
    retained shared-model states across rounds into one exponentially time-weighted summary, without
    storing the full sequence of historical models"."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
    out = []
    for t, s in zip(teacher, student, strict=True):
        t = np.asarray(t)
        s = np.asarray(s)
        if t.shape != s.shape:
            raise ValueError(f"EMA teacher array shape {t.shape} != student shape {s.shape}")
        mixed = decay * t.astype(np.float64) + (1.0 - decay) * s.astype(np.float64)
        out.append(mixed.astype(t.dtype))
    return out


def mechanism_statistics(drift: torch.Tensor, coefficients: torch.Tensor, upper: float, ce_total: float,
                         kd_total: float) -> dict[str, float]:
    """What the teacher does in one client's round, from every distilled sample's drift ``d_i`` and
    coefficient ``lambda_i`` (all batches and epochs) and the round's summed loss terms: the mean and
    maximum drift, the mean coefficient, its 10th / 50th / 90th percentiles over the samples (linear
    interpolation), the share of samples at the bound (``lambda_i >= upper``: the clip of
    ``min(lambda_0 (1 + d_i), upper)`` acts), and the distillation term's share of the loss,
    ``sum_b KD_b / sum_b (CE_b + KD_b)`` with each batch's mean terms weighted by its size (not an equation
    of the summary: the diagnostic that says whether the per-sample weighting can move the training)."""
    drift = drift.double()
    coefficients = coefficients.double()
    p10, p50, p90 = torch.quantile(coefficients, torch.tensor(COEFFICIENT_QUANTILES, dtype=torch.float64)).tolist()
    total = ce_total + kd_total
    return {
        "mean_drift": float(drift.mean()), "max_drift": float(drift.max()),
        "mean_kd_coef": float(coefficients.mean()),
        "kd_coef_p10": p10, "kd_coef_p50": p50, "kd_coef_p90": p90,
        "kd_coef_at_bound": float((coefficients >= upper).double().mean()),
        "kd_loss_share": kd_total / total if total > 0 else 0.0,
    }
