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


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid``, parents before their children (from ``/proc``; empty
    where ``/proc`` is absent)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def signal_pids(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``; one that has gone already (or is not ours) is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_own_tree() -> None:
    """SIGKILL every descendant of this process (what it started and what those started)."""
    signal_pids(descendants(os.getpid()), signal.SIGKILL)
