"""FedProc client (Mu et al., FGCS 2023): prototype-contrastive local training.

Receives the model and the global class prototypes c_k (with an availability mask). Local loss
(hybrid): ``(1 - a_t) L_task + a_t L_pc`` with L_pc the global prototypical contrastive loss
``-log( exp(cos(z, c_y)/tau) / sum_k exp(cos(z, c_k)/tau) )`` on the backbone feature z
(:func:`fedpers.algorithms.fedproc.prototype_contrastive_loss`, tau = ``fedproc_tau``) and
``a_t = 1 - t/T`` (:func:`fedpers.algorithms.fedproc.fedproc_weight`). Before any prototype exists (round 1)
the loss is the task loss. After training the client computes its class prototypes (mean backbone
feature per class, eval mode) and uploads model, prototypes and class counts.

Ours / simplified: FedProc's own network has a projection layer for the contrastive features; we use the
backbone output (the head's input). The decaying weight a_t and tau are recalled from the FedProc paper,
not checked against it (the JDFL paper gives no FedProc details).
"""

from __future__ import annotations

import numpy as np
import torch

from clients.server_state import ServerStateClient
from fedpers.algorithms import fedproc
from fedpers.algorithms.fedproc import fedproc_weight, prototype_contrastive_loss
from fedpers.algorithms.prototypes import class_prototypes
from fedpers.core.errors import ClientUpdateError
from fedpers.core.federation import get_federation
from fedpers.core.training import backbone_features


class FedProcClient(ServerStateClient):
    """Hybrid CE + prototype-contrastive local loss; uploads class prototypes."""

    contract = fedproc.CONTRACT

    def on_download(self) -> None:
        """Global prototypes and which classes have one (one array in each of their sections)."""
        protos, mask = self.received["global_prototypes"], self.received["prototype_mask"]
        if len(protos) != 1 or len(mask) != 1:
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: expected one prototypes and one "
                                    f"mask array, got {len(protos)} and {len(mask)}")
        protos, available = protos[0], mask[0]
        self.prototypes = torch.as_tensor(protos, dtype=torch.float32, device=self.device)
        self.available = torch.as_tensor(available > 0, device=self.device)

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(1 - a_t) task + a_t prototype-contrastive."""
        z = self.model.backbone(x)
        task = self.task_loss(self.model.head(z), y)
        if not bool(self.available.any()):
            return task
        a = fedproc_weight(getattr(self, "server_round", 1), self.cfg.rounds)
        pc = prototype_contrastive_loss(z, y, self.prototypes, self.cfg.fedproc_tau, self.available)
        return (1.0 - a) * task + a * pc

    def extra_upload(self) -> dict[str, list[np.ndarray]]:
        """Local class prototypes and counts after training."""
        num_classes = get_federation(self.cfg).num_classes
        feats = backbone_features(self.model, self.data.train.x)
        protos, counts = class_prototypes(feats, self.data.train.y, num_classes)
        return {"class_prototypes": [protos], "class_counts": [counts]}
