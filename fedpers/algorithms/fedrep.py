"""FedRep (Collins et al., ICML 2021): its config keys. FedRep has no arithmetic of its own beyond the
shared training loops (Alg. 1: ``fedrep_head_epochs`` epochs on the head with the body frozen, then
``local_epochs`` on the body with the head frozen; :func:`fedpers.core.training.train_head_on_features` and
:func:`fedpers.core.training.train_epochs`), so this module holds only what the method declares.
"""

from __future__ import annotations

from fedpers.core.schema import Key, non_negative


# FedRep's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedrep_head_epochs", int, 10,
        "FedRep head epochs per round with the body frozen (paper: 10); body epochs = local_epochs", non_negative),
)
