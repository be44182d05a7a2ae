"""FedPer client: trains backbone and its persistent private head jointly with cross-entropy,
uploads only the backbone."""

from clients.base import FedPersClient


class FedPerClient(FedPersClient):
    """Backbone shared, head persistent and private."""

    download_part = "backbone"
    upload_part = "backbone"
    persistent_part = "head"
