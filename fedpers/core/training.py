"""Training and evaluation loops over in-memory tensors (no DataLoader: the data already sits on the
device, so batches are index slices of one tensor)."""

from __future__ import annotations

import copy
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from fedpers.core.seeds import derived_seed


BatchLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Inference batch: measured on MNIST with the FedAvgCNN on 2 CPU cores, batches of 64-256 run 1.7x faster
# than 1,024 (benchmarks/results/round_profile.md); 128 is near the best for 1 and 2 threads.
EVAL_BATCH = 128


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from fedpers.core.errors import ConfigError

        raise ConfigError("config key 'device': cuda requested but no CUDA device is available")
    return torch.device(name)


def seed_everything(*parts: int) -> torch.Generator:
    """Seed torch's global RNG (dropout) from ``parts`` and return a CPU generator for shuffling."""
    seed = derived_seed(*parts)
    torch.manual_seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def sgd(params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> torch.optim.SGD:
    """The clients' optimizer: SGD with the config's lr, momentum and weight decay."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def minibatches(n: int, batch_size: int, generator: torch.Generator, device: torch.device, *,
                drop_last: bool) -> Iterator[torch.Tensor]:
    """Shuffled index batches of one epoch over ``range(n)``: all of it, the last batch possibly smaller;
    with ``drop_last`` (the config's ``drop_last_batch``) only the full batches, as PFLlib's train loader
    (``DataLoader(drop_last=True)``), unless ``n < batch_size``, when the one batch of all ``n`` stays
    (ours: PFLlib would train such a client not at all). The permutation is the same either way, so the
    full batches are too."""
    order = torch.randperm(n, generator=generator).to(device)
    for start in range(0, batches_per_epoch(n, batch_size, drop_last=drop_last) * batch_size, batch_size):
        yield order[start:start + batch_size]


def batches_per_epoch(n: int, batch_size: int, *, drop_last: bool) -> int:
    """How many batches :func:`minibatches` yields for ``n`` samples."""
    return n // batch_size if drop_last and n >= batch_size else -(-n // batch_size)


def train_epochs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                 optimizer: torch.optim.Optimizer, batch_loss: BatchLoss, generator: torch.Generator,
                 drop_last: bool) -> float:
    """Run ``epochs`` passes of mini-batch SGD minimising ``batch_loss(xb, yb)`` (batches as
    :func:`minibatches` with ``drop_last``); return the mean loss."""
    model.train()
    total, count = 0.0, 0
    for _ in range(epochs):
        for idx in minibatches(len(x), batch_size, generator, x.device, drop_last=drop_last):
            optimizer.zero_grad(set_to_none=True)
            loss = batch_loss(x[idx], y[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
    return total / max(count, 1)


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits of ``model`` in eval mode, in batches."""
    model.eval()
    return torch.cat([model(x[i:i + EVAL_BATCH]) for i in range(0, max(len(x), 1), EVAL_BATCH)])


@torch.no_grad()
def backbone_features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Backbone outputs b_theta(x) in eval mode (the head's inputs)."""
    model.eval()
    return torch.cat([model.backbone(x[i:i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])


@torch.no_grad()
def accuracy_and_loss(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Top-1 accuracy (fraction) and mean cross-entropy of ``logits`` against ``y``."""
    if len(y) == 0:
        return float("nan"), float("nan")
    acc = (logits.argmax(dim=1) == y).float().mean().item()
    return acc, F.cross_entropy(logits, y).item()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, loss) of ``model`` on (x, y)."""
    return accuracy_and_loss(predict_logits(model, x), y)


def step_batches(n: int, batch_size: int, steps: int, generator: torch.Generator,
                 device: torch.device, *, drop_last: bool) -> list[torch.Tensor]:
    """Index batches of exactly ``steps`` mini-batch steps, cycling through shuffled epochs of ``range(n)``
    (each epoch a fresh permutation, as :func:`minibatches` draws it, with ``drop_last``)."""
    batches: list[torch.Tensor] = []
    while n > 0 and len(batches) < steps:
        for idx in minibatches(n, batch_size, generator, device, drop_last=drop_last):
            if len(batches) >= steps:
                break
            batches.append(idx)
    return batches


def head_sgd(head: nn.Module, batches, lr: float, after_step: Callable[[int], None] | None = None) -> float:
    """Cross-entropy SGD on ``head`` over ``(features, labels)`` batches; returns the mean loss.
    ``after_step(k)`` is called after the k-th step (1-based). Shared by FedRep's and FedBABU's head phases
    (:func:`train_head_on_features`) and pFedKDH's recalibration and EA copies."""
    opt = sgd(head.parameters(), lr)
    head.train()
    total, count = 0.0, 0
    for done, (feats, labels) in enumerate(batches, 1):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(head(feats), labels)
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(labels)
        count += len(labels)
        if after_step is not None:
            after_step(done)
    return total / max(count, 1)


def train_head_on_features(head: nn.Module, features: torch.Tensor, y: torch.Tensor, *, lr: float,
                           batch_size: int, generator: torch.Generator, drop_last: bool, epochs: int = 0,
                           steps: int = 0) -> float:
    """Cross-entropy SGD on the head alone, with the backbone's features precomputed (the backbone is
    frozen, so its features are constant): ``epochs`` full passes (pFedKDH Eq. 5) or exactly ``steps``
    mini-batch steps, cycling through the data (the EA variant). Returns the mean loss."""
    if len(features) == 0:
        return float("nan")
    total_steps = steps if steps > 0 else epochs * batches_per_epoch(len(features), batch_size, drop_last=drop_last)
    batches = step_batches(len(features), batch_size, total_steps, generator, features.device,
                           drop_last=drop_last)
    return head_sgd(head, ((features[idx], y[idx]) for idx in batches), lr)


@torch.no_grad()
def eval_mode_features(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` in eval mode (no dropout), then ``module``'s train/eval mode restored: features
    comparable with a frozen teacher's, taken in the middle of training."""
    was_training = module.training
    module.eval()
    try:
        return module(x)
    finally:
        module.train(was_training)


# Layers whose output depends on train/eval mode. Only dropout may be skipped to get eval-mode features out of
# a training-mode pass; a backbone with any other of these (batch norm) takes the second pass.
_MODE_DEPENDENT = (nn.modules.batchnorm._NormBase, nn.modules.dropout._DropoutNd)


def features_in_both_modes(backbone: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(backbone(x)`` in the current mode, with gradient; the same features in eval mode, without)``.

    FedEAGD's drift compares the student's eval-mode features with its teacher's while the student trains
    (so identical extractors have drift 0). For a ``Sequential`` backbone whose only mode-dependent layers
    are dropout, eval mode differs from training mode only by skipping them: the layers before the first
    dropout (the convolutions, most of the cost) run once and both outputs continue from there. Otherwise
    the eval-mode features take a second pass (:func:`eval_mode_features`)."""
    layers = list(backbone) if isinstance(backbone, nn.Sequential) else []
    if not layers or any(isinstance(m, _MODE_DEPENDENT) and not isinstance(m, nn.modules.dropout._DropoutNd)
                         for m in backbone.modules()):
        return backbone(x), eval_mode_features(backbone, x)
    cut = next((i for i, layer in enumerate(layers) if isinstance(layer, nn.modules.dropout._DropoutNd)), len(layers))
    trunk = backbone[:cut](x)
    z = backbone[cut:](trunk)
    with torch.no_grad():
        z_eval = trunk.detach()
        for layer in layers[cut:]:
            if not isinstance(layer, nn.modules.dropout._DropoutNd):
                z_eval = layer(z_eval)
    return z, z_eval


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in eval mode with gradients switched off (teachers)."""
    teacher = copy.deepcopy(model)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher
