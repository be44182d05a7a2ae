"""MOON server (Li et al., CVPR 2021): plain FedAvg aggregation (Alg. 1); the method lives in the
client's model-contrastive loss (clients/moon.py)."""

from strategies.fedavg import FedAvgStrategy


class MoonStrategy(FedAvgStrategy):
    """Whole-model sample-weighted averaging."""
