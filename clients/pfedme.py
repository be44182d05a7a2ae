"""pFedMe client (Dinh et al., NeurIPS 2020, Algorithm 1).

A sampled client i receives w^t and sets its local model w_{i,0} = w^t and its personalized model
theta = w^t (as pFedMe's code). Each mini-batch D of ``local_epochs`` epochs is one local round r
(R = the number of mini-batches; ours: the paper counts R local rounds of one sampled batch each, we use
the Table 1 budget of E epochs):

1. K = ``pfedme_k`` gradient steps on the personalized problem (Eq. 2)
   ``theta_i(w_{i,r}) = argmin_theta f_i(theta; D) + lambda/2 ||theta - w_{i,r}||^2``, learning rate
   ``pfedme_personal_lr``, theta warm-started from the previous batch
   (:func:`fedpers.algorithms.pfedme.pfedme_inner_solve`);
2. the local update ``w_{i,r+1} = w_{i,r} - eta lambda (w_{i,r} - theta_i)`` with eta = ``lr``
   (:func:`fedpers.algorithms.pfedme.pfedme_local_update`).

w_{i,R} is uploaded; the server takes ``(1 - beta) w^t + beta avg`` (``strategies/pfedme.py``). The
personalized model theta_i of the last local round is kept in ``context.state`` (never sent) and is what
the client is evaluated with (pFedMe's "personalized model"); before its first participation a client
has no theta_i and is evaluated with the received w^t (theta's starting point; ours).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from clients.base import FedPersClient, arrays_digest
from fedpers.algorithms.pfedme import pfedme_inner_solve, pfedme_local_update
from fedpers.core.models import get_arrays, set_arrays
from fedpers.core.training import evaluate, minibatches
from fedpers.core.wire import WHOLE_MODEL

PERSONAL_STATE = "pfedme_theta"


class PFedMeClient(FedPersClient):
    """Bilevel Moreau-envelope local update; uploads w_{i,R}, keeps theta_i."""
    state_model_copies = 1.0  # the personalized model theta_i, per client (memory estimate)

    contract = WHOLE_MODEL

    def __init__(self, cfg, context):
        super().__init__(cfg, context)

    def train(self, generator: torch.Generator) -> float:
        """R local rounds (one per mini-batch): K inner steps on theta, then w <- w - eta lambda (w - theta).
        Returns the mean inner objective; saves theta."""
        theta = copy.deepcopy(self.model)  # theta starts at w^t
        local = list(self.model.parameters())  # w_{i,r}, updated in place
        theta_params = list(theta.parameters())
        train = self.data.train
        lam = self.cfg.pfedme_lambda
        total, count = 0.0, 0
        for _ in range(self.cfg.local_epochs):
            for idx in minibatches(len(train), self.cfg.batch_size, generator, train.x.device,
                                   drop_last=self.cfg.drop_last_batch):
                values = pfedme_inner_solve(theta, train.x[idx], train.y[idx], local, lam=lam,
                                            lr=self.cfg.pfedme_personal_lr, steps=self.cfg.pfedme_k)
                pfedme_local_update(local, theta_params, lr=self.cfg.lr, lam=lam)
                total += values[-1] * len(idx)
                count += len(idx)
        self.theta = get_arrays(theta, "all")
        self.save_state(PERSONAL_STATE, self.theta)
        return total / max(count, 1)

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Upload w_{i,R}; report the digest of the saved theta_i."""
        upload, n, metrics = super().fit(parameters, config)
        metrics["state_digest"] = arrays_digest(self.theta)
        return upload, n, metrics

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Accuracy of the personalized model theta_i (w^t before the first participation)."""
        stored = self.load_state(PERSONAL_STATE)
        if stored is not None:
            set_arrays(self.model, stored, "all", source=f"client {self.partition_id}: saved personalized model")
            self.evaluated_digest = arrays_digest(get_arrays(self.model, "all"))
        acc, loss = evaluate(self.model, self.data.test.x, self.data.test.y)
        return acc, loss, {}
