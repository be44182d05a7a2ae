"""FedAvg client: local cross-entropy SGD on the whole model."""

from clients.base import FedPersClient


class FedAvgClient(FedPersClient):
    """Plain local SGD; uploads the whole model."""

    download_part = "all"
    upload_part = "all"
