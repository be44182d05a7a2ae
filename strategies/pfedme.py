"""pFedMe (Dinh et al., NeurIPS 2020, Algorithm 1), server side.

The server broadcasts w^t; each sampled client returns its local model w_{i,R}^t after R local rounds of
the bilevel Moreau-envelope update (``clients/pfedme.py``), and the server moves the global model by

    w^{t+1} = (1 - beta) w^t + beta * avg_{i in S^t} w_{i,R}^t          (Alg. 1, server update)

(:func:`fedpers.algorithms.pfedme.beta_mix`; beta = ``pfedme_beta``, 1 = FedAvg). ``avg`` is the configured
aggregation rule (default: sample-weighted mean, as PFLlib; the paper writes the plain mean over S^t,
identical for equal client sizes). The personalized models theta_i stay on the clients; the global model
is evaluated centrally (``global_acc``), the headline is the personalized macro accuracy.
"""

from __future__ import annotations

import numpy as np

from fedpers.algorithms.pfedme import beta_mix
from fedpers.core.models import get_arrays, set_arrays
from fedpers.core.wire import WHOLE_MODEL
from strategies.base import FedPersStrategy


class PFedMeStrategy(FedPersStrategy):
    """Whole-model broadcast; beta-mixed average of the clients' local models."""

    contract = WHOLE_MODEL
    has_global_model = True

    def apply_aggregate(self, server_round: int, aggregated: list[np.ndarray]) -> None:
        """``w^{t+1} = (1 - beta) w^t + beta * aggregate``."""
        previous = get_arrays(self.model, self.upload_part)
        set_arrays(self.model, beta_mix(previous, aggregated, self.cfg.pfedme_beta), self.upload_part,
                   source="aggregate")
