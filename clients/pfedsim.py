"""pFedSim client (Tan et al., arXiv:2305.15706), as the authors' code (FL-bench).

* Warm-up rounds (``server_round <= int(pfedsim_warmup x rounds)``): FedAvg; the client trains the
  broadcast global model with cross-entropy and uploads it; it keeps no state and is evaluated with the
  broadcast global model.
* Personalization rounds: the client receives its personalized model (similarity-weighted average, see
  ``strategies/pfedsim.py``), takes its feature extractor and restores its **own classifier** (the last
  one it trained in this phase; at its first personalization round the received one), trains the whole
  model with cross-entropy for ``local_epochs`` epochs and uploads it (the server needs the classifier
  for the similarities). Its trained model is kept in ``context.state`` (``pfedsim_local``) and is what
  it is evaluated with, also in rounds in which it is not sampled (before its first personalization
  round: the broadcast, frozen warm-up model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.base import FedPersClient, arrays_digest
from fedpers.algorithms.pfedsim import warmup_rounds
from fedpers.core.models import get_arrays, parameter_names, set_arrays
from fedpers.core.training import evaluate
from fedpers.core.wire import WHOLE_MODEL, server_round_of

LOCAL_STATE = "pfedsim_local"


class PFedSimClient(FedPersClient):
    """Whole-model training; own classifier and trained model kept from the personalization phase on."""
    state_model_copies = 1.0  # the local model, per client (memory estimate)

    contract = WHOLE_MODEL

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        self._fitting = False
        self._round = 0

    def personalizing(self) -> bool:
        """Is this round in the personalization phase?"""
        return self._round > warmup_rounds(self.cfg)

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Load the broadcast; in the personalization phase restore the own classifier (fit) or the
        own trained model (evaluate)."""
        super().prepare(parameters)
        local = self.load_state(LOCAL_STATE) if self.personalizing() else None
        if local is None:
            return
        source = f"client {self.partition_id}: saved local model"
        if self._fitting:
            names = parameter_names(self.model, "all")
            head = set(parameter_names(self.model, "head"))
            set_arrays(self.model, [a for n, a in zip(names, local) if n in head], "head", source=source)
        else:
            set_arrays(self.model, local, "all", source=source)
            self.evaluated_digest = arrays_digest(local)

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Train; in the personalization phase save the trained model and report its digest."""
        self._round, self._fitting = server_round_of(config), True
        try:
            upload, n, metrics = super().fit(parameters, config)
        finally:
            self._fitting = False
        if self.personalizing():
            local = get_arrays(self.model, "all")
            self.save_state(LOCAL_STATE, local)
            metrics["state_digest"] = arrays_digest(local)
        return upload, n, metrics

    def evaluate_personalized(self, generator):
        """Accuracy of the model prepared for evaluation (own trained model, or the broadcast)."""
        acc, loss = evaluate(self.model, self.data.test.x, self.data.test.y)
        return acc, loss, {}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """As the base, plus the digest of the evaluated own model."""
        self._round = server_round_of(config)
        loss, n, metrics = super().evaluate(parameters, config)
        if self.evaluated_digest is not None:
            metrics["state_digest"] = self.evaluated_digest
        return loss, n, metrics
