"""Server checkpoint and resume.

After every finished round the strategy (``FedPersStrategy.state_dict``) is written to
``<checkpoint_dir>/server_checkpoint.npz`` atomically (``fedpers.state_store.atomic_save_npz``): the
global model's ``state_dict`` (all parameters and buffers), the method's own server state
(``extra_state``), the round, the history of round records, byte totals, the last-fit state digests, the
elapsed wall time and torch's global RNG state. Client sampling and all training are seeded per round
(``seed``, round), so nothing else is needed to continue.

``resume: true`` makes ``fedpers.app.server_fn`` load the checkpoint into the strategy, rewrite
``metrics.jsonl`` with the finished rounds and start Flower's round loop at the next round
(:class:`ResumableServer`). A checkpoint of another experiment (different config fingerprint) is refused
with a clear error.
"""

from __future__ import annotations

import os
import timeit
from logging import INFO
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.common.logger import log
from flwr.server import Server
from flwr.server.history import History

from fedpers.errors import FedpersError
from fedpers.state_store import FORMAT_VERSION, MECHANICS_KEYS, atomic_save_npz, config_fingerprint, load_npz

CHECKPOINT_FILE = "server_checkpoint.npz"
MODEL_PREFIX = "model/"
EXTRA_PREFIX = "extra/"


def checkpoint_path(checkpoint_dir: str | os.PathLike) -> Path:
    return Path(checkpoint_dir) / CHECKPOINT_FILE


def save_checkpoint(checkpoint_dir: str | os.PathLike, state: Mapping[str, Any],
                    config: Mapping[str, Any]) -> Path:
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


def load_checkpoint(checkpoint_dir: str | os.PathLike, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
    from fedpers.results import _clean  # NaN/Inf -> null, numpy scalars -> Python

    return _clean(value)


class ResumableServer(Server):
    """Flower's legacy ``Server`` whose round loop starts at ``start_round`` (1 = a fresh run).

    ``Server.fit`` always counts from round 1; this copy of its loop differs only in the first round.
    """

    def __init__(self, *, start_round: int = 1, **kwargs: Any):
        super().__init__(**kwargs)
        self.start_round = int(start_round)

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:  # noqa: D102
        history = History()
        log(INFO, "[INIT] resuming at round %s of %s", self.start_round, num_rounds)
        self.parameters = self._get_initial_parameters(server_round=0, timeout=timeout)
        start_time = timeit.default_timer()
        for current_round in range(self.start_round, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s]", current_round)
            res_fit = self.fit_round(server_round=current_round, timeout=timeout)
            if res_fit is not None:
                parameters_prime, fit_metrics, _ = res_fit
                if parameters_prime:
                    self.parameters = parameters_prime
                history.add_metrics_distributed_fit(server_round=current_round, metrics=fit_metrics)
            res_cen = self.strategy.evaluate(current_round, parameters=self.parameters)
            if res_cen is not None:
                history.add_loss_centralized(server_round=current_round, loss=res_cen[0])
                history.add_metrics_centralized(server_round=current_round, metrics=res_cen[1])
            res_fed = self.evaluate_round(server_round=current_round, timeout=timeout)
            if res_fed is not None and res_fed[0] is not None:
                history.add_loss_distributed(server_round=current_round, loss=res_fed[0])
                history.add_metrics_distributed(server_round=current_round, metrics=res_fed[1])
        return history, timeit.default_timer() - start_time
