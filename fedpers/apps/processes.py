"""The process tree under a process: find it, signal it.

Ray's local cluster (GCS, raylet, dashboard, workers) and a loopback deployment's SuperLink/SuperNodes
are all descendants of the command that started them, so a command that must end at once can end
everything it started by walking ``/proc``. Elsewhere (no ``/proc``) the tree is empty and only the
callers' own handles are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterable

from fedpers.apps.supernode_start import descendants  # noqa: F401  (also this module's API)


def signal_pids(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``; one that has gone already (or is not ours) is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stat_field(pid: int, index: int) -> str | None:
    """Field ``index`` of ``/proc/PID/stat`` after the command name (0: the state), or None once it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """When ``pid`` started (``/proc/PID/stat`` field 22, in clock ticks since boot), or None once it is gone:
    a PID and its start time name one process, even after the PID is reused."""
    return _stat_field(pid, 19)


def process_state(pid: int) -> str | None:
    """``pid``'s state letter (``/proc/PID/stat`` field 3: R, S, Z, ...), or None once it is gone."""
    return _stat_field(pid, 0)


def own_tree() -> dict[int, str | None]:
    """Every live descendant of this process with its start time: what :func:`kill_own_tree` ends later
    even if it has left the tree by then (Ray's workers outlive their raylet, stopped first by
    ``ray.shutdown``, and are then children of init, no longer ours by ``/proc``)."""
    return {pid: start_time(pid) for pid in descendants(os.getpid())}


def kill_own_tree(known: dict[int, str | None] | None = None) -> None:
    """SIGKILL every descendant of this process (what it started and what those started), and each process
    of ``known`` (from :func:`own_tree`) that is still the same process."""
    pids = descendants(os.getpid())
    pids += [pid for pid, started in (known or {}).items()
             if pid not in pids and started is not None and start_time(pid) == started]
    signal_pids(pids, signal.SIGKILL)
