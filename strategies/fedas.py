"""FedAS (Yang et al., CVPR 2024), server side: client synchronization by Fisher information.

The shared part is the feature extractor (``backbone``; FedAS's ``model.base``), the classifier stays on
every client. Each sampled client uploads its trained feature extractor and, in the section ``fisher_trace``, the
trace of the empirical Fisher information of its trained model on its data
(:func:`fedpers.algorithms.fedas.fisher_trace`). The server aggregates the extractors weighted by those
traces, ``theta = sum_k FIM_k theta_k / sum_j FIM_j`` (the authors' ``aggregate_wrt_fisher``,
:func:`fedpers.algorithms.fedas.fisher_weights`), instead of by sample counts, so that under-trained
clients (small Fisher information, e.g. stragglers) contribute less. With ``aggregation: median`` or
``trimmed_mean`` the robust rule replaces the Fisher-weighted mean (ours).

There is no global classifier, hence no global accuracy; judged by personalized macro accuracy.
"""

from __future__ import annotations

import numpy as np

from fedpers.algorithms import fedas
from fedpers.algorithms.fedas import fisher_weights
from fedpers.core.validation import aggregate_updates, weighted_average
from strategies.base import FedPersStrategy, Updates


class FedASStrategy(FedPersStrategy):
    """Backbone broadcast; Fisher-weighted backbone aggregation."""

    contract = fedas.CONTRACT
    has_global_model = False

    def prepare_global_model(self) -> None:
        """No Fisher weights yet."""
        self.last_weights: dict[str, float] = {}

    def upload_section_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """The backbone's arrays and the Fisher trace (1,)."""
        return {**super().upload_section_shapes(), "fisher_trace": [(1,)]}

    def aggregate(self, server_round: int, updates: Updates) -> list[np.ndarray]:
        """Fisher-trace-weighted mean of the uploaded backbones."""
        valid = list(updates.values())
        models = self.model_updates(updates)
        if self.cfg.aggregation != "mean":
            return aggregate_updates(models, self.cfg.aggregation, self.cfg.trim_fraction)
        traces = [float(np.asarray(u.sections["fisher_trace"][0]).reshape(-1)[0]) for u in valid]
        weights = fisher_weights(traces, [u.num_examples for u in valid])
        self.book.extras()["fedas_fisher_weights"] = [round(float(w), 4) for w in weights]
        return weighted_average([(m, float(w)) for (m, _), w in zip(models, weights) if w > 0])
