"""FedBABU (Oh et al., ICLR 2022): fine-tuning a copy of the whole model before evaluation.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedpers.core.training import sgd, train_epochs
from fedpers.core.schema import Key, parses, non_negative


# FedBABU's own config keys: its section of the config table, which fedpers.registry.config assembles
# from the core keys and each registered method's KEYS (help texts say paper, code or ours).
KEYS: tuple[Key, ...] = (
    Key("fedbabu_finetune_epochs", int, 5,
        "FedBABU whole-model fine-tuning epochs on train data before each evaluation (paper: 5)", non_negative),
    Key("fedbabu_finetune_also", str, "",
        "FedBABU: other fine-tuning epoch counts also evaluated from the same fine-tuning run, comma-separated "
        "(e.g. '1,3,10'), recorded as personalized_macro_acc_ft<e>; each is what that "
        "fedbabu_finetune_epochs gives (ours, for sensitivity studies)",
        lambda text: parses(parse_epoch_list)(text)),
)


def fine_tune_copy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float,
                   batch_size: int, generator: torch.Generator, drop_last: bool, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> nn.Module:
    """FedBABU (Oh et al., ICLR 2022, Sec. 4 "personalization"): a deep copy of ``model`` whose whole
    network (body and head) is fine-tuned by ``epochs`` epochs of cross-entropy SGD on the client's train
    data; ``model`` itself is not changed."""
    return fine_tune_copies(model, x, y, epochs=[epochs], lr=lr, batch_size=batch_size, generator=generator,
                            drop_last=drop_last, momentum=momentum, weight_decay=weight_decay)[epochs]


def fine_tune_copies(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: Sequence[int], lr: float,
                     batch_size: int, generator: torch.Generator, drop_last: bool, momentum: float = 0.0,
                     weight_decay: float = 0.0,
                     on_epoch: Callable[[int, nn.Module, float], None] | None = None) -> dict[int, nn.Module]:
    """FedBABU's fine-tuning (:func:`fine_tune_copy`) at several epoch counts from one run: ``{e: the copy
    after e epochs}`` for every ``e`` in ``epochs``. Epochs run one at a time with one optimizer and one
    generator, so the copy after e epochs is exactly the one an e-epoch fine-tuning gives. ``on_epoch(e,
    model, mean_loss)``, when given, sees the model after each epoch e (diagnostics: it must not change it)."""
    tuned = copy.deepcopy(model)
    for p in tuned.parameters():
        p.requires_grad_(True)
    wanted = set(epochs)
    copies: dict[int, nn.Module] = {0: copy.deepcopy(tuned)} if 0 in wanted else {}
    if max(wanted, default=0) > 0 and len(x) > 0:
        opt = sgd(tuned.parameters(), lr, momentum, weight_decay)
        for done in range(1, max(wanted) + 1):
            loss = train_epochs(tuned, x, y, epochs=1, batch_size=batch_size, optimizer=opt,
                                batch_loss=lambda xb, yb: F.cross_entropy(tuned(xb), yb), generator=generator,
                                drop_last=drop_last)
            if on_epoch is not None:
                on_epoch(done, tuned, loss)
            if done in wanted:
                copies[done] = copy.deepcopy(tuned) if done < max(wanted) else tuned
    for e in wanted:  # no data to fine-tune on: the model as it is
        copies.setdefault(e, copy.deepcopy(tuned))
    return copies


def parse_epoch_list(text: str) -> list[int]:
    """``fedbabu_finetune_also`` as epoch counts: ``'1,3,10'`` -> ``[1, 3, 10]``; ValueError names a bad token."""
    out = []
    for token in (t.strip() for t in text.split(",") if t.strip()):
        if not token.isdigit():
            raise ValueError(f"'{token}' is not an epoch count (e.g. 1,3,10)")
        out.append(int(token))
    return out
