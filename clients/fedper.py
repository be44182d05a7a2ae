"""FedPer client: trains backbone and its persistent private head jointly with cross-entropy,
uploads only the backbone."""

from clients.base import FedPersClient
from fedpers.core.wire import BACKBONE_ONLY


class FedPerClient(FedPersClient):
    """Backbone shared, head persistent and private."""

    contract = BACKBONE_ONLY
    persistent_part = "head"
