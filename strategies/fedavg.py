"""FedAvg (McMahan et al., AISTATS 2017): the whole model is broadcast, trained and averaged
(sample-weighted, Alg. 1 of the paper); evaluated as a global model."""

from fedpers.core.wire import WHOLE_MODEL
from strategies.base import FedPersStrategy


class FedAvgStrategy(FedPersStrategy):
    """Whole-model averaging."""

    contract = WHOLE_MODEL
    personalized_is_global = True  # every client evaluates the global model: read it off one evaluation
    metric = "global_acc"
