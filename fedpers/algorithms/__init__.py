"""The math of every method, one module per method (named after it), as small functions of tensors and
arrays: no Flower, no config, no federation. ``strategies/`` and ``clients/`` wire these to a run.

Pieces two methods share live in their own module: :mod:`~fedpers.algorithms.prototypes` (FedProto,
FedProc) and :mod:`~fedpers.algorithms.server_state` (SCAFFOLD, FedDyn, FedDC). Loss terms several
methods use (distillation, proximal term) are :mod:`fedpers.core.losses`.
"""
