"""pFedKDH (Souza Neto et al., MLSP 2026): the client objective of Eq. (2) with its distillation term, the
teacher head's recalibration on the server set (Eq. 5) and the EA variant's head adaptation (Sec. 3.4)."""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedpers.core.losses import proximal_term
from fedpers.core.training import (backbone_features, batches_per_epoch, head_sgd, step_batches,
                                    train_head_on_features)
from fedpers.core.schema import Key, parses, positive, non_negative, unit_interval, one_of
from fedpers.core.wire import Contract


# What travels (fedpers.core.wire.Contract), declared once for the strategy and the client: the whole model down
# (the aggregated backbone and the recalibrated teacher head), only the backbone up (Eq. 4).
CONTRACT = Contract(download_part="all", upload_part="backbone")

# pFedKDH's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("variant", str, "fair", "pFedKDH evaluation variant: fair | ea", one_of("fair", "ea")),
    # temperature, lambda_kd and ea_steps: chosen on MNIST validation data (the sensitivity study,
    # benchmarks/results/pfedkdh_sensitivity_mnist); T 3, lambda_KD 0.5 and 10 steps were guesses before it
    Key("temperature", float, 1.0, "pFedKDH distillation temperature T (ours: chosen on MNIST validation "
        "data, 3 until then)", positive, first_default=3.0),
    Key("lambda_kd", float, 0.1, "pFedKDH distillation weight lambda_KD (ours: chosen on MNIST validation "
        "data, 0.5 until then)", unit_interval, first_default=0.5),
    Key("recal_epochs", int, 3, "pFedKDH teacher-head recalibration epochs on Ds (Eq. 5)", non_negative),
    Key("recal_every_round", bool, True,
        "pFedKDH: recalibrate the teacher head after every aggregation (Alg. 1 line 16); false keeps only "
        "the initial calibration of line 5 (the Fig. 3 '+KD' ablation without recurrent recalibration)"),
    Key("recal_lr", float, 0.015, "pFedKDH recalibration SGD learning rate (ours: = lr)", positive),
    Key("warmup_epochs", int, 0, "pFedKDH global warm-up epochs E_w on Ds (Eq. 3)", non_negative),
    Key("ea_steps", int, 50, "pFedKDH-EA head-only SGD steps at evaluation (ours: chosen on MNIST "
        "validation data, 10 until then)", non_negative, first_default=10),
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


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(q_g^T || q_k^T), averaged over the batch: the distillation term of pFedKDH Eq. (2) (Hinton et
    al.'s softened softmax ``q_i^T = exp(z_i/T) / sum_j exp(z_j/T)``), without the ``lambda_KD T^2`` factor.
    The teacher is detached: no gradient flows into it."""
    log_student = F.log_softmax(student_logits / temperature, dim=1)
    log_teacher = F.log_softmax(teacher_logits.detach() / temperature, dim=1)
    return F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")



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


def adaptation_steps(count: int, unit: str, num_train: int, batch_size: int, *, drop_last: bool) -> int:
    """Head-adaptation steps of ``count`` steps or ``count`` epochs (an epoch's batches as
    :func:`~fedpers.core.training.batches_per_epoch`: ``ceil(n_k / B)``, or ``floor`` with ``drop_last``)."""
    return count if unit == "steps" else count * batches_per_epoch(num_train, batch_size, drop_last=drop_last)


def recalibrate_head(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float,
                     batch_size: int, generator: torch.Generator, drop_last: bool) -> float:
    """pFedKDH Eq. (5): ``phi_g <- argmin_phi 1/|Ds| sum CE(h_phi(b_theta_g(x)), y)`` over Ds with the
    aggregated backbone frozen, by ``epochs`` epochs of SGD on the head."""
    if epochs <= 0 or len(x) == 0:
        return float("nan")
    feats = backbone_features(model, x)
    return train_head_on_features(model.head, feats, y, lr=lr, batch_size=batch_size,
                                  generator=generator, drop_last=drop_last, epochs=epochs)


def adapt_head_copy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float,
                    batch_size: int, generator: torch.Generator, drop_last: bool) -> nn.Module:
    """pFedKDH-EA: a copy of the head refined by ``steps`` head-only SGD steps on the client's *train*
    data with the backbone frozen; the persistent head itself is left unchanged."""
    return adapt_head_copies(model, x, y, steps=[steps], lr=lr, batch_size=batch_size, generator=generator,
                             drop_last=drop_last)[steps]


def adapt_head_copies(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: Sequence[int], lr: float,
                      batch_size: int, generator: torch.Generator, drop_last: bool) -> dict[int, nn.Module]:
    """pFedKDH-EA (Sec. 3.4) at several step counts from one run: ``{k: the head copy after k steps}`` for
    every ``k`` in ``steps``. The first k batches of a longer run are the k batches of a k-step run (same
    generator), so each copy is the one a run of k steps gives (up to the float rounding of features taken
    in other batches). The persistent head is left unchanged.

    Only the samples the steps visit are passed through the frozen backbone (at most
    ``max(steps) * batch_size``, not the whole train split); the batches are those of
    :func:`train_head_on_features` with the same generator."""
    head = copy.deepcopy(model.head)
    wanted, longest = set(steps), max(steps, default=0)
    copies: dict[int, nn.Module] = {0: copy.deepcopy(head)} if 0 in wanted else {}
    if longest > 0 and len(x) > 0:
        batches = step_batches(len(x), batch_size, longest, generator, x.device, drop_last=drop_last)
        used, where = torch.unique(torch.cat(batches), return_inverse=True)
        feats, labels = backbone_features(model, x[used]), y[used]
        positions = torch.split(where, [len(b) for b in batches])

        def keep(done: int) -> None:
            if done in wanted:
                copies[done] = copy.deepcopy(head)

        head_sgd(head, ((feats[pos], labels[pos]) for pos in positions), lr, after_step=keep)
    for k in wanted:  # no data to adapt on: the head as it is
        copies.setdefault(k, copy.deepcopy(head))
    return copies
