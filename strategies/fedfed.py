"""FedFed (Yang et al., NeurIPS 2023, "FedFed: Feature Distillation against Data Heterogeneity in
Federated Learning"), server side, on FedAvg.

* **Feature-distillation phase** (rounds 1 .. D, D = min(``fedfed_distill_rounds``, rounds - 1); code:
  15 rounds, ours: counted inside ``rounds``): FedAvg on the classifier model while the sampled clients
  train their local feature-distillation module jointly with it (``clients/fedfed.py``).
* **Sharing** (once per client): from round D on, a sampled client that took part in distillation and has
  not shared yet sends its noisy performance-sensitive features and their labels in the upload's
  ``shared_features`` / ``shared_labels`` sections (empty otherwise). The server checks them (shapes,
  finiteness, labels, at most two noisy copies of the client's train set) and adds them to the **global
  shared dataset**; the model section is validated and averaged as FedAvg.
* **Training phase** (rounds > D): each sampled client gets its own ``FitIns`` (per-client broadcast):
  the global model plus a random draw, without replacement, of ``min(|D_k|, |shared|)`` shared samples
  (the authors' FL-bench port draws as many shared samples as the client has, every round), which it
  trains on together with its local data. ``bytes_down`` and ``bytes_up`` count the shared features too.

The global model is evaluated centrally (``global_acc``); the headline is the personalized macro accuracy
(each client's test split, the global model).
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import log

from fedpers.core import seeds
from fedpers.algorithms import fedfed
from fedpers.algorithms.fedfed import distill_rounds, empty_shared
from fedpers.core.models import get_arrays
from fedpers.core.wire import MODEL_SECTION
from strategies.base import FedPersStrategy, Updates


def shared_problem(xs: np.ndarray, ys: np.ndarray, input_shape, num_classes: int, max_rows: int) -> str | None:
    """Why uploaded shared features must not enter the global shared dataset, or None."""
    if tuple(np.shape(xs)[1:]) != tuple(input_shape) or np.ndim(ys) != 1 or len(ys) != len(xs):
        return f"shared features of shape {np.shape(xs)} / labels {np.shape(ys)}, expected (n, {input_shape}) / (n,)"
    if len(ys) > max_rows:
        return f"{len(ys)} shared samples, more than {max_rows}"
    if not (np.issubdtype(xs.dtype, np.floating) and np.isfinite(xs).all() and np.isfinite(ys).all()):
        return "shared features are not finite floating-point data"
    if len(ys) and (np.any(ys != np.round(ys)) or ys.min() < 0 or ys.max() >= num_classes):
        return "shared labels are not class indices"
    return None


class FedFedStrategy(FedPersStrategy):
    """FedAvg plus a global dataset of shared, noisy performance-sensitive features."""

    contract = fedfed.CONTRACT
    has_global_model = True
    fit_carries_evaluation = False  # per-client fit broadcasts (FedPersStrategy.per_client_fit)

    def prepare_global_model(self) -> None:
        """Empty shared dataset; the model part of an upload is the whole model."""
        self.distill = distill_rounds(self.cfg)
        self.shared_x, self.shared_y = empty_shared(self.federation.input_shape)
        self.sharers: set[int] = set()

    def broadcast_content(self) -> dict[str, list[np.ndarray]]:
        """The global model and no shared samples (the per-client draws go in configure_fit)."""
        xs, ys = empty_shared(self.federation.input_shape)
        return {MODEL_SECTION: get_arrays(self.model, "all"), "shared_features": [xs], "shared_labels": [ys]}

    def draw(self, pid: int, server_round: int) -> dict[str, list[np.ndarray]]:
        """The global model and a random draw of min(|D_k|, |shared|) shared samples for client ``pid``."""
        n = len(self.shared_y)
        m = min(n, len(self.federation.partition.train[pid]))
        idx = np.sort(np.random.default_rng([self.cfg.seed, server_round, pid, seeds.FEDFED_SHARED_DRAW]).choice(n, size=m, replace=False))
        return {MODEL_SECTION: get_arrays(self.model, "all"), "shared_features": [self.shared_x[idx]],
                "shared_labels": [self.shared_y[idx]]}

    def configure_fit(self, server_round, parameters, client_manager):
        """Training phase with shared data: per-client broadcasts of model + shared draw."""
        pairs = super().configure_fit(server_round, parameters, client_manager)
        if server_round <= self.distill or len(self.shared_y) == 0:
            return pairs
        return self.per_client_fit(pairs, lambda pid: self.draw(pid, server_round))

    def aggregate(self, server_round: int, updates: Updates) -> list[np.ndarray]:
        """Add each upload's shared features to the global shared dataset (checked; once per client), then
        FedAvg on the model sections."""
        for pid, upload in updates.items():
            features, labels = upload.sections["shared_features"], upload.sections["shared_labels"]
            if len(features) != 1 or len(labels) != 1:
                log(WARNING, "round %d: shared features of client %s dropped: %d feature and %d label arrays "
                    "instead of 1 and 1", server_round, pid, len(features), len(labels))
                continue
            xs, ys = np.asarray(features[0]), np.asarray(labels[0])
            if not len(ys):
                continue
            problem = shared_problem(xs, ys, self.federation.input_shape, self.federation.num_classes,
                                     2 * len(self.federation.partition.train[pid]))
            if problem:
                log(WARNING, "round %d: shared features of client %s dropped: %s", server_round, pid, problem)
            elif pid not in self.sharers:
                self.shared_x = np.concatenate([self.shared_x, xs.astype(np.float32)])
                self.shared_y = np.concatenate([self.shared_y, ys.astype(np.float32)])
                self.sharers.add(pid)
        self.book.extras()["fedfed_shared_samples"] = int(len(self.shared_y))
        return super().aggregate(server_round, updates)

    def extra_state(self) -> dict[str, Any]:  # checkpoint
        return {"fedfed_shared_x": self.shared_x, "fedfed_shared_y": self.shared_y,
                "fedfed_sharers": np.asarray(sorted(self.sharers), np.int64)}

    def load_extra_state(self, extra: dict[str, Any]) -> None:  # resume
        if "fedfed_shared_x" in extra:
            self.shared_x = np.asarray(extra["fedfed_shared_x"], np.float32)
            self.shared_y = np.asarray(extra["fedfed_shared_y"], np.float32)
            self.sharers = {int(p) for p in np.asarray(extra["fedfed_sharers"]).reshape(-1)}

    def summary_extras(self) -> dict[str, Any]:
        """Size of the global shared dataset and who contributed."""
        return {"fedfed_distill_rounds": self.distill, "fedfed_shared_samples": int(len(self.shared_y)),
                "fedfed_sharers": sorted(self.sharers)}
