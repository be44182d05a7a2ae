#!/usr/bin/env python3
"""Start wrapper of a Flower SuperNode: retries what a retry can cure, says in one line why it gives up, and
leaves no orphan behind.

    python -m fedpers.apps.supernode_start [--retry-for 150] [--bind-host-of NAME] [--wait-after-giving-up] \
        -- flower-supernode ARGS...
    python /usr/local/bin/fedpers-supernode-start ...      (the SuperNode image: the same file, no fedpers)

Gaps of Flower 1.42's ``flower-supernode`` that this closes:

* **Why it stopped.** Flower ends a SuperNode the SuperLink does not take with exit code 305
  (``SUPERNODE_CONNECTION_ERROR``: ``Exit Code: 305`` in its output, process status 1) whatever the cause;
  the wrapper reads the cause in that output (:func:`diagnose`):

  - ``[code: 2004] Failed to activate SuperNode``: the SuperLink refused the node's key. Right after a kill
    it still lists the node's previous process as online (until its heartbeats are missed: 2 x 30 s, then
    the next sweep, 60-100 s); an unregistered key, or a key another live SuperNode uses, gets the same
    answer, and Flower's reply does not tell them apart. Retried after 1, 2, 4, 5, 5, ... s for up to
    ``--retry-for`` seconds (default 150, past the 100 s a restart needs); still refused then, the key is
    not registered or in use elsewhere: the wrapper gives up.
  - ``[SSL: CERTIFICATE_VERIFY_FAILED] ...``: the SuperLink's certificate does not verify (expired, not yet
    valid, signed by another CA, issued for another name). No retry cures it: the wrapper gives up at once,
    naming the cause (an expired certificate as such, with the renewal command).
  - any other 305 (the connection failed in another way): retried as a refusal is, then given up.
  - another of Flower's exit codes (302: a bad key file, ...): given up at once with Flower's line.
  - exit 0 before the node joined (no ``SuperNode ID:`` line) and without being told to stop: Flower ends a
    SuperNode that way when the SuperLink answers its signed requests with 401, which before joining means
    the signature's time is outside the SuperLink's window (the node's clock more than 5 s ahead or 305 s
    behind): given up, naming the clock.

  Giving up prints one line, ``fedpers-supernode-start: giving up: <cause>``, and exits 78 (EX_CONFIG:
  starting the same command again gives the same answer; systemd's ``RestartPreventExitStatus=78`` stops
  there). Docker's restart policies have no such status (``unless-stopped`` restarts whatever the code), so
  under compose ``--wait-after-giving-up`` keeps the wrapper alive instead, holding nothing, until the
  container is stopped; it writes the cause to :data:`GAVE_UP_FILE`, which the container's health check
  reads (``docker compose ps``: unhealthy). Any other end of the SuperNode (killed, crashed, stopped) ends
  the wrapper with the SuperNode's status, and the restart policy decides.
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
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REFUSED_EXIT = 305  # flwr.supercore.exit.ExitCode.SUPERNODE_CONNECTION_ERROR
ERROR_STATUS = 1  # flwr_exit ends every error with sys.exit(1): the code is only in its message
GAVE_UP_STATUS = 78  # sysexits' EX_CONFIG: the same command would get the same answer
JOINED_MARKER = "SuperNode ID:"  # Flower logs it once the SuperLink has activated the node
GAVE_UP_FILE = Path(tempfile.gettempdir()) / "fedpers-supernode-gave-up"  # --wait-after-giving-up: the cause
DEFAULT_RETRY_FOR = 150.0
MAX_DELAY = 5.0  # the SuperLink lets the node in 60-100 s after the kill: rejoin within 5 s of that
RENEW_HINT = ("renew them with `fedpers deploy certs --renew --out DIR` and restart the proxy, the SuperLink "
              "and the SuperNodes (deploy/README.md, \"Certificates\")")
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


@dataclass(frozen=True)
class Ending:
    """Why a SuperNode ended, as its output says, and whether starting it again can change that."""

    cause: str
    retry: bool
    # what the cause is once the retries are spent ({seconds}: how long they took); None: the same cause
    after_retries: str | None = None


def flower_exit(output_tail: str) -> tuple[int, str] | None:
    """Flower's exit code and its message (the line that says why; for a failed connection, the line after
    "Failed to initialize the connection to the SuperLink.") from the last ``Exit Code: N`` block of
    ``output_tail``; None when there is none."""
    matches = list(re.finditer(r"Exit Code: (\d+)\n", output_tail))
    if not matches:
        return None
    lines = [line.strip() for line in output_tail[matches[-1].end():].splitlines() if line.strip()]
    if lines and lines[0].startswith("Failed to initialize the connection"):
        lines = lines[1:]
    return int(matches[-1].group(1)), (lines[0] if lines else "")


def diagnose(status: int, output_tail: str, joined: bool) -> Ending | None:
    """Why a SuperNode that ended with ``status`` (its last lines ``output_tail``; ``joined``: it had logged
    its node id) ended, and whether a retry can help; None for an end the wrapper passes on unchanged (the
    node ran and stopped, was killed, crashed)."""
    ended = flower_exit(output_tail) if status == ERROR_STATUS else None
    if ended is not None:
        code, message = ended
        if code != REFUSED_EXIT:
            return Ending(f"Flower stopped the SuperNode with exit code {code}: {message}", retry=False)
        verify = re.search(r"certificate verify failed: (.*?)(?: \(_ssl\.c:\d+\))?$", output_tail, re.M)
        if verify:
            return Ending(certificate_cause(verify.group(1).rstrip(".")), retry=False)
        if "Failed to activate SuperNode" in output_tail:
            return Ending(f"the SuperLink refused this SuperNode (exit {REFUSED_EXIT}, Failed to activate SuperNode: it "
                          "may still list this node's previous process as online)", retry=True,
                          after_retries=f"the SuperLink still refuses this SuperNode's key after {{seconds}} s of retries "
                          f"(exit {REFUSED_EXIT}, Failed to activate SuperNode): the key is not registered with the "
                          "SuperLink (flwr supernode register <its .pub>), or another SuperNode with this key is online")
        return Ending(f"the SuperNode could not connect to the SuperLink (exit {REFUSED_EXIT}: {message})", retry=True)
    if status == 0 and not joined:
        return Ending("the SuperNode ended without an error before it joined: Flower does that when the SuperLink "
                      "answers its signed requests with 401, which before joining means the signature's time is "
                      "outside the SuperLink's window (this machine's clock more than 5 s ahead of the SuperLink's or "
                      "more than 305 s behind): set the clock (NTP)", retry=False)
    return None


def certificate_cause(verify_error: str) -> str:
    """The cause to give for OpenSSL's ``certificate verify failed: <verify_error>``."""
    if "has expired" in verify_error:
        return (f"the SuperLink's TLS certificate or the CA certificate it is checked against (--root-certificates) "
                f"has expired ({verify_error}): {RENEW_HINT}")
    if "not yet valid" in verify_error:
        return (f"the SuperLink's TLS certificate is not valid yet ({verify_error}): this machine's clock is behind "
                "the time the certificate was made; set the clock (NTP)")
    if "mismatch" in verify_error:
        return (f"the SuperLink's TLS certificate does not name the address this SuperNode connects to "
                f"({verify_error}): add that name with `fedpers deploy certs --renew --host NAME`, or connect by a "
                "name it holds")
    return (f"the SuperLink's TLS certificate is not signed by the CA this SuperNode trusts (--root-certificates: "
            f"{verify_error}): give the SuperNode the deployment's ca.crt")


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


