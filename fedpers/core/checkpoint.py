"""Server checkpoint and resume.

After every finished round the strategy (``FedPersStrategy.state_dict``) is written to
``<checkpoint_dir>/server_checkpoint.npz`` atomically (``fedpers.core.state_store.atomic_save_npz``): the
global model's ``state_dict`` (all parameters and buffers), the method's own server state
(``extra_state``), the round, the history of round records, byte totals, the last-fit state digests, the
elapsed wall time and torch's global RNG state. Client sampling and all training are seeded per round
(``seed``, round), so nothing else is needed to continue.

``resume: true`` makes ``fedpers.apps.server_app.server_fn`` load the checkpoint into the strategy, rewrite
``metrics.jsonl`` with the finished rounds and start Flower's round loop at the next round
(:class:`fedpers.apps.flower_internals.ResumableServer`). A checkpoint of another experiment (different config fingerprint) is refused
with a clear error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from fedpers.core.errors import FedpersError
from fedpers.core.schema import Config
from fedpers.core.state_store import FORMAT_VERSION, MECHANICS_KEYS, atomic_save_npz, config_fingerprint, load_npz

CHECKPOINT_FILE = "server_checkpoint.npz"
MODEL_PREFIX = "model/"
EXTRA_PREFIX = "extra/"


def checkpoint_path(checkpoint_dir: str | os.PathLike) -> Path:
    return Path(checkpoint_dir) / CHECKPOINT_FILE


def save_checkpoint(checkpoint_dir: str | os.PathLike, state: Mapping[str, Any], config: Config) -> Path:
    """Write a strategy ``state_dict`` atomically; arrays go to the npz, the rest to its JSON metadata."""
    arrays: dict[str, np.ndarray] = {MODEL_PREFIX + k: np.asarray(v) for k, v in state["model"].items()}
    extra_json: dict[str, Any] = {}
    for name, value in (state.get("extra") or {}).items():
        if isinstance(value, np.ndarray):
            arrays[EXTRA_PREFIX + name] = value
        else:
            extra_json[name] = value
    if state.get("torch_rng") is not None:
        arrays["torch_rng"] = np.asarray(state["torch_rng"], dtype=np.uint8)
    meta = {k: v for k, v in state.items() if k not in ("model", "extra", "torch_rng")}
    meta.update(format=FORMAT_VERSION, extra_json=extra_json, fingerprint=config_fingerprint(config),
                config=dict(config))
    return atomic_save_npz(checkpoint_path(checkpoint_dir), arrays, _json_safe(meta))


def load_checkpoint(checkpoint_dir: str | os.PathLike, config: Config | None = None) -> dict[str, Any]:
    """The state written by :func:`save_checkpoint`; with ``config``, check it is the same experiment."""
    path = checkpoint_path(checkpoint_dir)
    if not path.is_file():
        raise FedpersError(f"resume: no checkpoint at {path}")
    try:
        arrays, meta = load_npz(path)
        int(meta["round"])
    except Exception as exc:  # truncated, not an npz, or not written by save_checkpoint
        raise FedpersError(f"resume: {path} is not a readable fedpers checkpoint ({type(exc).__name__}); "
                           "nothing was changed: remove it to start the run again") from None
    if config is not None and meta.get("fingerprint") != config_fingerprint(config):
        changed = sorted(k for k in config if k not in MECHANICS_KEYS and k in meta.get("config", {})
                         and meta["config"][k] != config[k])
        raise FedpersError(f"resume: {path} was written by a different experiment (changed keys: "
                           f"{', '.join(changed) or 'unknown'}); only rounds, out_dir and run mechanics may change")
    state = dict(meta)
    state["model"] = {k[len(MODEL_PREFIX):]: v for k, v in arrays.items() if k.startswith(MODEL_PREFIX)}
    extra: dict[str, Any] = dict(meta.get("extra_json", {}))
    extra.update({k[len(EXTRA_PREFIX):]: v for k, v in arrays.items() if k.startswith(EXTRA_PREFIX)})
    state["extra"] = extra
    state["torch_rng"] = arrays.get("torch_rng")
    return state


def _json_safe(value: Any) -> Any:
    from fedpers.core.results import _clean  # NaN/Inf -> null, numpy scalars -> Python

    return _clean(value)
