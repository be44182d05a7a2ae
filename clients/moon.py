"""MOON client (Li et al., CVPR 2021, Eq. 2-3): model-contrastive local training.

Loss: ``L_task(x, y) + mu l_con`` with ``l_con = -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} +
e^{sim(z, z_prev)/tau}) )``: z from the model being trained, z_glob from the received global model,
z_prev from this client's previous local model (kept in ``context.state`` as ``moon_prev``; at first
participation the received model, as MOON's code initialises it). mu = ``moon_mu``, tau = ``moon_tau``.
Ours / simplified: MOON's network has a projection head; z is the backbone output (the head's input).
"""

from __future__ import annotations

import torch

from clients.fedavg import FedAvgClient
from fedpers.algorithms.moon import moon_contrastive_loss
from fedpers.core.models import get_arrays, set_arrays
from fedpers.core.training import frozen_copy


class MoonClient(FedAvgClient):
    """Model-contrastive local training."""
    state_model_copies = 1.0  # the previous local model, per client (memory estimate)

    def on_download(self) -> None:
        """Frozen global model and frozen previous local model."""
        self.global_model = frozen_copy(self.model)
        self.prev_model = frozen_copy(self.model)
        stored = self.load_state("moon_prev")
        if stored is not None:
            set_arrays(self.prev_model, stored, "all", source=f"client {self.partition_id}: saved state")

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """MOON Eq. (3) on one mini-batch."""
        z = self.model.backbone(x)
        loss = self.task_loss(self.model.head(z), y)
        if self.cfg.moon_mu == 0:
            return loss
        with torch.no_grad():
            z_glob = self.global_model.backbone(x)
            z_prev = self.prev_model.backbone(x)
        return loss + self.cfg.moon_mu * moon_contrastive_loss(z, z_glob, z_prev, self.cfg.moon_tau)

    def train(self, generator: torch.Generator) -> float:
        """Local training; the trained model becomes the next round's previous model."""
        loss = super().train(generator)
        self.save_state("moon_prev", get_arrays(self.model, "all"))
        return loss
