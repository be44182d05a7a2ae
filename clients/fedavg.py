"""FedAvg client: local cross-entropy SGD on the whole model."""

from clients.base import FedPersClient
from fedpers.core.wire import WHOLE_MODEL


class FedAvgClient(FedPersClient):
    """Plain local SGD; uploads the whole model."""

    contract = WHOLE_MODEL
