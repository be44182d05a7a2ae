"""FedEAGD client (paper summary in ``shared/papers/fedeagd-summary.txt``; math in ``fedpers/algorithms/fedeagd.py``).

Per round the client

1. loads the broadcast shared extractor theta_g into its SE-CNN ``backbone`` and restores its persistent
   personal part (classifier ``head`` and personalized ``residual``, never uploaded);
2. sets the residual gate ``alpha_t`` of the round (progressive schedule, or an ablation);
3. minimises ``CE(head(z + alpha_t r(z)), y) + 1/B sum_i lambda_i l(z_i, t_i)`` for E epochs, where
   ``z = backbone(x)``, ``t`` is the EMA teacher's representation of the same sample (no gradient),
   ``lambda_i = min(base (1 + d_i), bound)`` with drift ``d_i = 1 - cos(z_i, t_i)``;
4. uploads only the shared extractor, keeps head + residual, and updates its EMA teacher
   ``T <- beta T + (1 - beta) theta`` with the trained extractor ``theta_k`` (``fedeagd_teacher_source:
   trained``) or the broadcast one ``theta_g`` (``received``: the teacher then holds the history of the
   shared representation as this client received it).

The EMA teacher is client state (``context.state``, saved once as an ``ArrayRecord``), persistent across
rounds and never sent. A client has no history before its first participation, so that round has no
distillation term and the teacher starts as the extractor it trained (ours; the summary does not say).
Ablations (config keys): ``fedeagd_teacher=false`` (no teacher: plain CE), ``fedeagd_kd_weighting=fixed``
(every sample gets ``fedeagd_kd_fixed``), ``fedeagd_fusion=always|off``; ``fedeagd_residual_init=default``
starts the residual's output layer at PyTorch's init instead of zeros.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clients.base import FedPersClient
from fedpers.algorithms.fedeagd import (
    FIT_STATISTICS, ema_update, fedeagd_coefficients, fusion_coefficient, historical_distillation,
    mechanism_statistics)
from fedpers.core.models import get_arrays, set_arrays
from fedpers.core.training import backbone_features, features_in_both_modes, frozen_copy
from fedpers.core.wire import BACKBONE_ONLY, server_round_of

TEACHER_STATE = "ema_teacher"


class FedEAGDClient(FedPersClient):
    """Shared SE-CNN extractor, persistent head + residual, persistent EMA teacher."""
    state_model_copies = 1.0  # the EMA teacher (a backbone copy), per client (memory estimate)

    contract = BACKBONE_ONLY
    persistent_part = "personal"
    model_kind = "se_cnn"

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        self.teacher: nn.Module | None = None
        self.received_backbone: list[np.ndarray] | None = None
        self.reset_statistics()

    def reset_statistics(self) -> None:
        """Start a round's record of every distilled sample's drift and coefficient and the loss terms."""
        # kept on the training device and read once per round: reading them per batch would wait for the
        # device at every step
        self._drifts: list[torch.Tensor] = []
        self._coefs: list[torch.Tensor] = []
        self._ce_total: torch.Tensor | float = 0.0  # float64 sums of each batch's mean term times its size
        self._kd_total: torch.Tensor | float = 0.0

    def initialise_model(self) -> None:
        """``fedeagd_residual_init: default``: the residual's output layer at PyTorch's seeded init."""
        if self.cfg.fedeagd_residual_init == "default":
            self.model.reset_residual_output(self.cfg.seed)

    def on_download(self) -> None:
        """Keep the broadcast shared extractor where the teacher averages it in after the round."""
        if self.cfg.fedeagd_teacher_source == "received":
            self.received_backbone = get_arrays(self.model, "backbone")

    # --- round settings -----------------------------------------------------------------------
    def set_round(self, server_round: int) -> float:
        """Install the residual gate alpha_t of ``server_round`` in the model; returns it."""
        alpha = fusion_coefficient(server_round, self.cfg.fedeagd_fusion_start, self.cfg.fedeagd_fusion_ramp,
                                   self.cfg.fedeagd_fusion)
        self.model.fusion = alpha
        return alpha

    def load_teacher(self) -> nn.Module | None:
        """The EMA teacher as a frozen model (only its backbone is used), or None when there is none yet
        or the no-teacher ablation is on."""
        if not self.cfg.fedeagd_teacher:
            return None
        arrays = self.load_state(TEACHER_STATE)
        if arrays is None:
            return None
        teacher = frozen_copy(self.model)
        set_arrays(teacher, arrays, "backbone", source=f"client {self.partition_id}: EMA teacher state")
        return teacher

    def update_teacher(self, backbone: list[np.ndarray]) -> None:
        """``T <- beta T + (1 - beta) theta`` (first participation: ``T <- theta``), saved in state; ``theta``
        is the trained or the received extractor (``fedeagd_teacher_source``)."""
        old = self.load_state(TEACHER_STATE)
        new = backbone if old is None else ema_update(old, backbone, self.cfg.fedeagd_ema_decay)
        self.save_state(TEACHER_STATE, new)

    # --- training -------------------------------------------------------------------------------
    def train(self, generator: torch.Generator) -> float:
        """E epochs of SGD on :meth:`distilled_loss`, the EMA teacher's features of every training sample
        computed once for the round.

        The teacher is frozen for the whole round and sees the samples as they are (no augmentation), so
        its features of a sample are the same in every epoch: one eval-mode pass over the client's data
        replaces one teacher pass per batch per epoch (``benchmarks/fedeagd_step_cost.py``). The batches are
        the base class's, drawn from the same generator; the teacher's features match the per-batch ones up
        to rounding (batches of another size)."""
        train = self.data.train
        if self.teacher is None or len(train) == 0:
            return super().train(generator)
        teacher_features = backbone_features(self.teacher, train.x)
        rows = torch.arange(len(train.y), device=train.y.device)

        def batch_loss(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            return self.distilled_loss(x, train.y[idx], teacher_features[idx])

        # the batch's targets are its row numbers, which find both its labels and the teacher's features
        return self.sgd_epochs(train.x, rows, batch_loss, generator)

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CE of the fused model plus the per-sample weighted historical distillation of the extractor, the
        teacher's features computed for this batch (:meth:`distilled_loss`); without a teacher plain CE."""
        if self.teacher is None:
            return F.cross_entropy(self.model(x), y)
        with torch.no_grad():
            t = self.teacher.backbone(x)
        return self.distilled_loss(x, y, t)

    def distilled_loss(self, x: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``CE(head(z + alpha_t r(z)), y) + 1/B sum_i lambda_i l(z_i, t_i)`` with the teacher's features
        ``t`` of the batch (summary: FedEAGD's local objective).

        The drift that sets each sample's coefficient compares the student's and the teacher's features in
        the same mode (both eval mode, no dropout), so identical extractors have drift 0; the distillation
        loss itself is on the training-mode features, which carry the gradient."""
        z, z_matched = features_in_both_modes(self.model.backbone, x)  # one pass of the convolutions
        loss = F.cross_entropy(self.model.classify(z), y)
        drift, coef = fedeagd_coefficients(
            z_matched, t, adaptive=self.cfg.fedeagd_kd_weighting == "adaptive", base=self.cfg.fedeagd_kd_base,
            upper=self.cfg.fedeagd_kd_max, fixed=self.cfg.fedeagd_kd_fixed)
        kd = historical_distillation(z, t, coef, self.cfg.fedeagd_kd_form)
        self._drifts.append(drift.detach())
        self._coefs.append(coef.detach())
        self._ce_total = self._ce_total + loss.detach().double() * len(y)
        self._kd_total = self._kd_total + kd.detach().double() * len(y)
        return loss + kd

    # --- Flower NumPyClient interface -------------------------------------------------------------
    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """One FedEAGD round; uploads the shared extractor only, then updates the EMA teacher."""
        server_round = server_round_of(config)
        self.begin_message(server_round, training=True)  # the teacher is read before the base fit
        alpha = self.set_round(server_round)
        self.teacher = self.load_teacher()
        self.reset_statistics()
        uploaded, n, metrics = super().fit(parameters, config)
        self.teacher = None
        if self.cfg.fedeagd_teacher:
            received = self.cfg.fedeagd_teacher_source == "received"
            self.update_teacher(self.received_backbone if received else uploaded)
        self.received_backbone = None
        metrics["fusion"] = alpha
        if self._coefs:
            # the fixed-coefficient ablation has no clip: no sample is "at the bound" there
            bound = self.cfg.fedeagd_kd_max if self.cfg.fedeagd_kd_weighting == "adaptive" else float("inf")
            stats = mechanism_statistics(torch.cat(self._drifts).cpu(), torch.cat(self._coefs).cpu(), bound,
                                         float(self._ce_total), float(self._kd_total))
            metrics.update({name: stats[name] for name in FIT_STATISTICS})
        self.reset_statistics()
        return uploaded, n, metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Personalized accuracy with the round's gate alpha_t (theta_g, residual_k, head_k)."""
        self.set_round(server_round_of(config))
        return super().evaluate(parameters, config)
