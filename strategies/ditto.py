"""Ditto (Li et al., ICML 2021, Algorithm 1), server side.

The global model w is trained exactly as FedAvg: the whole model is broadcast, each sampled client runs
local SGD on F_k from w^t and uploads w_k, and the server takes the sample-weighted average. The personal
models v_k (Ditto objective, Eq. 2: ``min_v F_k(v) + lambda/2 ||v - w^t||^2``) never leave the clients
(``clients/ditto.py``). The global model is evaluated centrally (``global_acc``); the headline metric is
the personalized macro accuracy of the v_k.
"""

from fedpers.core.wire import WHOLE_MODEL
from strategies.base import FedPersStrategy


class DittoStrategy(FedPersStrategy):
    """FedAvg on the global model; personal models stay on the clients."""

    contract = WHOLE_MODEL
    has_global_model = True
