"""The SuperNode start wrapper (fedpers/apps/supernode_start.py): which ends it retries, which it gives up on
in one line, and no orphans.

A stand-in for ``flower-supernode`` (a shell script) prints what Flower 1.42's SuperNode prints for each
cause (recorded from real SuperNodes against a SuperLink, an nginx proxy and TLS servers with such
certificates) and exits as it does (status 1 after ``Exit Code: N``: flwr_exit's error status), a given
number of times, and leaves a child behind, as the killed SuperNode's ``flower-superexec`` was left behind;
the real SuperNode is exercised in tests/test_deploy.py.
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


# What Flower 1.42's flower-supernode prints when it ends (its log lines, colour codes as it writes them).
_HELP = "The SuperNode could not establish a connection to the SuperLink.\n\nFor more information, visit: " \
        "<https://flower.ai/docs/framework/1.42/en/ref-exit-codes/305.html>"
KEY_REFUSED = ("\x1b[91mERROR \x1b[0m:     Exit Code: 305\nFailed to initialize the connection to the SuperLink.\n"
               f"[code: 2004] Failed to activate SuperNode.\n{_HELP}")


def _tls_failure(verify_error: str) -> str:
    return ("\x1b[91mERROR \x1b[0m:     SSL/TLS handshake error detected.\n\x1b[91mERROR \x1b[0m:     Exit Code: 305\n"
            "Failed to initialize the connection to the SuperLink.\n[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
            f"verify failed: {verify_error} (_ssl.c:1006)\n{_HELP}")


EXPIRED = _tls_failure("certificate has expired")
OTHER_CA = _tls_failure("certificate signature failure")
WRONG_NAME = _tls_failure("IP address mismatch, certificate is not valid for '127.0.0.1'.")
NOT_YET_VALID = _tls_failure("certificate is not yet valid")
BAD_KEY_FILE = ("\x1b[91mERROR \x1b[0m:     Exit Code: 302\nUnable to parse the private key file.\nNode authentication "
                "requires elliptic curve private key. Please ensure that the file path points to a valid private key "
                "file and try again.\n\nFor more information, visit: <https://flower.ai/docs/framework/1.42/en/"
                "ref-exit-codes/302.html>")
# the SuperLink answered 401 (the signature's time outside its window): Flower SIGINTs itself, exit 0
UNAUTHORIZED = "\x1b[92mINFO \x1b[0m:      SuperNode terminated gracefully."
JOINED = "\x1b[92mINFO \x1b[0m:      SuperNode ID: 4242"


def _fake_node(tmp_path: Path, refusals: int, last: str, refusal: str = KEY_REFUSED) -> Path:
    """A script that prints ``refusal`` and exits 1 ``refusals`` times, then runs ``last``; each run leaves
    `sleep` behind and records its pid in orphans.txt."""
    (tmp_path / "refusal.txt").write_text(refusal + "\n")
    script = tmp_path / "fake-supernode"
    script.write_text(f"""#!/bin/bash
n=$(cat {tmp_path}/count 2>/dev/null || echo 0); echo $((n + 1)) > {tmp_path}/count
sleep 600 & echo $! >> {tmp_path}/orphans.txt
if [ "$n" -lt {refusals} ]; then cat {tmp_path}/refusal.txt; exit 1; fi
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


def test_each_end_is_told_apart_and_only_a_refused_key_or_a_broken_connection_is_retried():
    key = ss.diagnose(1, KEY_REFUSED, joined=False)
    assert key.retry and key.cause.startswith("the SuperLink refused this SuperNode (exit 305, Failed to activate")
    for output, needle in ((EXPIRED, "has expired (certificate has expired): renew them with `fedpers deploy certs "
                                     "--renew --out DIR`"),
                           (OTHER_CA, "is not signed by the CA this SuperNode trusts"),
                           (WRONG_NAME, "does not name the address this SuperNode connects to (IP address mismatch, "
                                        "certificate is not valid for '127.0.0.1')"),
                           (NOT_YET_VALID, "is not valid yet"),
                           (BAD_KEY_FILE, "Flower stopped the SuperNode with exit code 302: Unable to parse the "
                                          "private key file.")):
        ending = ss.diagnose(1, "...\n" + output + "\n", joined=False)
        assert not ending.retry and needle in ending.cause, ending
    other = ss.diagnose(1, KEY_REFUSED.replace("[code: 2004] Failed to activate SuperNode.", "[code: 9] boom"), False)
    assert other.retry and other.cause == "the SuperNode could not connect to the SuperLink (exit 305: [code: 9] boom)"
    assert "clock" in ss.diagnose(0, UNAUTHORIZED, joined=False).cause  # 401 before joining
    assert ss.diagnose(0, UNAUTHORIZED, joined=True) is None  # it ran and stopped
    assert ss.diagnose(137, KEY_REFUSED, joined=False) is None  # killed: the restart policy's business
    assert ss.diagnose(1, "Traceback ...\nValueError: x\n", joined=False) is None  # a crash without Flower's line


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


