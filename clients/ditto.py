"""Ditto client (Li et al., ICML 2021, Algorithm 1).

Each round a sampled client k receives the global model w^t and

1. updates the global model as FedAvg: ``local_epochs`` epochs of SGD on F_k from w^t, giving w_k, which
   is uploaded;
2. updates its personal model v_k: ``ditto_personal_epochs`` epochs (s of Alg. 1; 0 = ``local_epochs``)
   of SGD on the Ditto objective (Eq. 2) ``h_k(v; w^t) = F_k(v) + lambda/2 ||v - w^t||^2``
   (:func:`fedpers.algorithms.ditto.personal_objective`, lambda = ``ditto_lambda``), i.e.
   ``v_k <- v_k - lr (grad F_k(v_k) + lambda (v_k - w^t))``, anchored at the *received* w^t.

v_k is the whole model, kept in ``context.state`` (never sent), so it survives rounds in which the client
is not sampled; before its first participation v_k = w^0, the seeded initial model (Alg. 1 input). The
client is evaluated with v_k.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from clients.base import FedPersClient, arrays_digest
from fedpers.algorithms.ditto import personal_objective
from fedpers.core.models import get_arrays, set_arrays
from fedpers.core.training import evaluate, sgd, train_epochs
from fedpers.core.wire import WHOLE_MODEL

PERSONAL_STATE = "ditto_personal"


class DittoClient(FedPersClient):
    """Global model trained as FedAvg and uploaded; personal model v_k trained with proximal coupling."""
    state_model_copies = 1.0  # the personal model v_k, per client (memory estimate)

    contract = WHOLE_MODEL

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        self._initial_model = get_arrays(self.model, "all")  # w^0 = v_k^0

    def on_download(self) -> None:
        """Snapshot the received global model w^t: the anchor of the personal objective."""
        self.global_params = [p.detach().clone() for p in self.model.parameters()]

    def personal_model(self) -> nn.Module:
        """v_k as last saved (w^0 before the first participation), as a separate model."""
        personal = copy.deepcopy(self.model)
        stored = self.load_state(PERSONAL_STATE)
        set_arrays(personal, stored if stored is not None else self._initial_model, "all",
                   source=f"client {self.partition_id}: saved personal model")
        return personal

    def train_personal(self, personal: nn.Module, generator: torch.Generator) -> float:
        """Ditto Alg. 1, personal update: SGD on ``F_k(v) + lambda/2 ||v - w^t||^2``; returns the mean loss."""
        params = list(personal.parameters())
        opt = sgd(params, self.cfg.lr, self.cfg.momentum, self.cfg.weight_decay)
        epochs = self.cfg.ditto_personal_epochs or self.cfg.local_epochs
        lam = self.cfg.ditto_lambda
        return train_epochs(
            personal, self.data.train.x, self.data.train.y, epochs=epochs, batch_size=self.cfg.batch_size,
            optimizer=opt, generator=generator, drop_last=self.cfg.drop_last_batch,
            batch_loss=lambda x, y: personal_objective(personal(x), y, params, self.global_params, lam))

    def train(self, generator: torch.Generator) -> float:
        """Global update (FedAvg's local SGD on F_k), then the personal update; v_k is saved."""
        loss = super().train(generator)
        personal = self.personal_model()
        self.personal_loss = self.train_personal(personal, generator)
        self.personal = get_arrays(personal, "all")
        self.save_state(PERSONAL_STATE, self.personal)
        return loss

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Upload w_k; report the digest of the saved v_k."""
        upload, n, metrics = super().fit(parameters, config)
        metrics["state_digest"] = arrays_digest(self.personal)
        metrics["personal_loss"] = float(self.personal_loss)
        return upload, n, metrics

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Accuracy of the personal model v_k on the client's test split."""
        personal = self.personal_model()
        if self.load_state(PERSONAL_STATE) is not None:
            self.evaluated_digest = arrays_digest(get_arrays(personal, "all"))
        acc, loss = evaluate(personal, self.data.test.x, self.data.test.y)
        return acc, loss, {}
