"""Shared test fixtures: small configs on scikit-learn digits, and where the real data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


def tiny_overrides(**extra):
    """A fast digits experiment (3 clients, 2 rounds, 1 epoch)."""
    base = dict(dataset="digits", num_clients=3, fraction_fit=1.0, rounds=2, local_epochs=1, batch_size=32,
                lr=0.05, recal_lr=0.05, ea_lr=0.05, aux_size=100, alpha=1.0, feature_dim=64, ea_steps=3,
                device="cpu")
    base.update(extra)
    return base
