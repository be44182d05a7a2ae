"""The SuperNode start wrapper (fedpers/apps/supernode_start.py): refusal retries and no orphans.

A stand-in for ``flower-supernode`` (a shell script) exits like Flower's refused SuperNode (status 1 after
``Exit Code: 305``: flwr_exit's error status) a given number of times and leaves a child behind, as the killed
SuperNode's ``flower-superexec`` was left behind; the real SuperNode is exercised in tests/test_deploy.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedpers.apps import supernode_start as ss

WRAPPER = Path(ss.__file__)


def _fake_node(tmp_path: Path, refusals: int, last: str) -> Path:
    """A script refused ``refusals`` times, then ending with ``last``; each run leaves `sleep` behind
    and records its pid in orphans.txt."""
    script = tmp_path / "fake-supernode"
    script.write_text(f"""#!/bin/bash
n=$(cat {tmp_path}/count 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/count
sleep 600 & echo $! >> {tmp_path}/orphans.txt
if [ "$n" -lt {refusals} ]; then echo "Exit Code: 305"; echo "Failed to activate SuperNode."; exit 1; fi
{last}
""")
    script.chmod(0o755)
    return script


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WRAPPER), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_backoff_doubles_to_the_cap_and_fits_the_deadline():
    delays = ss.backoff_delays(150)
    assert delays[:5] == [1, 2, 4, 5, 5] and sum(delays) == 150 and delays[-1] == 3 and len(delays) == 32
    assert ss.backoff_delays(5) == [1, 2, 2]
    assert ss.backoff_delays(40, max_delay=30) == [1, 2, 4, 8, 16, 9]
    assert ss.backoff_delays(0) == []


def test_refusal_needs_both_the_status_and_flowers_line():
    assert ss.was_refused(1, "...\nExit Code: 305\nFailed to activate SuperNode.\n") is True
    assert ss.was_refused(1, "Exit Code: 304\n") is False  # another of Flower's errors
    assert ss.was_refused(137, "Exit Code: 305\n") is False  # killed: not a refusal


def test_with_host_replaces_either_spelling_or_adds_it():
    assert ss.with_host(["flower-supernode", "--host=0.0.0.0", "--port=9094"], "10.0.0.2") == [
        "flower-supernode", "--host=10.0.0.2", "--port=9094"]
    assert ss.with_host(["flower-supernode", "--host", "0.0.0.0"], "10.0.0.2") == [
        "flower-supernode", "--host", "10.0.0.2"]
    assert ss.with_host(["flower-supernode"], "10.0.0.2") == ["flower-supernode", "--host", "10.0.0.2"]


def test_refused_node_is_retried_until_it_joins_and_leaves_no_orphan(tmp_path):
    node = _fake_node(tmp_path, refusals=2, last="echo joined; exit 3")
    res = _run(tmp_path, "--retry-for", "20", "--", str(node))
    assert res.returncode == 3
    assert (tmp_path / "count").read_text().strip() == "3"
    assert res.stdout.count("the SuperLink refused this SuperNode") == 2 and "joined" in res.stdout
    orphans = [int(p) for p in (tmp_path / "orphans.txt").read_text().split()]
    assert len(orphans) == 3 and not any(_alive(p) for p in orphans)


def test_a_node_still_refused_at_the_deadline_gives_up_as_flower_does(tmp_path):
    node = _fake_node(tmp_path, refusals=99, last="exit 0")
    res = _run(tmp_path, "--retry-for", "3", "--", str(node))
    assert res.returncode == 1
    assert (tmp_path / "count").read_text().strip() == "3"  # at once, after 1 s, after 2 more (3 s in all)
    assert "giving up" in res.stdout


def test_killed_supernode_takes_its_children_along(tmp_path):
    node = _fake_node(tmp_path, refusals=0, last="kill -9 $$")
    res = _run(tmp_path, "--retry-for", "0", "--", str(node))
    assert res.returncode == 128 + signal.SIGKILL
    orphans = [int(p) for p in (tmp_path / "orphans.txt").read_text().split()]
    assert len(orphans) == 1 and not _alive(orphans[0])


def test_sigterm_stops_the_node_and_its_children(tmp_path):
    node = _fake_node(tmp_path, refusals=0, last="echo up; wait")
    proc = subprocess.Popen([sys.executable, str(WRAPPER), "--", str(node)], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    orphans = [int(p) for p in (tmp_path / "orphans.txt").read_text().split()]
    assert len(orphans) == 1 and not _alive(orphans[0])


def test_no_command_is_one_line(tmp_path):
    res = _run(tmp_path, "--retry-for", "1")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith("no SuperNode command given (after --)")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_missing_command_is_one_line(tmp_path):
    res = _run(tmp_path, "--", str(tmp_path / "nope"))
    assert res.returncode == 127
    assert res.stderr.strip() == f"fedpers-supernode-start: command not found: {tmp_path / 'nope'}"
