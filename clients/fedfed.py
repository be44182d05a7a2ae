"""FedFed client (Yang et al., NeurIPS 2023), a simplified but real feature distillation.

Every client owns a small feature-distillation module G (:class:`fedpers.algorithms.fedfed.FeatureDistiller`,
a convolutional VAE; seeded per client) kept in ``context.state`` (``fedfed_distiller``), never sent.

* **Distillation rounds** (``server_round <= D``, see ``strategies/fedfed.py``): for ``local_epochs``
  epochs the client minimises :func:`fedpers.algorithms.fedfed.fedfed_distill_loss` jointly over G (Adam,
  ``fedfed_vae_lr``) and the received global classifier model f (SGD, ``lr``):
  reconstruction + KL of G (the performance-robust part x_r = G(x) as an information bottleneck) plus the
  cross-entropy of f on the noisy performance-sensitive parts x - G(x) + N(0, sigma^2) (two noise
  levels, ``fedfed_noise_std1/2``) and on x. f is uploaded and averaged as FedAvg.
* **Sharing, once**: in its first fit from round D on, a client whose G was trained uploads, next to f,
  ``x_s + N(0, sigma_1^2)`` and ``x_s + N(0, sigma_2^2)`` for all its train inputs (x_s = x - G(x), G in
  eval mode) with their labels (:func:`fedpers.algorithms.fedfed.sensitive_features`); a flag in its state
  stops it from sharing again. A client never sampled during distillation never shares (its G is
  untrained, so x - G(x) would be close to its raw data).
* **Training rounds** (``> D``): cross-entropy SGD on its local data together with the shared samples it
  received this round; f is uploaded (FedAvg). Evaluated with the received global model.

Simplifications (ours, documented): G is per client and local (FedFed trains the VAE federatedly, i.e.
averaged like the model); one joint pass per epoch (FedFed's code also runs a mixup classifier pass and a
VAE-only pass each epoch); G's Adam state is not kept between rounds; the distillation rounds are part of
the ``rounds`` budget; labels travel as float32 (every array in fedpers is float).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from clients.base import FedPersClient
from fedpers.core import seeds
from fedpers.algorithms import fedfed
from fedpers.algorithms.fedfed import (FeatureDistiller, fedfed_distill_loss, sensitive_features,
                                       distill_rounds, empty_shared)
from fedpers.core.errors import ClientUpdateError
from fedpers.core.federation import device_layout, get_federation
from fedpers.core.models import get_arrays
from fedpers.core.seeds import derived_seed
from fedpers.core.training import minibatches, sgd
from fedpers.core.wire import MODEL_SECTION, server_round_of

DISTILLER_STATE = "fedfed_distiller"
SHARED_FLAG = "fedfed_shared"


class FedFedClient(FedPersClient):
    """FedAvg client with a local feature distiller and the global shared features."""

    contract = fedfed.CONTRACT

    def __init__(self, cfg, context):
        super().__init__(cfg, context)
        fed = get_federation(cfg)
        self.input_shape = tuple(fed.input_shape)
        self.num_classes = fed.num_classes
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(cfg.seed, self.partition_id, seeds.FEDFED_DISTILLER_INIT))
            self.distiller = FeatureDistiller(self.input_shape[0]).to(self.device)
        self._round = 0
        self.shared_x = torch.zeros((0, *self.input_shape), device=self.device)
        self.shared_y = torch.zeros(0, dtype=torch.long, device=self.device)

    # --- state of the distiller ------------------------------------------------------------------------
    def load_distiller(self) -> bool:
        """Restore G from the client state; False when it was never trained."""
        stored = self.load_state(DISTILLER_STATE)
        if stored is None:
            return False
        keys = list(self.distiller.state_dict())
        if len(stored) != len(keys):
            raise ClientUpdateError(f"client {self.partition_id}: saved distiller has {len(stored)} arrays")
        self.distiller.load_state_dict({k: torch.as_tensor(a, device=self.device) for k, a in zip(keys, stored)})
        return True

    def save_distiller(self) -> None:
        """Save G in the client state."""
        self.save_state(DISTILLER_STATE, [v.detach().cpu().numpy() for v in self.distiller.state_dict().values()])

    # --- round mechanics -------------------------------------------------------------------------------
    def prepare(self, parameters: list[np.ndarray]) -> None:
        """Check the broadcast's shared samples (one features and one labels array), then load the model."""
        features, labels = self.received["shared_features"], self.received["shared_labels"]
        if len(features) != 1 or len(labels) != 1:
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: expected one shared-features "
                                    f"and one shared-labels array, got {len(features)} and {len(labels)}")
        xs, ys = np.asarray(features[0]), np.asarray(labels[0])
        if (tuple(xs.shape[1:]) != self.input_shape or ys.ndim != 1 or len(ys) != len(xs)
                or not np.isfinite(xs).all() or not np.isfinite(ys).all()
                or (len(ys) and (ys.min() < 0 or ys.max() >= self.num_classes))):
            raise ClientUpdateError(f"client {self.partition_id}: server broadcast: malformed shared features "
                                    f"{xs.shape} / labels {ys.shape}")
        # in the layout of the client's own images: torch.cat of two layouts falls back to channels-first
        self.shared_x = device_layout(torch.as_tensor(xs, dtype=torch.float32, device=self.device))
        self.shared_y = torch.as_tensor(ys, device=self.device).round().long()
        super().prepare(parameters)

    def distilling(self) -> bool:
        """Is this a feature-distillation round?"""
        return self._round <= distill_rounds(self.cfg)

    def train_distill(self, generator: torch.Generator) -> float:
        """Joint training of G and f on :func:`fedfed_distill_loss`; G is saved."""
        self.load_distiller()
        cfg = self.cfg
        opt_f = sgd(self.model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay)
        opt_g = torch.optim.Adam(self.distiller.parameters(), lr=cfg.fedfed_vae_lr)
        stds = [cfg.fedfed_noise_std1, cfg.fedfed_noise_std2]
        train = self.data.train
        self.model.train()
        self.distiller.train()
        total, count = 0.0, 0
        for _ in range(cfg.local_epochs):
            for idx in minibatches(len(train), cfg.batch_size, generator, train.x.device,
                                   drop_last=cfg.drop_last_batch):
                if len(idx) < 2:
                    continue
                opt_f.zero_grad(set_to_none=True)
                opt_g.zero_grad(set_to_none=True)
                loss = fedfed_distill_loss(self.model, self.distiller, train.x[idx], train.y[idx], noise_stds=stds,
                                           w_rec=cfg.fedfed_rec, w_kl=cfg.fedfed_kl, w_ce=cfg.fedfed_ce,
                                           w_x_ce=cfg.fedfed_x_ce)
                loss.backward()
                opt_f.step()
                opt_g.step()
                total += float(loss.detach()) * len(idx)
                count += len(idx)
        self.save_distiller()
        return total / max(count, 1)

    def training_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Local train data together with the shared samples received this round."""
        train = self.data.train
        if len(self.shared_y) == 0:
            return train.x, train.y
        return torch.cat([train.x, self.shared_x]), torch.cat([train.y, self.shared_y])

    def train(self, generator: torch.Generator) -> float:
        """Distillation rounds: :meth:`train_distill`; afterwards CE on local + shared samples."""
        if self.distilling():
            return self.train_distill(generator)
        x, y = self.training_set()
        return self.sgd_epochs(x, y, lambda xb, yb: F.cross_entropy(self.model(xb), yb), generator)

    def shared_upload(self) -> list[np.ndarray]:
        """The noisy sensitive features (two noise levels) and labels, once, from round D on; else empty."""
        d = distill_rounds(self.cfg)
        if d == 0 or self._round < d or self.load_state(SHARED_FLAG) is not None or not self.load_distiller():
            return empty_shared(self.input_shape)
        train = self.data.train
        gen = torch.Generator().manual_seed(
            derived_seed(self.cfg.seed, self._round, self.partition_id, seeds.FEDFED_FEATURE_NOISE))
        xs = torch.cat([sensitive_features(self.distiller, train.x, s, gen)
                        for s in (self.cfg.fedfed_noise_std1, self.cfg.fedfed_noise_std2)])
        ys = torch.cat([train.y, train.y])
        self.save_state(SHARED_FLAG, [np.ones(1, np.float32)])
        return [xs.cpu().numpy().astype(np.float32), ys.cpu().numpy().astype(np.float32)]

    def upload_content(self) -> dict[str, list[np.ndarray]]:
        """The model, then the shared features and labels (empty unless this is the client's share)."""
        xs, ys = self.shared_upload()
        return {MODEL_SECTION: get_arrays(self.model, "all"), "shared_features": [xs], "shared_labels": [ys]}

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """As the base; reports how many shared samples were trained on."""
        self._round = server_round_of(config)
        upload, n, metrics = super().fit(parameters, config)
        metrics["shared_samples_used"] = int(len(self.shared_y)) if not self.distilling() else 0
        metrics["shared_samples_sent"] = int(len(upload[-1]))  # the shared_labels section, last (fedfed.CONTRACT)
        return upload, n, metrics
