#!/usr/bin/env python3
"""Start wrapper of a Flower SuperNode: retries Flower's "refused" exit, leaves no orphan behind.

    python -m fedpers.apps.supernode_start [--retry-for 150] [--bind-host-of NAME] -- flower-supernode ARGS...
    python /usr/local/bin/fedpers-supernode-start ...      (the SuperNode image: the same file, no fedpers)

Two gaps of Flower 1.42's ``flower-supernode`` that this closes:

* **Restart right after a kill.** The SuperLink keeps a killed node "online" until its heartbeats are
  missed (2 x 30 s, then the next sweep: 60-100 s), and until then it refuses the node's key: the new
  process exits with code 305 (``SUPERNODE_CONNECTION_ERROR``, "Failed to activate SuperNode"). The
  wrapper starts the SuperNode again after 1, 2, 4, 5, 5, ... s for up to ``--retry-for``
  seconds (default 150) while it exits that way; any other exit ends the wrapper with the same code.
  An unregistered key also exits 305 (Flower answers both alike), so it, too, is retried until the
  deadline: a key registered meanwhile is then taken.
* **No orphan ``flower-superexec``.** With subprocess isolation the SuperNode starts ``flower-superexec``
  (which starts ``flwr-clientapp``) and does not stop it when it is killed: the orphan kept serving the
  next SuperNode's Runtime API. The wrapper makes itself the child subreaper (``prctl``), so whatever
  the SuperNode started is re-parented to it, and when the SuperNode ends, or the wrapper is told to
  stop, it ends every remaining descendant (SIGTERM, SIGKILL after 3 s). The SuperNode gets
  ``PR_SET_PDEATHSIG``: if the wrapper itself is SIGKILLed, the SuperNode goes with it.

``--bind-host-of NAME`` replaces the SuperNode's ``--host`` (its Runtime API, which its ClientApp
runner uses) by the address ``NAME`` resolves to: in compose, an alias the SuperNode has on its own
``node-N`` network only, so the Runtime API is not reachable on the Fleet network it shares with the
other SuperNodes.

Standard library only: the SuperNode image has Flower but not fedpers.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REFUSED_EXIT = 305  # flwr.supercore.exit.ExitCode.SUPERNODE_CONNECTION_ERROR
REFUSED_MARKER = f"Exit Code: {REFUSED_EXIT}"  # flwr_exit's first line
ERROR_STATUS = 1  # flwr_exit ends every error with sys.exit(1): the 305 is only in its message
DEFAULT_RETRY_FOR = 150.0
MAX_DELAY = 5.0  # the SuperLink lets the node in 60-100 s after the kill: rejoin within 5 s of that
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def backoff_delays(retry_for: float, max_delay: float = MAX_DELAY) -> list[float]:
    """The waits between attempts: 1, 2, 4, ... s, at most ``max_delay`` each, adding up to no more than
    ``retry_for`` (the last one shortened to fit)."""
    delays: list[float] = []
    total, delay = 0.0, 1.0
    while total < retry_for:
        step = min(delay, max_delay, retry_for - total)
        delays.append(step)
        total += step
        delay *= 2
    return delays


def was_refused(status: int, output_tail: str) -> bool:
    """Whether an ended SuperNode was refused by the SuperLink (Flower's exit code 305): Flower's error
    status (1) and its own ``Exit Code: 305`` line in the last lines of output, both."""
    return status == ERROR_STATUS and REFUSED_MARKER in output_tail


def with_host(argv: list[str], host: str) -> list[str]:
    """``argv`` with its ``--host`` option (``--host X`` or ``--host=X``) set to ``host`` (added if absent)."""
    out, i, found = [], 0, False
    while i < len(argv):
        arg = argv[i]
        if arg == "--host" and i + 1 < len(argv):
            out += ["--host", host]
            i, found = i + 2, True
            continue
        if arg.startswith("--host="):
            out.append(f"--host={host}")
            found = True
        else:
            out.append(arg)
        i += 1
    return out if found else out + ["--host", host]


def _prctl(option: int, value: int) -> None:
    """Linux prctl; a no-op elsewhere (the wrapper still retries, it just cannot adopt orphans)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(pid: int) -> list[int]:
    """PIDs of every live (not zombie) descendant of ``pid``, parents before their children, from ``/proc``
    (empty where it is absent). Here, not in fedpers.apps.processes, which imports it: this file runs on
    its own in the SuperNode image, where fedpers is not installed."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _reap() -> None:
    """Collect every ended child (adopted orphans included), so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants(grace: float = 3.0) -> None:
    """SIGTERM every descendant of this process, SIGKILL what is left after ``grace`` seconds, reap."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = descendants(os.getpid())
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + (grace if sig == signal.SIGTERM else 1.0)
        while pids and time.monotonic() < end:
            _reap()
            pids = descendants(os.getpid())
            if pids:
                time.sleep(0.1)
    _reap()


class _Stop(Exception):
    """The wrapper was told to stop (SIGTERM / SIGINT)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_once(argv: list[str]) -> tuple[int, str]:
    """Run the SuperNode once, passing its output through; returns its exit status (128 + N when killed
    by signal N) and its last lines. Whatever it started is ended before this returns."""
    tail: list[str] = []
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL))

    def pump():
        # A thread, not the main loop: the SuperNode's flower-superexec inherits this pipe, so it reaches
        # EOF only once the orphan is gone, after the SuperNode itself ended.
        assert child.stdout is not None
        for raw in child.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            tail[:] = (tail + [raw.decode(errors="replace")])[-40:]

    def forward(signum, _frame):
        # The SuperNode stops (and deactivates itself at the SuperLink); its output still drains.
        stopping.append(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    stopping: list[int] = []
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = child.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        end_descendants()  # the orphaned flower-superexec / flwr-clientapp of a killed SuperNode
        reader.join(timeout=5)
    if stopping:
        raise _Stop(stopping[0])
    return (128 - status if status < 0 else status), "".join(tail)


def supervise(argv: list[str], retry_for: float = DEFAULT_RETRY_FOR, sleep=time.sleep) -> int:
    """Run the SuperNode, again after each refusal (back-off, for up to ``retry_for`` s); its exit code."""
    delays = backoff_delays(retry_for)
    attempt = 0
    while True:
        status, tail = run_once(argv)
        if not was_refused(status, tail):
            return status
        if attempt >= len(delays):
            print(f"fedpers-supernode-start: the SuperLink still refuses this SuperNode (exit {REFUSED_EXIT}) "
                  f"after {retry_for:.0f} s of retries: giving up", flush=True)
            return ERROR_STATUS
        delay = delays[attempt]
        attempt += 1
        print(f"fedpers-supernode-start: the SuperLink refused this SuperNode (exit {REFUSED_EXIT}: it may "
              f"still list the previous process of this node as online); attempt {attempt + 1} in {delay:.0f} s",
              flush=True)
        sleep(delay)


def resolve(name: str, timeout: float = 30.0) -> str:
    """The IPv4 address ``name`` resolves to, waiting up to ``timeout`` s for it (a container's DNS entry
    may come a moment after the container)."""
    end = time.monotonic() + timeout
    while True:
        try:
            return socket.gethostbyname(name)
        except OSError:
            if time.monotonic() > end:
                raise SystemExit(f"fedpers-supernode-start: --bind-host-of {name}: the name does not resolve")
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Parse the wrapper's options, then supervise the SuperNode command after ``--``."""
    p = argparse.ArgumentParser(prog="fedpers-supernode-start", description=__doc__.split("\n\n")[0])
    p.add_argument("--retry-for", type=float, default=DEFAULT_RETRY_FOR,
                   help="seconds to keep restarting a SuperNode the SuperLink refuses (exit 305); 0: never")
    p.add_argument("--bind-host-of", metavar="NAME",
                   help="set the SuperNode's --host to the address NAME resolves to")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- flower-supernode ARGS...")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no SuperNode command given (after --)")
    if args.retry_for < 0:
        p.error(f"--retry-for must be >= 0, got {args.retry_for}")
    if args.bind_host_of:
        command = with_host(command, resolve(args.bind_host_of))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    stop = {signal.SIGTERM: 143, signal.SIGINT: 130}

    def early(signum, _frame):
        raise _Stop(signum)

    for s in stop:
        signal.signal(s, early)  # during a back-off wait; run_once forwards to the SuperNode instead
    try:
        return supervise(command, args.retry_for)
    except _Stop as exc:
        end_descendants()
        return stop.get(exc.signum, 128 + exc.signum)
    except FileNotFoundError:
        print(f"fedpers-supernode-start: command not found: {command[0]}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