def test_a_key_still_refused_at_the_deadline_is_given_up_in_one_line(tmp_path):
    node = _fake_node(tmp_path, refusals=99, last="exit 0")
    res = _run(tmp_path, "--retry-for", "3", "--", str(node))
    assert res.returncode == ss.GAVE_UP_STATUS == 78
    assert (tmp_path / "count").read_text().strip() == "3"  # at once, after 1 s, after 2 more (3 s in all)
    assert _wrapper_lines(res)[-1] == (
        "fedpers-supernode-start: giving up: the SuperLink still refuses this SuperNode's key after 3 s of retries "
        "(exit 305, Failed to activate SuperNode): the key is not registered with the SuperLink (flwr supernode "
        "register <its .pub>), or another SuperNode with this key is online")


def _wrapper_lines(res: subprocess.CompletedProcess) -> list[str]:
    return [line for line in res.stdout.splitlines() if line.startswith("fedpers-supernode-start:")]


@pytest.mark.parametrize("refusal, needle", [
    (EXPIRED, "the SuperLink's TLS certificate or the CA certificate it is checked against (--root-certificates) has "
              "expired (certificate has expired): renew them with `fedpers deploy certs --renew --out DIR`"),
    (OTHER_CA, "is not signed by the CA this SuperNode trusts"),
    (WRONG_NAME, "does not name the address this SuperNode connects to"),
    (BAD_KEY_FILE, "exit code 302"),
    (UNAUTHORIZED, "clock"),
], ids=["expired", "other-ca", "wrong-name", "bad-key-file", "401-before-joining"])
def test_what_no_retry_can_cure_is_given_up_at_once_in_one_line(tmp_path, refusal, needle):
    status = "0" if refusal == UNAUTHORIZED else "1"
    node = _fake_node(tmp_path, refusals=0, last=f"cat {tmp_path}/refusal.txt; exit {status}", refusal=refusal)
    res = _run(tmp_path, "--retry-for", "20", "--", str(node))
    assert res.returncode == ss.GAVE_UP_STATUS
    assert (tmp_path / "count").read_text().strip() == "1"  # not started again
    lines = _wrapper_lines(res)
    assert len(lines) == 1 and lines[0].startswith("fedpers-supernode-start: giving up: ") and needle in lines[0]
    orphans = [int(p) for p in (tmp_path / "orphans.txt").read_text().split()]
    assert not any(_alive(p) for p in orphans)


def test_a_node_that_joined_and_stopped_ends_with_its_own_status(tmp_path):
    node = _fake_node(tmp_path, refusals=0, last=f"echo '{JOINED}'; echo '{UNAUTHORIZED}'; exit 0")
    res = _run(tmp_path, "--retry-for", "20", "--", str(node))
    assert res.returncode == 0 and _wrapper_lines(res) == []


def test_waiting_after_giving_up_holds_the_container_and_says_why_until_stopped(tmp_path):
    node = _fake_node(tmp_path, refusals=0, last=f"cat {tmp_path}/refusal.txt; exit 1", refusal=EXPIRED)
    env = dict(os.environ, TMPDIR=str(tmp_path))  # where the wrapper writes its cause (compose's health check)
    proc = subprocess.Popen([sys.executable, str(WRAPPER), "--wait-after-giving-up", "--", str(node)],
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        lines = []
        while not any("waiting to be stopped" in line for line in lines):
            lines.append(proc.stdout.readline())
        assert any(line.startswith("fedpers-supernode-start: giving up: the SuperLink's TLS certificate") for line in lines)
        assert proc.poll() is None  # no exit for a restart policy to start again
        assert "has expired" in (tmp_path / "fedpers-supernode-gave-up").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "count").read_text().strip() == "1"


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
