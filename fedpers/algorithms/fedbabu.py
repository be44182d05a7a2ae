"""FedBABU (Oh et al., ICLR 2022): fine-tuning a copy of the whole model before evaluation.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from fedpers.training import sgd, train_epochs
from fedpers.schema import Key, non_negative


# FedBABU's own config keys: its section of the config table, which fedpers.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedbabu_finetune_epochs", int, 5,
        "FedBABU whole-model fine-tuning epochs on train data before each evaluation (paper: 5)", non_negative),
)


def fine_tune_copy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float,
                   batch_size: int, generator: torch.Generator, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> nn.Module:
    """FedBABU (Oh et al., ICLR 2022, Sec. 4 "personalization"): a deep copy of ``model`` whose whole
    network (body and head) is fine-tuned by ``epochs`` epochs of cross-entropy SGD on the client's train
    data; ``model`` itself is not changed."""
    tuned = copy.deepcopy(model)
    for p in tuned.parameters():
        p.requires_grad_(True)
    if epochs > 0 and len(x) > 0:
        opt = sgd(tuned.parameters(), lr, momentum, weight_decay)
        train_epochs(tuned, x, y, epochs=epochs, batch_size=batch_size, optimizer=opt,
                     batch_loss=lambda xb, yb: F.cross_entropy(tuned(xb), yb), generator=generator)
    return tuned
