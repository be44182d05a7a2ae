"""Models and the one place that splits a model into backbone and head.

Every fedpers model has two child modules: ``backbone`` (input -> feature vector) and ``head``
(feature vector -> class logits). :func:`parameter_names` is the only code that knows which state
entries belong to which part; everything else asks it (or :func:`get_arrays` / :func:`set_arrays`).
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import torch
from torch import nn

from fedpers.errors import ClientUpdateError

Part = Literal["backbone", "head", "all"]
HEAD_MODULE = "head"


class SimpleCNN(nn.Module):
    """The pFedKDH paper's CNN: two conv + ReLU + max-pool blocks, dropout, flatten, FC projection
    (= backbone) and a linear head.

    Channel widths (32, 64), 5x5 kernels and the 512-wide projection follow PFLlib's ``FedAvgCNN``,
    which the paper's baselines come from (ours: the paper gives no sizes). Convolutions use padding 2
    so that inputs as small as 8x8 (scikit-learn digits) work; the flatten size follows the input.
    """

    def __init__(self, in_channels: int, image_size: tuple[int, int], num_classes: int,
                 feature_dim: int = 512, dropout: float = 0.25):
        super().__init__()
        h, w = image_size
        flat = 64 * (h // 4) * (w // 4)
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(dropout), nn.Flatten(),
            nn.Linear(flat, feature_dim), nn.ReLU(),
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.head(self.backbone(x))


def build_model(input_shape: Sequence[int], num_classes: int, *, feature_dim: int = 512,
                dropout: float = 0.25, seed: int | None = None) -> SimpleCNN:
    """Build the CNN for images of ``input_shape`` = (C, H, W); with ``seed`` the init is reproducible,
    so server and every client start from identical weights."""
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise ValueError(f"images must be at least 4x4, got {h}x{w}")
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return SimpleCNN(c, (h, w), num_classes, feature_dim, dropout)
    return SimpleCNN(c, (h, w), num_classes, feature_dim, dropout)


def parameter_names(model: nn.Module, part: Part) -> list[str]:
    """State-dict keys of ``part`` in a stable order: the backbone/head split by name."""
    keys = list(model.state_dict().keys())
    if part == "all":
        return keys
    in_head = [k.split(".", 1)[0] == HEAD_MODULE for k in keys]
    return [k for k, h in zip(keys, in_head) if h == (part == "head")]


def get_arrays(model: nn.Module, part: Part) -> list[np.ndarray]:
    """Copies of ``part``'s tensors as numpy arrays (what a client uploads / the server broadcasts)."""
    state = model.state_dict()
    return [state[k].detach().cpu().numpy().copy() for k in parameter_names(model, part)]


def set_arrays(model: nn.Module, arrays: Sequence[np.ndarray], part: Part, *, source: str = "update") -> None:
    """Load ``arrays`` into ``part`` of ``model``, after checking count, shapes and finiteness."""
    names = parameter_names(model, part)
    if len(arrays) != len(names):
        raise ClientUpdateError(f"{source}: expected {len(names)} {part} arrays, got {len(arrays)}")
    state = model.state_dict()
    new = {}
    for name, arr in zip(names, arrays):
        arr = np.asarray(arr)
        if tuple(arr.shape) != tuple(state[name].shape):
            raise ClientUpdateError(
                f"{source}: array '{name}' has shape {tuple(arr.shape)}, model expects {tuple(state[name].shape)}"
            )
        if not np.issubdtype(arr.dtype, np.number) or not np.isfinite(arr).all():
            raise ClientUpdateError(f"{source}: array '{name}' is not finite numeric data")
        new[name] = torch.as_tensor(arr, dtype=state[name].dtype)
    model.load_state_dict(new, strict=False)


def array_shapes(model: nn.Module, part: Part) -> list[tuple[int, ...]]:
    """Shapes of ``part``'s arrays, in the order of :func:`parameter_names`."""
    state = model.state_dict()
    return [tuple(state[k].shape) for k in parameter_names(model, part)]


def head_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Trainable parameters of the head (for head-only optimisation)."""
    return list(getattr(model, HEAD_MODULE).parameters())


def backbone_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Trainable parameters of the backbone, in :func:`parameter_names` order."""
    names = set(parameter_names(model, "backbone"))
    return [p for n, p in model.named_parameters() if n in names]
