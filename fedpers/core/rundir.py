"""A run's output directory: checked before anything is written, and held by one run at a time.

* :func:`check_out_dir` refuses, with one line, an ``out_dir`` that is a file or cannot be written, and one
  that already holds a run (``summary.json``, or a ``metrics.jsonl`` with at least one round) unless the
  user asked to replace it (``overwrite``) or to continue it (``resume`` with a checkpoint to continue from).
* :class:`RunLock` is an exclusive ``flock`` on ``<out_dir>/.fedpers.lock`` for the whole run, so a second
  run started on the same directory is refused instead of interleaving its rounds with the first's.

No Flower, no torch: the CLI calls this before the engine starts, the ServerApp again before its results
writer opens a file (``flwr run`` reaches the ServerApp without the CLI).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

from fedpers.core.errors import ConfigError

LOCK_FILE = ".fedpers.lock"
RESULT_FILES = ("summary.json", "metrics.jsonl")


def holds_a_run(out_dir: str | os.PathLike) -> bool:
    """True when ``out_dir`` has a ``summary.json`` or a ``metrics.jsonl`` with at least one round."""
    out = Path(out_dir)
    metrics = out / "metrics.jsonl"
    return (out / "summary.json").exists() or (metrics.is_file() and metrics.stat().st_size > 0)


def check_out_dir(out_dir: str | os.PathLike, *, overwrite: bool = False, resume: bool = False,
                  checkpoint_file: str | os.PathLike | None = None) -> Path:
    """``out_dir`` as a Path after the checks above (it is created if absent; nothing in it is changed)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"config key 'out_dir': {out} is a file, not a directory")
    try:  # a real probe: permission bits say nothing for root, a read-only mount or a file on the path
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ConfigError(f"config key 'out_dir': {out} cannot be written ({exc.strerror or exc})") from None
    for name in RESULT_FILES:
        if (out / name).exists() and not (out / name).is_file():
            raise ConfigError(f"config key 'out_dir': {out / name} is not a file")
    if not holds_a_run(out) or overwrite:
        return out
    if resume and checkpoint_file is not None and Path(checkpoint_file).is_file():
        return out
    if resume:
        raise ConfigError(f"{out} holds a run but there is no checkpoint to resume it from"
                          f"{f' ({checkpoint_file})' if checkpoint_file else ' (set checkpoint_dir)'}: "
                          "choose another --out, or pass --overwrite to replace it")
    raise ConfigError(f"{out} already holds a run (summary.json / metrics.jsonl): choose another --out, "
                      "pass --overwrite to replace it, or --set resume=true to continue it")


def live_run_holder(out_dir: str | os.PathLike) -> str | None:
    """The pid a live run holding ``<out_dir>/.fedpers.lock`` wrote there, or None when no run holds it (a
    lock file a finished or killed run left behind is free: the kernel dropped its ``flock``)."""
    path = Path(out_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 32).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)  # also drops the probe's own shared lock
    return None


class RunLock:
    """Exclusive lock on ``<out_dir>/.fedpers.lock`` held while a run writes there (released on exit, also
    when the process dies: the kernel drops an ``flock`` with its last file descriptor)."""

    def __init__(self, out_dir: str | os.PathLike):
        self.path = Path(out_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(f"{self.path.parent} is in use by another fedpers run (pid {holder}): "
                              "wait for it or choose another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
