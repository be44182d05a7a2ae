"""FedALA (Zhang et al., AAAI 2023, Algorithm 1), server side.

The server is FedAvg: it broadcasts the whole global model and averages the uploaded local models
(sample-weighted). Adaptive local aggregation happens on the clients before local training
(``clients/fedala.py``): each client combines the global model with its old local model by learned
element-wise weights on the top ``fedala_layer_idx`` parameter tensors. The global model is evaluated
centrally (``global_acc``); the headline is the personalized macro accuracy of the clients' local models.
"""

from __future__ import annotations

from fedpers.core.errors import ConfigError
from fedpers.core.wire import WHOLE_MODEL
from strategies.base import FedPersStrategy


class FedALAStrategy(FedPersStrategy):
    """FedAvg aggregation; ALA lives on the clients."""

    contract = WHOLE_MODEL
    has_global_model = True

    def prepare_global_model(self) -> None:
        """Check, before any training, that the model has ``fedala_layer_idx`` parameter tensors."""
        count = len(list(self.model.parameters()))
        if self.cfg.fedala_layer_idx > count:
            raise ConfigError(f"config key 'fedala_layer_idx': {self.cfg.fedala_layer_idx} exceeds the "
                              f"model's {count} parameter tensors")
