"""FedProx (Li et al., MLSys 2020): server side identical to FedAvg; the proximal term lives in the
client's objective (``mu`` is the config key shared with pFedKDH)."""

from strategies.fedavg import FedAvgStrategy


class FedProxStrategy(FedAvgStrategy):
    """FedAvg aggregation; clients add ``mu/2 ||w - w_g||^2``."""
