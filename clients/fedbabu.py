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
from fedpers.algorithms.fedbabu import fine_tune_copies, parse_epoch_list
from fedpers.core.models import backbone_parameters, head_parameters
from fedpers.core.training import evaluate, sgd, train_epochs
from fedpers.core.wire import BACKBONE_ONLY


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
                            drop_last=self.cfg.drop_last_batch, batch_loss=self.batch_loss)

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Fine-tune a copy of the whole model on train data, then test it; also the initial accuracy and
        the accuracy after each count of ``fedbabu_finetune_also`` epochs (``acc_ft<e>``)."""
        test = self.data.test
        initial_acc, _ = evaluate(self.model, test.x, test.y)
        main, also = self.cfg.fedbabu_finetune_epochs, parse_epoch_list(self.cfg.fedbabu_finetune_also)
        tuned = self.fine_tuned([main, *also], generator)
        acc, loss = evaluate(tuned[main], test.x, test.y)
        extra = {"acc_initial": initial_acc}
        extra.update({f"acc_ft{e}": evaluate(tuned[e], test.x, test.y)[0] for e in also})
        return acc, loss, extra

    def fine_tuned(self, epochs: list[int], generator: torch.Generator) -> dict[int, torch.nn.Module]:
        """The fine-tuned copies after each count of ``epochs``, fine-tuned once per message: the validation
        pass (same seed, same train data) gets the very copies the test pass used."""
        if getattr(self, "_tuned", None) is None:
            train = self.data.train
            self._tuned = fine_tune_copies(self.model, train.x, train.y, epochs=epochs, lr=self.cfg.lr,
                                           batch_size=self.cfg.batch_size, generator=generator,
                                           drop_last=self.cfg.drop_last_batch, momentum=self.cfg.momentum,
                                           weight_decay=self.cfg.weight_decay)
        return self._tuned
