"""A run's output directory: checked before anything is written, and held by one run at a time.

* :func:`check_out_dir` refuses, with one line, an ``out_dir`` that is not a directory this process can write
  (:func:`writable_dir`), and one that already holds a run (``summary.json``, or a ``metrics.jsonl`` with at
  least one round) unless the user asked to replace it (``overwrite``) or to continue it (``resume`` with a
  checkpoint to continue from).
* :func:`removed_if_refused` takes back the empty directories a command made for a path before it was
  refused: a refused command leaves the file system as it found it.
* :class:`RunLock` is an exclusive ``flock`` on ``<out_dir>/.fedpers.lock`` for the whole run, so a second
  run started on the same directory is refused instead of interleaving its rounds with the first's.

No Flower, no torch: the CLI calls this before the engine starts, the ServerApp again before its results
writer opens a file (``flwr run`` reaches the ServerApp without the CLI).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from fedpers.core.errors import ConfigError, cut

LOCK_FILE = ".fedpers.lock"
RESULT_FILES = ("summary.json", "metrics.jsonl")
# How an error line names ``out_dir``: the CLI's --out sets it, a YAML file or ``flwr run`` as the key.
OUT_DIR_LABEL = "--out (config key 'out_dir')"


def writable_dir(path: str | os.PathLike, label: str) -> Path:
    """``path`` as a directory this process can write, created with its missing parents if absent. Writing
    is proven by making and removing a file there: permission bits say nothing for root, a read-only mount
    or ``/proc``. Anything else is one ConfigError line that starts with ``label`` (the option or key that
    named the path) and says what the path is: a file, a dangling symlink (to what), a symlink loop, a name
    too long for the file system."""
    path = Path(path)
    broken = _broken_symlink(path)
    if broken:
        raise ConfigError(f"{label}: {broken}")
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{label}: {cut(str(path))} is a file, not a directory")
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fedpers-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{label}: {cut(str(path))} cannot be written ({exc.strerror or exc})") from None
    return path


def _broken_symlink(path: Path) -> str | None:
    """What is wrong with the first symlink on ``path`` (itself or a folder above it) that leads nowhere: it
    dangles (and to what) or loops; None when none does. ``mkdir`` reports either as "File exists"."""
    absolute = path.absolute()
    for current in [*reversed(absolute.parents[:-1]), absolute]:
        try:
            if not stat.S_ISLNK(os.lstat(current).st_mode):
                continue
            os.stat(current)
        except FileNotFoundError:
            if not current.is_symlink():
                return None  # the path stops existing here: it is created from here on
            what = f"is a dangling symlink to {cut(os.readlink(current))}"
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                return None  # another problem (a file on the way, a name too long): the write says which
            what = "is a symlink loop"
        else:
            continue
        if current == absolute:
            return f"{cut(str(path))} {what}"
        return f"{cut(str(path))} cannot be made: {cut(str(current))} {what}"
    return None


def first_missing(path: str | os.PathLike) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (``path`` itself when only it is missing),
    None when it exists: what a ``mkdir -p`` of ``path`` would create."""
    absolute = Path(path).absolute()
    if os.path.lexists(absolute):
        return None
    missing = absolute
    for parent in absolute.parents:
        if os.path.lexists(parent):
            return missing
        missing = parent
    return None


@contextlib.contextmanager
def removed_if_refused(*paths: str | os.PathLike) -> Iterator[None]:
    """Around the checks of a command that may make ``paths`` (empty ones are skipped): if the block raises,
    the directories it made for them are removed again. Only what did not exist before the block is looked
    at, and only empty directories are removed (``rmdir``), deepest first: a file written there, or anything
    that was there before, stays."""
    made = {root for root in map(first_missing, filter(None, map(str, paths))) if root is not None}
    try:
        yield
    except BaseException:
        for root in made:
            if os.path.islink(root):  # not made by the block: never followed
                continue
            for folder, _, _ in os.walk(root, topdown=False):  # nothing when it was not made
                with contextlib.suppress(OSError):  # not empty (a file stays), or gone already
                    os.rmdir(folder)
        raise


def holds_a_run(out_dir: str | os.PathLike) -> bool:
    """True when ``out_dir`` has a ``summary.json`` or a ``metrics.jsonl`` with at least one round."""
    out = Path(out_dir)
    metrics = out / "metrics.jsonl"
    return (out / "summary.json").exists() or (metrics.is_file() and metrics.stat().st_size > 0)


def check_out_dir(out_dir: str | os.PathLike, *, overwrite: bool = False, resume: bool = False,
                  checkpoint_file: str | os.PathLike | None = None) -> Path:
    """``out_dir`` as a Path after the checks above (it is created if absent; nothing in it is changed)."""
    out = writable_dir(out_dir, OUT_DIR_LABEL)
    for name in RESULT_FILES:
        if (out / name).exists() and not (out / name).is_file():
            raise ConfigError(f"{OUT_DIR_LABEL}: {out / name} is not a file")
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
