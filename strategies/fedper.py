"""FedPer (Arivazhagan et al., arXiv:1912.00818): base layers (backbone) are shared and averaged;
personalization layers (the head) stay on each client. There is no global head, hence no global
accuracy; the method is judged by personalized macro accuracy."""

from strategies.base import FedPersStrategy


class FedPerStrategy(FedPersStrategy):
    """Backbone-only broadcast and aggregation."""

    download_part = "backbone"
    upload_part = "backbone"
    has_global_model = False
