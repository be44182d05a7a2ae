"""FedPer (Arivazhagan et al., arXiv:1912.00818): base layers (backbone) are shared and averaged;
personalization layers (the head) stay on each client. There is no global head, hence no global
accuracy; the method is judged by personalized macro accuracy."""

from fedpers.core.wire import BACKBONE_ONLY
from strategies.base import FedPersStrategy


class FedPerStrategy(FedPersStrategy):
    """Backbone-only broadcast and aggregation."""

    contract = BACKBONE_ONLY
    has_global_model = False
