"""FedAS client (Yang et al., CVPR 2024, "FedAS: Bridging Inconsistency in Personalized Federated
Learning"), following the authors' code (``clientAS``; PFLlib-based) where the paper leaves details open.

The client's personalized model (feature extractor + classifier) is kept whole in ``context.state``
(``persistent_part = "all"``; the seeded initial model before the first participation) and survives
rounds in which it is not sampled. A sampled client

1. **federated parameter alignment** (the paper's first mechanism): aligns the received shared feature extractor with
   its local knowledge before using it: with its previous local model it computes class prototypes on its
   train data, then fine-tunes the *received* extractor for ``fedas_align_epochs`` epochs of SGD
   (lr ``fedas_align_lr``, batch ``fedas_align_batch``; code: 1, 0.01, 16) so that its features match
   those prototypes (:func:`fedpers.algorithms.fedas.align_backbone`). The aligned extractor replaces the
   local one; the classifier stays the client's own. At its first participation there is no previous
   local model and the received extractor is used as is (as in the authors' code, where the previous
   model is then the received one);
2. trains the whole model with cross-entropy for ``local_epochs`` epochs and saves it;
3. **client synchronization** (the second): computes the trace of the empirical Fisher information of the
   trained model on its train data (:func:`fedpers.algorithms.fedas.fisher_trace`) and uploads it with the
   feature extractor; the server weights extractors by it (``strategies/fedas.py``).

Evaluation: the client's own model as saved (its aligned-then-trained model), not the received extractor.

Simplifications (ours): the Fisher trace is the sum of squared mini-batch gradients (batch ``batch_size``)
of the mean negative log-likelihood over all parameters, computed only by sampled clients (the authors'
code also lets non-sampled clients compute it, for logging only); no other straggler handling.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from clients.base import FedPersClient
from fedpers.core import seeds
from fedpers.algorithms import fedas
from fedpers.algorithms.fedas import align_backbone, fisher_trace
from fedpers.core.federation import get_federation
from fedpers.core.models import get_arrays, parameter_names, set_arrays
from fedpers.core.training import seed_everything
from fedpers.core.wire import MODEL_SECTION, server_round_of


class FedASClient(FedPersClient):
    """Parameter alignment of the received extractor, local training, Fisher-trace upload."""

    contract = fedas.CONTRACT
    persistent_part = "all"

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        self.num_classes = get_federation(cfg).num_classes
        self._fitting = False
        self.alignment_losses: list[float] = []
        self.fim = 0.0

    def align(self, local: list[np.ndarray], generator: torch.Generator) -> list[float]:
        """Parameter alignment of the model's (received) backbone toward the previous local model ``local``."""
        previous = copy.deepcopy(self.model)
        set_arrays(previous, local, "all", source=f"client {self.partition_id}: saved local model")
        train = self.data.train
        return align_backbone(self.model, previous, train.x, train.y, num_classes=self.num_classes,
                              lr=self.cfg.fedas_align_lr, epochs=self.cfg.fedas_align_epochs,
                              batch_size=self.cfg.fedas_align_batch, generator=generator,
                              drop_last=self.cfg.drop_last_batch)

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Evaluate: the own saved model. Fit: received extractor, aligned (when a local model exists),
        with the own classifier."""
        if not self._fitting:
            super().prepare(parameters)
            return
        set_arrays(self.model, parameters, "backbone", source=f"client {self.partition_id}: server broadcast")
        local = self.load_state("personal")
        self.alignment_losses = []
        if local is not None:
            if self.cfg.fedas_align_epochs > 0:
                self.alignment_losses = self.align(local, self._generator)
            aligned = get_arrays(self.model, "backbone")
            set_arrays(self.model, local, "all", source=f"client {self.partition_id}: saved local model")
            set_arrays(self.model, aligned, "backbone", source=f"client {self.partition_id}: aligned extractor")
        else:  # first participation: the received extractor and the initial classifier
            names = parameter_names(self.model, "all")
            head = set(parameter_names(self.model, "head"))
            set_arrays(self.model, [a for n, a in zip(names, self.personal_arrays()) if n in head], "head",
                       source=f"client {self.partition_id}: initial classifier")

    def train(self, generator: torch.Generator) -> float:
        """Cross-entropy training, then the Fisher trace of the trained model."""
        loss = super().train(generator)
        train = self.data.train
        self.fim = fisher_trace(self.model, train.x, train.y, self.cfg.batch_size)
        return loss

    def upload_content(self) -> dict[str, list[np.ndarray]]:
        """The feature extractor and the Fisher trace."""
        return {MODEL_SECTION: get_arrays(self.model, "backbone"),
                "fisher_trace": [np.array([self.fim], dtype=np.float32)]}

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """As the base (which saves the whole trained model); alignment runs inside ``prepare``."""
        self._fitting = True
        self._generator = seed_everything(self.cfg.seed, server_round_of(config), self.partition_id,
                                          seeds.FEDAS_ALIGNMENT)
        try:
            upload, n, metrics = super().fit(parameters, config)
        finally:
            self._fitting = False
        metrics["fisher_trace"] = float(self.fim)
        if self.alignment_losses:
            metrics["alignment_loss"] = float(self.alignment_losses[-1])
        return upload, n, metrics
