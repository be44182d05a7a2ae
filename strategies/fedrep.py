"""FedRep (Collins et al., ICML 2021, Algorithm 1), server side.

Only the shared representation (the body = ``backbone``) is broadcast, uploaded and averaged
(sample-weighted); every client keeps its own head, trained locally with the body frozen
(``clients/fedrep.py``). As FedPer there is no global head, hence no global accuracy: judged by
personalized macro accuracy (the global body with each client's own head).
"""

from fedpers.core.wire import BACKBONE_ONLY
from strategies.base import FedPersStrategy


class FedRepStrategy(FedPersStrategy):
    """Body-only broadcast and aggregation; heads stay local."""

    contract = BACKBONE_ONLY
    has_global_model = False
