"""pFedKDH (Souza Neto et al., MLSP 2026): the client objective of Eq. (2).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from fedpers.core.losses import distillation_kl, proximal_term
from fedpers.core.schema import Key, parses, positive, non_negative, unit_interval, one_of
from fedpers.core.wire import Contract


# What travels (fedpers.core.wire.Contract), declared once for the strategy and the client: the whole model down
# (the aggregated backbone and the recalibrated teacher head), only the backbone up (Eq. 4).
CONTRACT = Contract(download_part="all", upload_part="backbone")

# pFedKDH's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("variant", str, "fair", "pFedKDH evaluation variant: fair | ea", one_of("fair", "ea")),
    Key("temperature", float, 3.0, "pFedKDH distillation temperature T (ours)", positive),
    Key("lambda_kd", float, 0.5, "pFedKDH distillation weight lambda_KD (ours)", unit_interval),
    Key("recal_epochs", int, 3, "pFedKDH teacher-head recalibration epochs on Ds (Eq. 5)", non_negative),
    Key("recal_every_round", bool, True,
        "pFedKDH: recalibrate the teacher head after every aggregation (Alg. 1 line 16); false keeps only "
        "the initial calibration of line 5 (the Fig. 3 '+KD' ablation without recurrent recalibration)"),
    Key("recal_lr", float, 0.015, "pFedKDH recalibration SGD learning rate (ours: = lr)", positive),
    Key("warmup_epochs", int, 0, "pFedKDH global warm-up epochs E_w on Ds (Eq. 3)", non_negative),
    Key("ea_steps", int, 10, "pFedKDH-EA head-only SGD steps at evaluation (ours)", non_negative),
    Key("ea_epochs", int, 0,
        "pFedKDH-EA: > 0 adapts the head for this many epochs of the client's train data, ceil(n_k/B) steps "
        "each, instead of ea_steps steps (ours)", non_negative),
    Key("ea_also", str, "",
        "pFedKDH-EA: other adaptation lengths also evaluated, from the same adaptation run, comma-separated: "
        "'50' (steps) or '1ep' (epochs), recorded as personalized_macro_acc_ea50 / _ea1ep; each is what "
        "that ea_steps / ea_epochs gives (ours, for sensitivity studies)",
        lambda text: parses(parse_adaptation_lengths)(text)),
    Key("ea_lr", float, 0.015, "pFedKDH-EA head-adaptation learning rate (ours: = lr)", positive),
)


def pfedkdh_objective(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, *,
                      temperature: float, lambda_kd: float, mu: float,
                      backbone: Sequence[torch.Tensor], global_backbone: Sequence[torch.Tensor]) -> torch.Tensor:
    """pFedKDH local objective, Eq. (2), on one mini-batch:
    ``(1 - lambda_KD) CE(h_phi_k(b_theta_k(x)), y) + lambda_KD T^2 KL(q_g^T || q_k^T)
    + mu/2 ||theta_k - theta_g^t||^2``."""
    ce = F.cross_entropy(student_logits, labels)
    kd = distillation_kl(student_logits, teacher_logits, temperature)
    return ((1.0 - lambda_kd) * ce + lambda_kd * temperature**2 * kd
            + proximal_term(backbone, global_backbone, mu))


def parse_adaptation_lengths(text: str) -> list[tuple[str, int, str]]:
    """``ea_also`` as ``(token, count, unit)`` triples: ``'50'`` -> ``('50', 50, 'steps')``, ``'1ep'`` ->
    ``('1ep', 1, 'epochs')``; raises ValueError naming the bad token."""
    out = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        unit, digits = ("epochs", token[:-2]) if token.endswith("ep") else ("steps", token)
        if not digits.isdigit() or int(digits) < 1:
            raise ValueError(f"'{token}' is neither a step count (e.g. 50) nor an epoch count (e.g. 1ep)")
        out.append((token, int(digits), unit))
    return out


def adaptation_steps(count: int, unit: str, num_train: int, batch_size: int) -> int:
    """Head-adaptation steps of ``count`` steps or ``count`` epochs (``ceil(n_k / B)`` steps each)."""
    return count if unit == "steps" else count * -(-num_train // batch_size)
