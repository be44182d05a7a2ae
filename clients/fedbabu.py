"""FedBABU client (Oh et al., ICLR 2022, Sec. 4).

Training: the client loads the global body; its head is the seeded random initial head, identical on
every client and the server, and is never trained (its parameters are frozen and not in the optimizer);
``local_epochs`` epochs of SGD update the body only, which is uploaded. No per-client state is kept.

Evaluation: a *copy* of the whole model (global body + fixed head) is fine-tuned for
``fedbabu_finetune_epochs`` epochs (paper: 5) of SGD on the client's train data (learning rate ``lr``;
ours, the paper fine-tunes with the training learning rate), then tested
(:func:`fedpers.algorithms.fedbabu.fine_tune_copy`). The fine-tuned copy is thrown away: nothing it learns is
persisted or sent. The accuracy before fine-tuning is reported as ``acc_initial``
(``personalized_macro_acc_initial`` in the results; the paper's "initial accuracy").
"""

from __future__ import annotations

import torch

from clients.base import FedPersClient
from fedpers.algorithms.fedbabu import fine_tune_copy
from fedpers.models import backbone_parameters, head_parameters
from fedpers.training import evaluate, sgd, train_epochs
from fedpers.wire import BACKBONE_ONLY


class FedBABUClient(FedPersClient):
    """Body-only training with a frozen random head; fine-tuning at evaluation."""

    contract = BACKBONE_ONLY

    def train(self, generator: torch.Generator) -> float:
        """FedBABU body update: SGD on the body with the head frozen."""
        for p in head_parameters(self.model):
            p.requires_grad_(False)
        opt = sgd(backbone_parameters(self.model), self.cfg.lr, self.cfg.momentum, self.cfg.weight_decay)
        train = self.data.train
        return train_epochs(self.model, train.x, train.y, epochs=self.cfg.local_epochs,
                            batch_size=self.cfg.batch_size, optimizer=opt, generator=generator,
                            batch_loss=self.batch_loss)

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Fine-tune a copy of the whole model on train data, then test it; also the initial accuracy."""
        test, train = self.data.test, self.data.train
        initial_acc, _ = evaluate(self.model, test.x, test.y)
        tuned = fine_tune_copy(self.model, train.x, train.y, epochs=self.cfg.fedbabu_finetune_epochs,
                               lr=self.cfg.lr, batch_size=self.cfg.batch_size, generator=generator,
                               momentum=self.cfg.momentum, weight_decay=self.cfg.weight_decay)
        acc, loss = evaluate(tuned, test.x, test.y)
        return acc, loss, {"acc_initial": initial_acc}
