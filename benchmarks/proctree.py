"""Memory of a whole process tree (driver + Ray GCS/raylet + client actors), sampled from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fedpers.apps.memory import process_tree, rss_pss  # noqa: F401 - re-exported for the benchmarks


def status_kb(pid: int, *fields: str) -> list[int]:
    """Fields of /proc/PID/status in bytes (``RssAnon``: private heap, ``RssShmem``: shared memory)."""
    out = dict.fromkeys(fields, 0)
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name = line.split(":", 1)[0]
            if name in out:
                out[name] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return [out[f] for f in fields]


class Sampler(threading.Thread):
    """Samples the process tree of ``pid`` until stopped; keeps the peaks."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = {"tree_rss": 0, "tree_pss": 0, "driver_rss": 0, "driver_anon": 0, "driver_shmem": 0,
                     "processes": 0}
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:  # noqa: D102
        while not self.stop.is_set():
            pids = process_tree(self.pid)
            values = [rss_pss(p) for p in pids]
            now = {"tree_rss": sum(r for r, _ in values), "tree_pss": sum(p for _, p in values),
                   "driver_rss": rss_pss(self.pid)[0], "processes": len(pids)}
            now["driver_anon"], now["driver_shmem"] = status_kb(self.pid, "RssAnon", "RssShmem")
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)
            self.samples += 1
            self.stop.wait(self.interval)


def run_sampled(cmd: list[str], *, cwd: Path, interval: float, timeout: float,
                log: Path | None = None) -> tuple[int | str, Sampler]:
    """Run ``cmd`` in its own session (telemetry and runtime installs off) while a :class:`Sampler` watches
    its process tree; on timeout only that session is terminated. With ``log`` its output also goes to that
    file. Returns (exit code or "timeout", sampler)."""
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    out = None if log is None else open(log, "a")
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True, stdout=out,
                                stderr=None if out is None else subprocess.STDOUT)
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor
    sampler = Sampler(proc.pid, interval)
    sampler.start()
    try:
        rc: int | str = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the run's own session: only what this command started
        proc.wait()
        rc = "timeout"
    finally:
        sampler.stop.set()
        sampler.join()
    return rc, sampler


def run_fedpers_sampled(sets: dict, out: Path, *, cwd: Path, interval: float,
                        timeout: float) -> tuple[int | str, Sampler, Path, float]:
    """``fedpers run --out OUT --set k=v ...`` under :func:`run_sampled`, its output in ``OUT.log`` beside
    ``out``. Returns (exit code or "timeout", sampler, the log, wall seconds)."""
    cmd = [sys.executable, "-m", "fedpers", "run", "--out", str(out)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    print("$", " ".join(cmd), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    start = time.perf_counter()
    rc, sampler = run_sampled(cmd, cwd=cwd, interval=interval, timeout=timeout, log=log)
    return rc, sampler, log, time.perf_counter() - start
