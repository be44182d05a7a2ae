"""Shared test fixtures: small configs on scikit-learn digits, and where the real data lives."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from torch import nn

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or skip where it is absent."""
    if not (SHARED_DATA / "mnist.npz").is_file():
        pytest.skip(f"real datasets not present at {SHARED_DATA}")
    return SHARED_DATA


def make_context(pid: int, num: int) -> Context:
    """A Flower Context of the node holding partition ``pid`` of ``num`` (fresh, empty state)."""
    return Context(run_id=1, node_id=100 + pid, node_config={"partition-id": pid, "num-partitions": num},
                   state=RecordDict(), run_config={})


def tiny_overrides(**extra):
    """A fast digits experiment (3 clients, 2 rounds, 1 epoch)."""
    base = dict(dataset="digits", num_clients=3, fraction_fit=1.0, rounds=2, local_epochs=1, batch_size=32,
                lr=0.05, recal_lr=0.05, ea_lr=0.05, aux_size=100, alpha=1.0, feature_dim=64, ea_steps=3,
                device="cpu")
    base.update(extra)
    return base


def pfedkdh_broadcast(cfg):
    """A pFedKDH strategy on ``cfg``'s federation and its first broadcast (the arrays every client gets)."""
    from fedpers.core.federation import get_federation
    from strategies.pfedkdh import PFedKDHStrategy

    strategy = PFedKDHStrategy(cfg, get_federation(cfg))
    return strategy, strategy.download_arrays()


def arrays_equal(a, b) -> bool:
    """Same number of arrays, each exactly equal."""
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


class TinyNet(nn.Module):
    """backbone + head, like the foundation's models, small enough for exact checks."""

    def __init__(self, d_in=6, d_feat=5, classes=3, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.backbone = nn.Sequential(nn.Linear(d_in, d_feat), nn.ReLU())
        self.head = nn.Linear(d_feat, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def toy_data(n=64, d_in=6, classes=3, seed=0):
    """Random (x, y) of a small classification problem."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)
