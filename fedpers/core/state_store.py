"""On-disk state of a deployed run: a client's persistent arrays and the server's checkpoint.

Both are one ``.npz`` file each, written atomically (a temp file in the same directory, fsynced, then
``os.replace``), so a process killed mid-write leaves the previous version intact. A file holds named
float/int arrays plus one JSON metadata object (stored as the uint8 array ``__meta__``).

Layout of a client state directory (``client_state_dir``, or the SuperNode's node-config ``state-dir``)::

    <dir>/partition-<pid>/<name>.npz            arrays saved by FedPersClient.save_state(name, arrays)
    <dir>/partition-<pid>/<name>@previous.npz   the version before it, from an earlier round

Every version records the round it was saved in. A run resumed from the server checkpoint of round r
starts round r + 1 again; a client that had already saved state in that lost round must start from the
version before it, which ``load(name, max_round=r)`` returns.

A file's metadata carries a fingerprint of the experiment (the config without the keys that only steer
how a run is executed), so state from another experiment in the same directory is ignored, not loaded.
numpy + json (+ the config's schema, for its defaults): no Flower, no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from fedpers.core.schema import Config

META_KEY = "__meta__"
FORMAT_VERSION = 1

# Keys that change how/where a run executes, not what is learned: they do not enter the fingerprint,
# so e.g. extending `rounds` or moving `out_dir` keeps the saved state usable.
MECHANICS_KEYS = frozenset({
    "out_dir", "rounds", "eval_every", "device", "client_cpus", "client_gpus",
    "client_state_dir", "client_state_spill", "checkpoint_dir", "resume", "overwrite", "round_timeout",
    "tensorboard", "wandb", "wandb_project", "reply_poll_interval", "evaluate_with_next_fit",
    "client_layout", "pool_nodes",
})


def state_dir_of(node_config: Mapping[str, Any], client_state_dir: str) -> str:
    """The client state directory of a node: its node-config ``state-dir``, else the run's
    ``client_state_dir``; '' = none (state in memory only)."""
    return str(node_config.get("state-dir", "") or client_state_dir)


@contextlib.contextmanager
def run_state_dir(config: Config) -> Iterator[Config]:
    """``config`` as an engine runs it (the Ray simulation and the in-process engine alike): with
    ``client_state_spill`` and no ``client_state_dir``, the clients' state lives in a new directory
    ``<out_dir>/client_state-XXXXXXXX`` made for this run and removed when it ends; any other config is
    run as it is. The directory is never one that existed before: no earlier state is loaded and nothing
    the user had is removed."""
    if not config.client_state_spill or config.client_state_dir:
        yield config
        return
    Path(config.out_dir).mkdir(parents=True, exist_ok=True)
    spill_dir = Path(tempfile.mkdtemp(prefix="client_state-", dir=config.out_dir))
    try:
        yield config.replace(client_state_dir=str(spill_dir))
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)


def config_fingerprint(config: Config) -> str:
    """Short hash of the experiment-defining part of a config: the keys the run reads that differ from the
    defaults of its schema, less the run mechanics (so keys added to the schema later, with defaults, change
    nothing). A key whose default has changed is compared with its first default, so that state saved before
    the change is found by the runs that pin the values it was made with, and refused to the others; another
    method's keys are not read, so that a change of its defaults, or a study pinning them for every row,
    leaves this run's state usable."""
    reference = config.fingerprint_defaults()
    unread = MECHANICS_KEYS | config.unread_keys()
    items = {k: v for k, v in sorted(config.to_dict().items())
             if k not in unread and (k not in reference or v != reference[k])}
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:16]


def atomic_save_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                    meta: Mapping[str, Any] | None = None, *, mode: int | None = None) -> Path:
    """Write ``arrays`` (and ``meta``, when given) to ``path`` atomically (temp file + fsync + os.replace);
    the file is private (0600) unless ``mode`` says otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if META_KEY in arrays:
        raise ValueError(f"array name {META_KEY!r} is reserved")
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    if meta is not None:
        payload[META_KEY] = np.frombuffer(json.dumps(dict(meta), default=_json_default).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def load_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a file written by :func:`atomic_save_npz`."""
    with np.load(Path(path), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != META_KEY}
        meta = json.loads(bytes(data[META_KEY]).decode()) if META_KEY in data.files else {}
    return arrays, meta


class ClientStateStore:
    """A SuperNode's persistent client state: one file per saved name, under ``partition-<pid>/``."""

    def __init__(self, root: str | os.PathLike, partition_id: int, fingerprint: str):
        self.dir = Path(root) / f"partition-{int(partition_id)}"
        self.partition_id = int(partition_id)
        self.fingerprint = fingerprint

    def path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad state name {name!r}")
        return self.dir / f"{name}.npz"

    def previous_path(self, name: str) -> Path:
        """The version of ``name`` saved before the current one (kept so a resumed round can start again
        from the state that preceded it)."""
        return self.path(name).with_name(f"{name}@previous.npz")

    def saved_round(self, name: str) -> int | None:
        """The round the current version of ``name`` was saved in (None: absent or saved without one)."""
        meta = self._meta(self.path(name))
        return None if meta is None else meta.get("round")

    def save(self, name: str, arrays: Sequence[np.ndarray], *, server_round: int | None = None,
             **meta: Any) -> Path:
        """Save a list of arrays under ``name`` (atomically), as saved in ``server_round``.

        The current version moves to ``name@previous`` when it is from an earlier round; a version from
        the same or a later round belongs to a round that is being run again after a resume and is
        simply replaced."""
        named = {f"a{i:04d}": np.asarray(a) for i, a in enumerate(arrays)}
        info = {"format": FORMAT_VERSION, "name": name, "partition_id": self.partition_id,
                "fingerprint": self.fingerprint, "count": len(named), "round": server_round, **meta}
        current = self.path(name)
        old_round = self.saved_round(name) if current.is_file() else None
        if server_round is not None and old_round is not None and old_round < server_round:
            os.replace(current, self.previous_path(name))
        return atomic_save_npz(current, named, info)

    def load(self, name: str, max_round: float = float("inf")) -> list[np.ndarray] | None:
        """The newest arrays saved under ``name`` in a round <= ``max_round``; None when there are none or
        they were saved by another experiment/partition."""
        for path in (self.path(name), self.previous_path(name)):
            meta = self._meta(path)
            if meta is None:
                continue
            if meta.get("fingerprint") != self.fingerprint or meta.get("partition_id") != self.partition_id:
                return None
            saved = meta.get("round")
            if saved is None or saved <= max_round:
                arrays, _ = load_npz(path)
                return [arrays[f"a{i:04d}"] for i in range(int(meta.get("count", len(arrays))))]
        return None

    @staticmethod
    def _meta(path: Path) -> dict[str, Any] | None:
        """Only the metadata of a state file (an npz member is read on access, the arrays are not)."""
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as data:
            return json.loads(bytes(data[META_KEY]).decode()) if META_KEY in data.files else {}

    def names(self) -> list[str]:
        """Names with a saved file."""
        return sorted(p.stem for p in self.dir.glob("*.npz") if "@" not in p.stem) if self.dir.is_dir() else []


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
