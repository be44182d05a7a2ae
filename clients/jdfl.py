"""JDFL client side, as a wrapper over any global optimizer's NumPyClient (see strategies/jdfl.py for the
round structure); :func:`with_jdfl` composes :class:`JDFLClientMixin` with the method's class, so the
optimizer's own loss terms, state and uploads are untouched and only the task loss changes.

* Discovery message (config ``jdfl_phase=discovery``): load theta^0, train ``jdfl_discovery_epochs`` (E0)
  epochs of plain cross-entropy SGD (lr = ``lr``, batch ``jdfl_discovery_batch`` or ``batch_size``) and
  return the update theta^{E0} - theta^0 on the layer subset ``jdfl_layers`` (Sec. 4.2, 5.5). No state
  is kept.
* Training: the head is expanded to the broadcast's M x C shape before the broadcast is loaded; the task
  loss is ``KL(t || softmax(f(x)))`` (Sec. 4.4) with t graded / hard (the pseudo-domain mass row sent by
  the server in ``jdfl_row``) or randomized (a pseudo-domain drawn per sample, mass ``jdfl_phi``).
* Evaluation: class-only accuracy (argmax joint index mod C) on the client's own test split.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedpers.core import seeds
from fedpers.algorithms.jdfl import (DISCOVERY_BROADCAST, DISCOVERY_UPLOAD, class_only_predictions, random_targets,
                                     soft_target_loss, targets_from_domain_row)
from fedpers.core.errors import ClientUpdateError
from fedpers.core.federation import get_federation
from fedpers.core.models import expand_head, get_arrays, layer_subset_names, parameter_names, set_arrays
from fedpers.core.seeds import derived_seed
from fedpers.core.training import predict_logits, seed_everything, sgd, train_epochs
from fedpers.core.wire import (JDFL_ROW, MODEL_SECTION, SectionError, float_row_of, join_sections, server_round_of,
                          split_sections)


class JDFLClientMixin:
    """Discovery updates, expanded head, joint-label task loss, class-only evaluation."""

    @property
    def num_classes(self) -> int:
        """C (the dataset's classes)."""
        return get_federation(self.cfg).num_classes

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Discovery message, or a training round with this client's targets."""
        server_round = server_round_of(config)
        if config.get("jdfl_phase") == "discovery":
            return self.discovery_fit(parameters, config, server_round)
        self.jdfl_row = torch.tensor(float_row_of(config, JDFL_ROW, default=(1.0,)))
        self.jdfl_generator = torch.Generator().manual_seed(
            derived_seed(self.cfg.seed, server_round, self.partition_id, seeds.JDFL_RANDOM_TARGETS))
        return super().fit(parameters, config)

    def discovery_fit(self, parameters: list[np.ndarray], config: dict[str, Any], server_round: int):
        """Phase 1 (Sec. 4.2): E0 epochs of CE SGD from theta^0; the update on the layer subset."""
        cfg = self.cfg
        try:
            theta0 = split_sections(list(parameters), config, DISCOVERY_BROADCAST)[MODEL_SECTION]
        except SectionError as exc:
            raise ClientUpdateError(f"client {self.partition_id}: discovery broadcast: {exc}") from None
        set_arrays(self.model, theta0, "all", source=f"client {self.partition_id}: discovery broadcast")
        names = layer_subset_names(self.model, cfg.jdfl_layers)
        before = {k: v.detach().clone() for k, v in self.model.state_dict().items() if k in names}
        generator = seed_everything(cfg.seed, server_round, self.partition_id, seeds.JDFL_DISCOVERY)
        opt = sgd(self.model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay)
        train = self.data.train
        loss = train_epochs(self.model, train.x, train.y, epochs=cfg.jdfl_discovery_epochs,
                            batch_size=cfg.jdfl_discovery_batch or cfg.batch_size, optimizer=opt,
                            batch_loss=lambda x, y: F.cross_entropy(self.model(x), y), generator=generator,
                            drop_last=cfg.drop_last_batch)
        state = self.model.state_dict()
        update, counts = join_sections({"discovery_update": [(state[k] - before[k]).detach().cpu().numpy()
                                                             for k in names]}, DISCOVERY_UPLOAD)
        return update, len(train), {"partition_id": self.partition_id, "train_loss": float(loss), **counts}

    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Grow the head to the broadcast's M x C outputs, then the optimizer's own prepare."""
        index = parameter_names(self.model, "all").index("head.weight")
        rows = int(np.shape(parameters[index])[0]) if len(parameters) > index else 0
        if rows and rows != self.model.head.out_features and rows % self.num_classes == 0:
            expand_head(self.model, rows)
            if getattr(self, "persistent_part", None):
                self._initial_personal = get_arrays(self.model, self.persistent_part)
        super().prepare(parameters)

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Sec. 4.4: KL(t || softmax(logits)) with graded / hard / randomized joint targets."""
        c = self.num_classes
        m = logits.shape[1] // c
        if self.cfg.jdfl == "random":
            t = random_targets(y, m, self.cfg.jdfl_phi, c, getattr(self, "jdfl_generator", None))
        else:
            row = getattr(self, "jdfl_row", torch.ones(1))
            if row.numel() != m:  # no row for this head (e.g. M = 1)
                row = torch.ones(1) if m == 1 else torch.full((m,), 1.0 / m)
            t = targets_from_domain_row(y, row.to(logits.dtype), c)
        return soft_target_loss(logits, t.to(logits.device))

    def evaluate_personalized(self, generator: torch.Generator) -> tuple[float, float, dict[str, float]]:
        """Class-only accuracy of the received (global) model on this client's test split."""
        from fedpers.algorithms.jdfl import marginal_class_log_probs

        test = self.data.test
        logits = predict_logits(self.model, test.x)
        acc = (class_only_predictions(logits, self.num_classes) == test.y).float().mean().item()
        loss = F.nll_loss(marginal_class_log_probs(logits, self.num_classes), test.y).item()
        return acc, loss, {}


@functools.lru_cache(maxsize=None)
def with_jdfl(client_cls: type) -> type:
    """``client_cls`` with JDFL: a subclass of both (JDFL hooks first in the MRO)."""
    return type(f"JDFL{client_cls.__name__}", (JDFLClientMixin, client_cls),
                {"__module__": __name__, "__doc__": f"JDFL over {client_cls.__name__}."})
