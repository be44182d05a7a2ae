"""pFedSim (Tan et al., arXiv:2305.15706), server side, as the authors' code (FL-bench ``pFedSimServer``).

* **Warm-up phase** (rounds 1 .. W, W = int(``pfedsim_warmup`` x rounds); code default 0.5): plain
  FedAvg on the whole model (broadcast, sample-weighted average).
* **Personalization phase** (rounds > W): the global model is frozen at its warm-up value. The server
  keeps every client's last uploaded model (feature extractor and classifier; the warm-up model until a
  client uploads) and a similarity matrix S (identity at the start). Each sampled client k gets its own
  broadcast (a per-client ``FitIns``): the models of all clients averaged with the weights
  :func:`fedpers.algorithms.pfedsim.pfedsim_weights` of row k of S (its own model while it has no positive
  similarity). The client uses the feature extractor and keeps its own classifier
  (``clients/pfedsim.py``). After the round, ``S_ij = max(0, mean_c cos(W_i[c], W_j[c]))`` for every
  pair of clients that uploaded in it (:func:`fedpers.algorithms.pfedsim.classifier_similarity`, on the
  classifier weights).

``bytes_down`` sums what is actually sent to each client. Evaluation broadcasts the frozen warm-up model;
clients evaluate their own last trained model. No global accuracy (judged by personalized macro accuracy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedpers.algorithms.pfedsim import classifier_similarity, pfedsim_weights, warmup_rounds
from fedpers.core.models import get_arrays, parameter_names, set_arrays
from fedpers.core.validation import weighted_average
from fedpers.core.wire import MODEL_SECTION, WHOLE_MODEL
from strategies.base import FedPersStrategy, Updates


class PFedSimStrategy(FedPersStrategy):
    """FedAvg warm-up, then similarity-weighted personalized feature extractors."""

    contract = WHOLE_MODEL
    has_global_model = False
    fit_carries_evaluation = False  # per-client fit broadcasts (FedPersStrategy.per_client_fit)

    def prepare_global_model(self) -> None:
        """Similarity matrix (identity), per-client models (none yet), position of the classifier weight."""
        k = self.federation.num_clients
        self.warmup = warmup_rounds(self.cfg)
        self.similarity = np.eye(k)
        self.client_models: dict[int, list[np.ndarray]] = {}
        self.frozen: list[np.ndarray] | None = None  # the global model at the end of warm-up
        self.head_weight_index = parameter_names(self.model, "all").index("head.weight")

    def personalized_arrays(self, pid: int) -> list[np.ndarray]:
        """Client ``pid``'s personalized model: the pFedSim-weighted average of all clients' last models."""
        base = self.frozen if self.frozen is not None else get_arrays(self.model, "all")
        weights = pfedsim_weights(self.similarity[pid], pid)
        updates = [(self.client_models.get(j, base), float(w)) for j, w in enumerate(weights) if w > 0]
        return weighted_average(updates)

    def configure_fit(self, server_round, parameters, client_manager):
        """Warm-up: the base broadcast. Personalization: one personalized model per sampled client."""
        pairs = super().configure_fit(server_round, parameters, client_manager)
        if server_round <= self.warmup:
            return pairs
        if self.frozen is None:
            self.frozen = get_arrays(self.model, "all")
        return self.per_client_fit(pairs, lambda pid: {MODEL_SECTION: self.personalized_arrays(pid)})

    def aggregate(self, server_round: int, updates: Updates) -> list[np.ndarray]:
        """Warm-up: FedAvg. Personalization: store the uploads, update S, keep the frozen global model."""
        if server_round <= self.warmup:
            return super().aggregate(server_round, updates)
        pids = list(updates)
        for pid, upload in updates.items():
            self.client_models[int(pid)] = [np.asarray(a) for a in upload.model]
        h = self.head_weight_index
        for a, i in enumerate(pids):
            for j in pids[a + 1:]:
                s = classifier_similarity(self.client_models[int(i)][h], self.client_models[int(j)][h])
                self.similarity[int(i), int(j)] = self.similarity[int(j), int(i)] = s
        return list(self.frozen) if self.frozen is not None else get_arrays(self.model, "all")

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """Install the warm-up average (personalization: the frozen model, unchanged)."""
        set_arrays(self.model, aggregated, "all", source="aggregate")

    def extra_state(self) -> dict[str, Any]:  # checkpoint
        out: dict[str, Any] = {"pfedsim_similarity": self.similarity}
        if self.frozen is not None:
            out.update({f"pfedsim_frozen_{i}": a for i, a in enumerate(self.frozen)})
        for pid, arrays in self.client_models.items():
            out.update({f"pfedsim_client_{pid}_{i}": a for i, a in enumerate(arrays)})
        return out

    def load_extra_state(self, extra: dict[str, Any]) -> None:  # resume
        if "pfedsim_similarity" in extra:
            self.similarity = np.asarray(extra["pfedsim_similarity"], dtype=np.float64)
        n = len(parameter_names(self.model, "all"))
        if "pfedsim_frozen_0" in extra:
            self.frozen = [np.asarray(extra[f"pfedsim_frozen_{i}"]) for i in range(n)]
        for pid in range(self.federation.num_clients):
            if f"pfedsim_client_{pid}_0" in extra:
                self.client_models[pid] = [np.asarray(extra[f"pfedsim_client_{pid}_{i}"]) for i in range(n)]

    def summary_extras(self) -> dict[str, Any]:
        """Warm-up length and the final similarity matrix."""
        return {"pfedsim_warmup_rounds": self.warmup,
                "pfedsim_similarity": [[round(float(v), 4) for v in row] for row in self.similarity]}
