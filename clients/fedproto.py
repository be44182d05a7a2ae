"""FedProto client (Tan et al., AAAI 2022, Algorithm 1).

The whole model (backbone f_i and head) is the client's own: it is kept in ``context.state``
(``persistent_part = "all"``, the seeded initial model before the first participation), never uploaded,
and survives rounds in which the client is not sampled. Each round a sampled client receives the global
prototypes C_bar (with an availability mask), trains ``local_epochs`` epochs of SGD on Eq. 8

    L = CE(F(x), y) + lambda * || f(x) - C_bar^(y) ||^2          (lambda = ``fedproto_lambda``)

(:func:`fedpers.algorithms.fedproto.fedproto_loss`; round 1 has no prototypes: CE only), then computes its
class prototypes on its train data (eval mode, Eq. 4) and uploads them with its class counts.

Evaluation (``fedproto_infer``): ``global`` (default, as FedProto's code) predicts the class of the
nearest global prototype; ``local`` the nearest of the client's own prototypes (recomputed from its train
data with its current model); ``head`` the classifier. The other two are reported as ``acc_<mode>``
(``personalized_macro_acc_<mode>``). Before any global prototype exists ``global`` falls back to the head.
"""

from __future__ import annotations

import numpy as np
import torch

from clients.base import FedPersClient
from fedpers.algorithms import fedproto
from fedpers.algorithms.fedproto import fedproto_loss, nearest_prototype
from fedpers.algorithms.prototypes import class_prototypes
from fedpers.core.errors import ClientUpdateError
from fedpers.core.federation import get_federation
from fedpers.core.models import set_arrays
from fedpers.core.training import accuracy_and_loss, backbone_features, predict_logits

INFER_MODES = ("global", "local", "head")


class FedProtoClient(FedPersClient):
    """Local model, prototype-regularised training, prototype upload, nearest-prototype inference."""

    contract = fedproto.CONTRACT
    persistent_part = "all"

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        self.num_classes = get_federation(cfg).num_classes
        self.feature_dim = int(self.model.head.in_features)

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Read the global prototypes and mask (the broadcast has no model section); restore the client's
        own model."""
        c, d = self.num_classes, self.feature_dim
        protos, mask = self.received["global_prototypes"], self.received["prototype_mask"]
        if (len(protos) != 1 or len(mask) != 1 or tuple(np.shape(protos[0])) != (c, d)
                or tuple(np.shape(mask[0])) != (c,)):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: expected prototypes {(c, d)} "
                                    f"and a mask {(c,)}, got {[tuple(np.shape(a)) for a in protos + mask]}")
        if not (np.isfinite(protos[0]).all() and np.isfinite(mask[0]).all()):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: prototypes are not finite")
        self.prototypes = torch.as_tensor(np.asarray(protos[0]), dtype=torch.float32, device=self.device)
        self.available = torch.as_tensor(np.asarray(mask[0]) > 0, device=self.device)
        set_arrays(self.model, self.personal_arrays(), "all", source=f"client {self.partition_id}: saved state")

    def batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. 8 on one mini-batch."""
        z = self.model.backbone(x)
        return fedproto_loss(self.model.head(z), z, y, self.prototypes, self.available, self.cfg.fedproto_lambda)

    def local_prototypes(self) -> tuple[np.ndarray, np.ndarray]:
        """Eq. 4 on the train data with the current model (eval mode): prototypes and class counts."""
        train = self.data.train
        return class_prototypes(backbone_features(self.model, train.x), train.y, self.num_classes)

    def upload_content(self) -> dict[str, list[np.ndarray]]:
        """The client's prototypes and class counts (float32)."""
        protos, counts = self.local_prototypes()
        return {"class_prototypes": [protos.astype(np.float32)], "class_counts": [counts.astype(np.float32)]}

    def get_parameters(self, config):
        """What the client would upload: its prototypes and counts."""
        return [a for name in self.upload_sections for a in self.upload_content()[name]]

    def predictions(self, mode: str, test_x: torch.Tensor) -> torch.Tensor:
        """Predicted classes of ``test_x`` by ``mode`` (global / local prototypes, or the head)."""
        if mode == "head" or (mode == "global" and not bool(self.available.any())):
            return predict_logits(self.model, test_x).argmax(dim=1)
        feats = backbone_features(self.model, test_x)
        if mode == "global":
            return nearest_prototype(feats, self.prototypes, self.available)
        protos, counts = self.local_prototypes()
        return nearest_prototype(feats, torch.as_tensor(protos, device=feats.device),
                                 torch.as_tensor(counts > 0, device=feats.device))

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Accuracy of the configured inference; the other two modes as extras; loss = the head's CE."""
        test = self.data.test
        if len(test) == 0:
            return float("nan"), float("nan"), {}
        accs = {mode: float((self.predictions(mode, test.x) == test.y).float().mean()) for mode in INFER_MODES}
        _, loss = accuracy_and_loss(predict_logits(self.model, test.x), test.y)
        mode = self.cfg.fedproto_infer
        return accs[mode], loss, {f"acc_{m}": a for m, a in accs.items() if m != mode}