def run_once(argv: list[str]) -> tuple[int, str, bool]:
    """Run the SuperNode once, passing its output through; returns its exit status (128 + N when killed
    by signal N), its last lines and whether it joined (logged its node id). Whatever it started is ended
    before this returns."""
    tail: list[str] = []
    joined: list[bool] = []
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL))

    def pump():
        # A thread, not the main loop: the SuperNode's flower-superexec inherits this pipe, so it reaches
        # EOF only once the orphan is gone, after the SuperNode itself ended.
        assert child.stdout is not None
        for raw in child.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            line = raw.decode(errors="replace")
            tail[:] = (tail + [line])[-40:]
            if JOINED_MARKER in line:
                joined[:] = [True]

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
    return (128 - status if status < 0 else status), "".join(tail), bool(joined)


def supervise(argv: list[str], retry_for: float = DEFAULT_RETRY_FOR, sleep=time.sleep,
              wait_after_giving_up: bool = False) -> int:
    """Run the SuperNode, again after each end a retry can cure (back-off, for up to ``retry_for`` s); its
    exit status, or :data:`GAVE_UP_STATUS` after one line saying why it gives up (``wait_after_giving_up``:
    that line, then wait to be stopped, see the module docstring)."""
    delays = backoff_delays(retry_for)
    attempt = 0
    while True:
        status, tail, joined = run_once(argv)
        ending = diagnose(status, tail, joined)
        if ending is None:
            return status
        if ending.retry and attempt < len(delays):
            delay = delays[attempt]
            attempt += 1
            print(f"fedpers-supernode-start: {ending.cause}; attempt {attempt + 1} in {delay:.0f} s", flush=True)
            sleep(delay)
            continue
        cause = ending.cause
        if ending.retry:
            cause = (ending.after_retries or "{cause}, still after {seconds} s of retries").format(
                cause=cause, seconds=f"{retry_for:.0f}")
        return give_up(cause, wait=wait_after_giving_up, sleep=sleep)


def give_up(cause: str, wait: bool = False, sleep=time.sleep) -> int:
    """Say in one line why the wrapper gives up; with ``wait``, write it to :data:`GAVE_UP_FILE` and wait
    until told to stop (SIGTERM / SIGINT end the wait), else return :data:`GAVE_UP_STATUS`."""
    print(f"fedpers-supernode-start: giving up: {cause}", flush=True)
    if not wait:
        return GAVE_UP_STATUS
    GAVE_UP_FILE.write_text(cause + "\n")
    print("fedpers-supernode-start: waiting to be stopped (a restart would give the same answer; fix the cause, "
          "then restart this SuperNode)", flush=True)
    while True:
        sleep(3600)


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
    p.add_argument("--wait-after-giving-up", action="store_true",
                   help=f"after giving up, wait to be stopped instead of exiting {GAVE_UP_STATUS} (for restart "
                        f"policies that would start it again whatever its status); the cause goes to {GAVE_UP_FILE}")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- flower-supernode ARGS...")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no SuperNode command given (after --)")
    if args.retry_for < 0:
        p.error(f"--retry-for must be >= 0, got {args.retry_for}")
    if args.bind_host_of:
        command = with_host(command, resolve(args.bind_host_of))
    if args.wait_after_giving_up:
        GAVE_UP_FILE.unlink(missing_ok=True)  # a container started again keeps its /tmp: not this start's cause
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    stop = {signal.SIGTERM: 143, signal.SIGINT: 130}

    def early(signum, _frame):
        raise _Stop(signum)

    for s in stop:
        signal.signal(s, early)  # during a back-off wait; run_once forwards to the SuperNode instead
    try:
        return supervise(command, args.retry_for, wait_after_giving_up=args.wait_after_giving_up)
    except _Stop as exc:
        end_descendants()
        return stop.get(exc.signum, 128 + exc.signum)
    except FileNotFoundError:
        print(f"fedpers-supernode-start: command not found: {command[0]}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
