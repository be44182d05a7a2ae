"""FedRep client (Collins et al., ICML 2021, Algorithm 1).

A sampled client loads the global body (representation) phi^t, restores its own head h_i from
``context.state`` and alternates:

1. head epochs: ``fedrep_head_epochs`` (paper: 10) epochs of SGD on the head alone with the body frozen,
   ``h_i <- argmin_h f_i(h, phi^t)``. The frozen body's features are computed once in eval mode (ours, as
   the foundation's head-only steps; the body does not change during these epochs);
2. body epochs: ``local_epochs`` epochs of SGD on the body with the new head frozen,
   ``phi_i <- phi - lr grad_phi f_i(h_i, phi)`` (the paper uses 1; we keep the Table 1 budget of E).

Only the body is uploaded; the head is persistent and private (never uploaded, averaged or reset). The
client is evaluated with (global body, own head).
"""

from __future__ import annotations

import torch

from clients.base import FedPersClient
from fedpers.core.models import backbone_parameters, head_parameters
from fedpers.core.training import backbone_features, sgd, train_epochs, train_head_on_features
from fedpers.core.wire import BACKBONE_ONLY


class FedRepClient(FedPersClient):
    """Shared body, private head; head epochs then body epochs."""

    contract = BACKBONE_ONLY
    persistent_part = "head"

    def train_head(self, generator: torch.Generator) -> float:
        """FedRep head update: ``fedrep_head_epochs`` epochs on the head with the body frozen."""
        if self.cfg.fedrep_head_epochs <= 0:
            return float("nan")
        train = self.data.train
        feats = backbone_features(self.model, train.x)
        return train_head_on_features(self.model.head, feats, train.y, lr=self.cfg.lr,
                                      batch_size=self.cfg.batch_size, generator=generator,
                                      drop_last=self.cfg.drop_last_batch, epochs=self.cfg.fedrep_head_epochs)

    def train_body(self, generator: torch.Generator) -> float:
        """FedRep representation update: ``local_epochs`` epochs on the body with the head frozen."""
        head = head_parameters(self.model)
        for p in head:
            p.requires_grad_(False)
        try:
            opt = sgd(backbone_parameters(self.model), self.cfg.lr, self.cfg.momentum, self.cfg.weight_decay)
            train = self.data.train
            return train_epochs(self.model, train.x, train.y, epochs=self.cfg.local_epochs,
                                batch_size=self.cfg.batch_size, optimizer=opt, generator=generator,
                                drop_last=self.cfg.drop_last_batch, batch_loss=self.batch_loss)
        finally:
            for p in head:
                p.requires_grad_(True)

    def train(self, generator: torch.Generator) -> float:
        """Head epochs, then body epochs; returns the body epochs' mean loss."""
        self.head_loss = self.train_head(generator)
        return self.train_body(generator)
