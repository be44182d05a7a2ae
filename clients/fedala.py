"""FedALA client (Zhang et al., AAAI 2023, Algorithm 1).

A sampled client i receives the global model Theta^t and, before local training, initialises its local
model by adaptive local aggregation (ALA, Alg. 1 lines 6-16):

    Theta_hat_i = Theta_i + (Theta^t - Theta_i) * W_i        on the top p = ``fedala_layer_idx`` tensors,
    Theta_hat_i = Theta^t                                    on all lower layers,

with Theta_i its old local model and the element-wise weights W_i in [0, 1] learned by
``W <- clip_[0,1](W - eta grad_Theta_hat L * (Theta^t - Theta_i))`` on a random ``fedala_rand_percent`` %
of its train data (eta = ``fedala_eta``; :func:`fedpers.algorithms.fedala.learn_ala_weights`). W starts at ones
and, in the client's first ALA, is trained until its loss converges (the start phase), afterwards for one
epoch per round. A client's first participation has no local model yet: ALA is skipped (Theta_hat =
Theta^t), as FedALA deactivates ALA in the first iteration.

Then ``local_epochs`` epochs of SGD on the cross-entropy; the trained local model is uploaded (the server
averages as FedAvg). The local model Theta_i and W_i are kept in ``context.state`` and survive rounds in
which the client is not sampled. The client is evaluated with its local model Theta_i (the received
Theta^t before its first participation, which is what its first local model starts from).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.base import FedPersClient, arrays_digest
from fedpers.algorithms.fedala import ala_combine, learn_ala_weights, top_parameter_names
from fedpers.core.errors import ClientUpdateError
from fedpers.core.models import get_arrays, parameter_names, set_arrays
from fedpers.core.training import evaluate
from fedpers.core.wire import WHOLE_MODEL

LOCAL_STATE = "fedala_local"
WEIGHTS_STATE = "fedala_weights"


class FedALAClient(FedPersClient):
    """ALA initialisation, local SGD, whole-model upload; local model and ALA weights persist."""
    state_model_copies = 2.0  # the local model and its aggregation weights, per client (memory estimate)

    contract = WHOLE_MODEL

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        try:
            self.top_names = top_parameter_names(self.model, cfg.fedala_layer_idx)
        except ValueError as exc:
            raise ClientUpdateError(f"client {self.partition_id}: {exc}") from None
        self.ala_epochs = 0

    def adaptive_local_aggregation(self, local: list[np.ndarray], generator: torch.Generator) -> None:
        """Learn W_i on a random s% of the train data and install Theta_hat_i in the model (which holds
        Theta^t, so the lower layers keep the global values); W_i is saved."""
        by_name = dict(zip(parameter_names(self.model, "all"), local, strict=True))
        params = dict(self.model.named_parameters())
        global_top = [params[n].detach().clone() for n in self.top_names]
        local_top = [torch.as_tensor(by_name[n], dtype=g.dtype, device=g.device)
                     for n, g in zip(self.top_names, global_top)]
        stored = self.load_state(WEIGHTS_STATE)
        start_phase = stored is None
        weights = ([torch.ones_like(g) for g in global_top] if stored is None
                   else [torch.as_tensor(w, dtype=g.dtype, device=g.device) for w, g in zip(stored, global_top)])
        train = self.data.train
        n = len(train)
        m = max(1, int(n * self.cfg.fedala_rand_percent / 100))
        idx = torch.randperm(n, generator=generator)[:m].to(train.x.device)
        weights, self.ala_epochs, _ = learn_ala_weights(
            self.model, self.top_names, local_top, global_top, weights, train.x[idx], train.y[idx],
            batch_size=self.cfg.batch_size, eta=self.cfg.fedala_eta, start_phase=start_phase,
            threshold=self.cfg.fedala_threshold, num_pre_loss=self.cfg.fedala_num_pre_loss,
            max_epochs=self.cfg.fedala_max_start_epochs)
        with torch.no_grad():
            for name, value in zip(self.top_names, ala_combine(local_top, global_top, weights)):
                params[name].copy_(value)
        self.save_state(WEIGHTS_STATE, [w.detach().cpu().numpy() for w in weights])

    def train(self, generator: torch.Generator) -> float:
        """ALA (skipped at the first participation), then plain local SGD on the cross-entropy."""
        local = self.load_state(LOCAL_STATE)
        if local is not None:
            self.adaptive_local_aggregation(local, generator)
        return super().train(generator)

    def state_digest(self) -> str:
        """Digest of the model's arrays (the local model) and the saved ALA weights."""
        return arrays_digest(get_arrays(self.model, "all") + (self.load_state(WEIGHTS_STATE) or []))

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Upload the trained local model; save it as Theta_i."""
        upload, n, metrics = super().fit(parameters, config)
        self.save_state(LOCAL_STATE, get_arrays(self.model, "all"))
        metrics["state_digest"] = self.state_digest()
        metrics["ala_epochs"] = int(self.ala_epochs)
        return upload, n, metrics

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Accuracy of the local model Theta_i (Theta^t before the first participation)."""
        local = self.load_state(LOCAL_STATE)
        if local is not None:
            set_arrays(self.model, local, "all", source=f"client {self.partition_id}: saved local model")
            self.evaluated_digest = self.state_digest()
        acc, loss = evaluate(self.model, self.data.test.x, self.data.test.y)
        return acc, loss, {}
