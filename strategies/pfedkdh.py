"""pFedKDH server (Souza Neto et al., MLSP 2026, Algorithm 1).

* Broadcast: the global backbone theta_g and the teacher head phi_g (lines 8).
* Aggregation: only backbones are uploaded and averaged, sample-weighted (Eq. 4, line 15); no client
  head is ever transmitted, averaged or reset.
* Optional global warm-up of (theta_g, phi_g) on Ds for ``warmup_epochs`` epochs (Eq. 3, lines 2-4).
* Teacher-head recalibration on Ds with the backbone frozen, before round 1 and after every
  aggregation (Eq. 5, lines 5 and 16), for ``recal_epochs`` epochs. ``recal_every_round=false`` keeps
  the calibration before round 1 and drops the recurrent one (the Fig. 3 "+KD" ablation: the paper's
  text names "recurrent recalibration" as the component that bar lacks).
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from fedpers.algorithms import pfedkdh
from fedpers.core import seeds
from fedpers.core.errors import FedpersError
from fedpers.core.training import seed_everything, sgd, train_epochs
from strategies.base import FedPersStrategy



class PFedKDHStrategy(FedPersStrategy):
    """Backbone-only aggregation plus a recalibrated teacher head."""

    contract = pfedkdh.CONTRACT

    def prepare_global_model(self) -> None:
        """Algorithm 1 lines 2-5: optional warm-up (Eq. 3), then teacher calibration (Eq. 5)."""
        self.aux = self.federation.aux(self.device)
        if len(self.aux) == 0:
            raise FedpersError("pfedkdh needs the server's auxiliary set Ds: set aux_size > 0")
        if self.cfg.warmup_epochs > 0:
            gen = seed_everything(self.cfg.seed, seeds.SERVER_TRAINING, 0)
            opt = sgd(self.model.parameters(), self.cfg.lr, self.cfg.momentum, self.cfg.weight_decay)
            train_epochs(self.model, self.aux.x, self.aux.y, epochs=self.cfg.warmup_epochs,
                         batch_size=self.cfg.batch_size, optimizer=opt,
                         batch_loss=lambda x, y: F.cross_entropy(self.model(x), y), generator=gen,
                         drop_last=self.cfg.drop_last_batch)
        self._recalibrate(0)

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Eq. (4) then Eq. (5): install the averaged backbone, recalibrate the teacher head on Ds."""
        super().apply_aggregate(server_round, aggregated)
        if self.cfg.recal_every_round:
            self._recalibrate(server_round)

    def _recalibrate(self, server_round: int) -> None:
        gen = seed_everything(self.cfg.seed, seeds.SERVER_TRAINING, server_round + 1)
        pfedkdh.recalibrate_head(self.model, self.aux.x, self.aux.y, epochs=self.cfg.recal_epochs,
                         lr=self.cfg.recal_lr, batch_size=self.cfg.batch_size, generator=gen,
                         drop_last=self.cfg.drop_last_batch)
