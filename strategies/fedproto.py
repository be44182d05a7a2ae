"""FedProto (Tan et al., AAAI 2022, Algorithm 1), server side.

No model weights travel. Each sampled client uploads its class prototypes (mean backbone feature per
class, C x d) and its class counts (C,); the server forms the global prototypes as the count-weighted
per-class mean of the uploads (Eq. 6, :func:`fedpers.algorithms.prototypes.aggregate_prototypes`) and
broadcasts them with a 0/1 availability mask (C,) of the classes that have one. The whole model stays on
each client (``clients/fedproto.py``), so there is no global model and no global accuracy; the method is
judged by personalized macro accuracy (nearest-prototype inference).

The configured ``aggregation`` rule does not apply: FedProto's count-weighted mean is the method.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpers.algorithms import fedproto
from fedpers.algorithms.prototypes import aggregate_prototypes
from strategies.base import FedPersStrategy, Updates


class FedProtoStrategy(FedPersStrategy):
    """Prototype exchange: uploads (prototypes, counts), broadcasts (global prototypes, mask)."""

    contract = fedproto.CONTRACT
    has_global_model = False

    def prepare_global_model(self) -> None:
        """No prototypes before round 1; uploads are C x d prototypes and C counts."""
        c, d = self.federation.num_classes, int(self.model.head.in_features)
        self.prototypes = np.zeros((c, d), np.float32)
        self.available = np.zeros(c, np.float32)

    def upload_section_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """A client's C x d prototypes and C class counts."""
        c, d = self.prototypes.shape
        return {"class_prototypes": [(c, d)], "class_counts": [(c,)]}

    def aggregate(self, server_round: int, updates: Updates) -> list[np.ndarray]:
        """Eq. 6: count-weighted per-class mean of the uploaded prototypes. A client's class counts are
        bounded by its (validated) sample count: counts summing to more are scaled down (ours), so that
        no client can outweigh the others by inflating its counts."""
        local = []
        for upload in updates.values():
            n = upload.num_examples
            counts = np.clip(np.asarray(upload.sections["class_counts"][0], dtype=np.float64), 0.0, None)
            if counts.sum() > n:
                counts = counts * (n / counts.sum())
            local.append((upload.sections["class_prototypes"][0], counts))
        protos, mask = aggregate_prototypes(local)
        return [protos, mask]

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Keep the new global prototypes (the server has no model to update)."""
        self.prototypes, self.available = aggregated

    def broadcast_content(self) -> dict[str, list[np.ndarray]]:
        """Global prototypes and their availability mask."""
        return {"global_prototypes": [self.prototypes.copy()], "prototype_mask": [self.available.copy()]}

    def extra_state(self) -> dict[str, Any]:  # checkpoint
        return {"fedproto_prototypes": self.prototypes, "fedproto_available": self.available}

    def load_extra_state(self, extra: dict[str, Any]) -> None:  # resume
        if "fedproto_prototypes" in extra:
            self.prototypes = np.asarray(extra["fedproto_prototypes"], np.float32)
            self.available = np.asarray(extra["fedproto_available"], np.float32)

    def summary_extras(self) -> dict[str, Any]:
        """Classes with a global prototype at the end."""
        return {"fedproto_classes_with_prototype": int(self.available.sum())}
