"""FedBABU (Oh et al., ICLR 2022, Sec. 4), server side.

The head is randomly initialised identically on the server and every client (the seeded init of
:func:`fedpers.core.models.build_model`) and never trained during federated training, so only the body
(``backbone``) is broadcast, uploaded and averaged (sample-weighted); the server's head stays the initial
one. The global model (aggregated body + the fixed head) is evaluated centrally (``global_acc``); the
headline metric is the personalized macro accuracy after each client fine-tunes a copy of the whole model
on its train data (``clients/fedbabu.py``).
"""

from fedpers.core.wire import BACKBONE_ONLY
from strategies.base import FedPersStrategy


class FedBABUStrategy(FedPersStrategy):
    """Body-only broadcast and aggregation; the fixed random head is never sent (identical by seed)."""

    contract = BACKBONE_ONLY
    has_global_model = True
