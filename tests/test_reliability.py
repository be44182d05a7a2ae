"""A result once written is never lost, an interrupt ends the run, every bad input gets one line.

Each behaviour of the CLI is checked through the real ``fedpers`` CLI in a subprocess: the exit code, the
one ``fedpers: error:`` line, and that the files a user already had are byte for byte as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedpers.core.rundir import RunLock

ROOT = Path(__file__).resolve().parents[1]
TINY = ["dataset=digits", "num_clients=3", "fraction_fit=1.0", "local_epochs=1", "batch_size=32", "lr=0.05",
        "aux_size=100", "alpha=1.0", "feature_dim=64", "device=cpu", "method=fedper"]


ENV = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def fedpers(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedpers", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=ENV)


def sets(*items: str) -> list[str]:
    return [a for item in (*TINY, *items) for a in ("--set", item)]


def one_error_line(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    """The run was refused with exit ``code`` (2: bad input) and exactly one ``fedpers: error:`` line naming
    ``needles``."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedpers: error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One real 3-round run with a checkpoint, shared by the tests that must not change it (and the
    uninterrupted run that an interrupted and resumed one must equal)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    proc = fedpers("run", *sets("rounds=3", f"checkpoint_dir={out / 'ckpt'}"), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "summary.json").is_file()
    return out


# --- 1. Ctrl-C ends the run within seconds, exit 130, whole lines, nothing left behind -------------------
def _session_processes(sid: int) -> list[str]:
    """Live processes of session ``sid`` (zombies are dead already: they wait only for init to reap them)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if line.split(None, 3)[1:2] == [str(sid)] and not line.split(None, 3)[2].startswith("Z")]


def _first_metrics(out: Path) -> Path | None:
    """The metrics.jsonl under ``out`` once it holds a finished round."""
    found = [p for p in out.rglob("metrics.jsonl") if p.read_text().strip()] if out.exists() else []
    return found[0] if found else None


def _default_signals() -> None:
    # SIGINT as a terminal's Ctrl-C finds it: a test runner started in the background (`make test &` in a
    # non-interactive shell) ignores SIGINT, and a child would inherit that
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interrupt_after_first_round(args: list[str], out: Path, *, settle: float = 0.0, timeout: float = 90,
                                sig: int = signal.SIGINT) -> tuple[subprocess.Popen, float, str]:
    """Start ``fedpers ARGS`` in its own session (so that every process it starts can be found), send it
    ``sig`` once a round is in ``out`` (and ``settle`` seconds more); return it, the seconds it took to exit
    and its stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "fedpers", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 240
        while _first_metrics(out) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "it ended before its first round"
            time.sleep(0.2)
        time.sleep(settle)
        sent = time.monotonic()
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=timeout)
        return proc, time.monotonic() - sent, stderr
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.simulation
def test_sigint_after_the_first_round_ends_the_run(tmp_path):
    out = tmp_path / "run"
    proc, took, stderr = interrupt_after_first_round(["run", *sets("rounds=200"), "--out", str(out)], out, timeout=60)
    assert proc.returncode == 130, stderr
    assert took < 30, f"exit took {took:.1f} s after SIGINT"
    assert "interrupted" in stderr and "Traceback" not in stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["round"] >= 1 for line in lines)  # every line whole JSON
    time.sleep(3)  # Ray's processes get a moment to go
    assert _session_processes(proc.pid) == []


HUNG_SHUTDOWN = """
import signal, subprocess, sys, time
import ray  # noqa: F401  (a simulation: Ray is loaded)
import fedpers.apps.cli as cli
cli.INTERRUPT_GRACE_S = 1.0
child = subprocess.Popen(["sleep", "300"])  # stands for Ray's processes
print(child.pid, flush=True)
signal.signal(signal.SIGINT, cli._interrupt)
try:
    signal.raise_signal(signal.SIGINT)
except KeyboardInterrupt:
    pass
signal.raise_signal(signal.SIGINT)  # a second Ctrl-C: no second KeyboardInterrupt, the deadline stands
while True:  # a shutdown that never ends
    time.sleep(0.1)
"""


def test_an_interrupted_simulation_whose_shutdown_hangs_ends_at_the_deadline_with_what_it_started():
    proc = subprocess.Popen([sys.executable, "-c", HUNG_SHUTDOWN], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        started = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert stderr.splitlines() == ["fedpers: interrupted (ended after 1 s of shutting down)"], stderr
    assert took < 30  # 1 s of grace after start-up (importing Ray), not the 300 s of the stand-in
    sleeper = int(stdout.split()[0])
    time.sleep(0.5)
    assert [p for p in _session_processes(proc.pid) if p.split()[0] == str(sleeper)] == []


@pytest.mark.simulation
def test_sigint_ends_a_sweep_and_its_run_and_the_sweep_resumes_inside_the_run(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 200, num_clients: 3, fraction_fit: 1.0, local_epochs: 1, aux_size: 100, "
                     "feature_dim: 64, device: cpu}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
    out = tmp_path / "sweep"
    # a round or more after the first, so that the checkpoint exists
    proc, took, stderr = interrupt_after_first_round(["sweep", str(sweep), "--out", str(out)], out, settle=1.0)
    assert proc.returncode == 130 and took < 45, (proc.returncode, took, stderr)
    time.sleep(3)
    assert _session_processes(proc.pid) == []
    run_dir = list(out.rglob("metrics.jsonl"))[0].parent
    done = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert done and (run_dir / "checkpoint" / "server_checkpoint.npz").is_file() and not (run_dir / "summary.json").exists()
    # the same command, now with fewer rounds to finish: it continues after the checkpointed round
    from fedpers.core.checkpoint import load_checkpoint

    last = int(load_checkpoint(run_dir / "checkpoint")["round"])
    sweep.write_text(sweep.read_text().replace("rounds: 200", f"rounds: {last + 1}"))
    proc = fedpers("sweep", str(sweep), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(1, last + 2))  # the finished rounds kept, one more run, none twice


# --- 2. never overwrite or delete what a user has ---------------------------------------------------------
def test_out_holding_a_run_is_refused_and_left_as_it_was(finished_run):
    before = snapshot(finished_run)
    one_error_line(fedpers("run", *sets("rounds=2"), "--out", str(finished_run)), "already holds a run",
                   "--overwrite")
    assert snapshot(finished_run) == before


@pytest.mark.simulation
def test_overwrite_replaces_a_run(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "summary.json").write_text("{}")
    proc = fedpers("run", *sets("rounds=1"), "--out", str(out), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1


@pytest.mark.parametrize("change", ["changed_key", "corrupt", "missing"])
def test_refused_resume_leaves_metrics_and_summary_as_they_were(finished_run, tmp_path, change):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    ckpt = out / "ckpt" / "server_checkpoint.npz"
    extra = []
    if change == "changed_key":
        extra, needle = ["lr=0.1"], "different experiment (changed keys: lr)"
    elif change == "corrupt":
        ckpt.write_bytes(ckpt.read_bytes()[:100])
        needle = "not a readable fedpers checkpoint"
    else:
        ckpt.unlink()
        needle = "no checkpoint to resume it from"
    before = snapshot(out)
    proc = fedpers("run", *sets("rounds=3", f"checkpoint_dir={out / 'ckpt'}", "resume=true", *extra), "--out", str(out))
    one_error_line(proc, needle)
    assert snapshot(out) == before


def test_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path):
    out = tmp_path / "busy"
    with RunLock(out):
        one_error_line(fedpers("run", *sets("rounds=1"), "--out", str(out)), "in use by a live fedpers run",
                       str(os.getpid()))
    assert not (out / "metrics.jsonl").exists()


def test_a_live_run_is_named_instead_of_overwrite_or_resume_which_its_lock_refuses(tmp_path):
    """A directory that holds rounds of a run still going: the second run is told a live run holds it
    (with its pid), not to pass --overwrite or resume=true, which the lock would refuse too; once the run has
    ended, the lock file it left does not count."""
    out = tmp_path / "live"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1}\n')
    with RunLock(out):
        for extra in ([], ["--overwrite"]):
            proc = fedpers("run", *sets("rounds=1"), "--out", str(out), *extra)
            one_error_line(proc, "in use by a live fedpers run", str(os.getpid()), "do not apply to a running run")
    one_error_line(fedpers("run", *sets("rounds=1"), "--out", str(out)), "already holds a run")


def test_sweep_on_a_directory_in_use_is_refused(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 1, dataset: digits, num_clients: 3, aux_size: 100}\n"
                     "datasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
    with RunLock(tmp_path / "sweep"):
        one_error_line(fedpers("sweep", str(sweep), "--out", str(tmp_path / "sweep")), "in use")


def test_certs_refuse_an_existing_ca_and_keys_are_always_0600(tmp_path):
    d = tmp_path / "pki"
    assert fedpers("deploy", "certs", "--out", str(d), "--nodes", "1").returncode == 0
    ca = (d / "ca.crt").read_bytes()
    one_error_line(fedpers("deploy", "certs", "--out", str(d), "--nodes", "1"), "already holds a CA", "--force")
    assert (d / "ca.crt").read_bytes() == ca
    for key in ("ca.key", "server.key", "supernode-0.key"):
        os.chmod(d / key, 0o644)  # a wider mode left on an existing file must not survive a rewrite
    assert fedpers("deploy", "certs", "--out", str(d), "--nodes", "1", "--force").returncode == 0
    assert (d / "ca.crt").read_bytes() != ca
    for key in ("ca.key", "server.key", "supernode-0.key"):
        assert (d / key).stat().st_mode & 0o777 == 0o600, key


# --- 3. one line before the engine starts ---------------------------------------------------------------
def test_out_that_is_a_file_or_cannot_be_created(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    one_error_line(fedpers("run", *sets("rounds=1"), "--out", str(f)), "is a file")
    one_error_line(fedpers("run", *sets("rounds=1"), "--out", str(f / "sub")), "cannot be written")


def test_negative_seed_binary_config_and_duplicate_yaml_keys(tmp_path):
    one_error_line(fedpers("config", "--set", "seed=-1"), "seed")
    binary = tmp_path / "cfg.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    one_error_line(fedpers("config", str(binary)), "not a text file")
    dup = tmp_path / "dup.yaml"
    dup.write_text("alpha: 0.5\nrounds: 3\nalpha: 0.05\n")
    one_error_line(fedpers("config", str(dup)), "alpha", "twice", "line 3")


def test_sweep_with_a_non_numeric_alpha_and_a_corrupt_sweep_json(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 1}\ndatasets: [digits]\nalphas: [0.5, abc]\nseeds: [0]\nmethods: [fedper]\n")
    one_error_line(fedpers("sweep", str(sweep), "--out", str(tmp_path / "o"), "--dry-run"), "alphas", "'abc'")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sweep.json").write_text('{"sweep": {"methods": [')
    one_error_line(fedpers("report", str(tmp_path / "bad")), "sweep.json", "not a sweep.json")


# --- 4. partition files that would make results wrong ------------------------------------------------------
def _joined_digits_partition(path: Path, **changes) -> Path:
    """A valid 3-client joined-index partition of digits (1,797 samples), then ``changes`` applied."""
    rng = np.random.default_rng(0)
    order = rng.permutation(1797)
    arrays = {"index_space": np.array("joined"), "num_samples": np.array(1797), "aux": order[:100]}
    for c, chunk in enumerate(np.array_split(order[100:], 3)):
        arrays[f"train_{c}"], arrays[f"test_{c}"] = chunk[: len(chunk) * 3 // 4], chunk[len(chunk) * 3 // 4:]
    arrays.update(changes)
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("case", ["repeat_in_client", "two_clients", "test_is_training", "lookalike_key"])
def test_partition_files_that_would_make_results_wrong_are_refused(tmp_path, case):
    good = np.load(_joined_digits_partition(tmp_path / "good.npz"))
    t0, t1, e1 = good["train_0"], good["train_1"], good["test_1"]
    changes, needles = {
        "repeat_in_client": ({"train_0": np.concatenate([t0, t0[:1]])}, ["train_0 repeats index"]),
        "two_clients": ({"train_1": np.concatenate([t1, t0[:1]])}, ["in both train_0 and train_1"]),
        "test_is_training": ({"train_0": np.concatenate([t0, e1[:1]])}, ["in both train_0 and test_1"]),
        "lookalike_key": ({"train_01": t0[:5]}, ["key 'train_01'", "leading zeros"]),
    }[case]
    bad = _joined_digits_partition(tmp_path / "bad.npz", **changes)
    one_error_line(fedpers("run", *sets("rounds=1", "partition=file", f"partition_file={bad}"),
                           "--out", str(tmp_path / "o")), *needles)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


# --- 5. labels ------------------------------------------------------------------------------------------------
def test_a_stray_label_is_refused_unless_the_file_names_its_classes(tmp_path):
    rng = np.random.default_rng(0)
    x_train, x_test = rng.integers(0, 255, (200, 8, 8), dtype=np.uint8), rng.integers(0, 255, (50, 8, 8), dtype=np.uint8)
    y_train, y_test = np.arange(200) % 10, np.arange(50) % 10
    y_train[7] = 255
    stray = tmp_path / "stray.npz"
    np.savez(stray, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    one_error_line(fedpers("run", *sets("rounds=1", f"dataset={stray}", "num_clients=2", "aux_size=0"),
                           "--out", str(tmp_path / "o")), "labels run up to 255", "11 distinct", "class_names")
    named = tmp_path / "named.npz"
    np.savez(named, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
             class_names=np.array([str(i) for i in range(256)]))
    from fedpers.core.data import load_npz

    assert load_npz(named).num_classes == 256


# --- 6. sweeps pass values verbatim ----------------------------------------------------------------------------
@pytest.mark.simulation
def test_sweep_passes_a_path_with_a_hash_unchanged(tmp_path):
    out = tmp_path / "study #1: a=b"
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 1, num_clients: 3, fraction_fit: 1.0, local_epochs: 1, aux_size: 100, "
                     "feature_dim: 64, device: cpu}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
    proc = fedpers("sweep", str(sweep), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = list(out.rglob("summary.json"))
    assert len(summaries) == 1 and summaries[0].is_relative_to(out / "runs")
    assert json.loads(summaries[0].read_text())["config"]["out_dir"] == str(summaries[0].parent)


# --- The engine's own failures, SIGTERM, odd data and odd files --------------------------------------------
def _wait_until_gone(sid: int) -> list[str]:
    """The live processes of session ``sid`` once none is left, or after 20 s those still there (the killed
    ones of a run get a moment to be reaped)."""
    deadline = time.monotonic() + 20
    while _session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _session_processes(sid)


def _accuracies(out: Path) -> list[tuple]:
    return [(r["round"], r["personalized_macro_acc"], r["per_client_acc"], r.get("global_acc"))
            for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.simulation
def test_sigterm_during_a_round_ends_the_run_as_ctrl_c_and_resume_gives_the_uninterrupted_numbers(
        finished_run, tmp_path):
    out = tmp_path / "run"
    keys = sets("rounds=3", f"checkpoint_dir={out / 'ckpt'}", f"client_state_dir={out / 'state'}")
    proc, _, stderr = interrupt_after_first_round(["run", *keys, "--out", str(out)], out, sig=signal.SIGTERM)
    assert proc.returncode == 143, stderr
    assert [line for line in stderr.splitlines() if line.startswith("fedpers:")] == ["fedpers: terminated"], stderr
    assert "Traceback" not in stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)  # every line whole JSON
    assert not (out / "summary.json").exists()  # it stopped inside the run
    assert _wait_until_gone(proc.pid) == []
    resumed = fedpers("run", *keys, "--set", "resume=true", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _accuracies(out) == _accuracies(finished_run)  # rounds 1-3 once each, the same numbers


SIGNAL_TO_ANOTHER_THREAD = """
import signal, sys, threading, time
import fedpers.apps.cli as cli

def blocked_main_thread(args):
    # stands for Flower's engine: the main thread blocked joining a thread, the signal handed by the kernel
    # to another thread (Ray's and Flower's are many)
    worker = threading.Thread(target=threading.Event().wait, daemon=True)
    worker.start()
    threading.Thread(target=lambda: (time.sleep(0.5), signal.pthread_kill(worker.ident, signal.SIGTERM))).start()
    worker.join()

cli.cmd_methods = blocked_main_thread
sys.exit(cli.main(["methods"]))
"""


def test_a_signal_handed_to_another_thread_still_ends_the_command():
    proc = subprocess.run([sys.executable, "-c", SIGNAL_TO_ANOTHER_THREAD], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=ENV, preexec_fn=_default_signals)
    assert (proc.returncode, proc.stderr) == (143, "fedpers: terminated\n")


ENGINE_FAILS = """
import sys, threading
import ray  # noqa: F401  (as in a simulation: Ray is loaded)
import fedpers.apps.simulation as simulation

def failing_engine(cfg, verbose=False):
    # stands for Flower's ServerApp thread, which waits for replies that never come: not a daemon
    threading.Thread(target=threading.Event().wait, name="serverapp").start()
    raise RuntimeError("An error was encountered. Ending simulation.") from ValueError("ActorPool is empty")

simulation.run_simulation = failing_engine
from fedpers.apps.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_error_from_the_engine_is_one_line_and_the_command_ends(tmp_path):
    proc = subprocess.run([sys.executable, "-c", ENGINE_FAILS, "run", *sets("rounds=1"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    one_error_line(proc, "the simulation engine failed (ValueError: ActorPool is empty)", "--verbose", code=1)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA GPU is present")
@pytest.mark.parametrize("resource, needles", [
    ("client_cpus=64", ["config key 'client_cpus': 64 CPUs per client, but this machine has"]),
    ("client_gpus=1", ["config key 'client_gpus': 1 GPUs per client, but this machine has no CUDA GPU"]),
])
def test_resources_the_machine_does_not_have_are_refused_before_ray_starts(tmp_path, resource, needles):
    if resource == "client_cpus=64" and (os.cpu_count() or 1) >= 64:
        pytest.skip("this machine has 64 cores")
    one_error_line(fedpers("run", *sets("rounds=1", resource), "--out", str(tmp_path / "o")), *needles)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


@pytest.mark.parametrize("args", [["--out", ""], ["--set", "out_dir="], ["--set", "out_dir=  "]])
def test_an_empty_out_dir_is_refused(args):
    before = sorted(p.name for p in ROOT.iterdir())
    one_error_line(fedpers("run", *sets("rounds=1"), *args), "config key 'out_dir': must name a directory")
    assert sorted(p.name for p in ROOT.iterdir()) == before  # nothing written in the current directory


def test_an_empty_out_is_refused_by_sweep_and_certs(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 1}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
    one_error_line(fedpers("sweep", str(sweep), "--out", ""), "--out must name a directory")
    one_error_line(fedpers("deploy", "certs", "--out", " "), "--out must name a directory")


SET_REFUSAL_IMPORTS = """
import sys
from fedpers.apps.cli import main
code = main(sys.argv[1:])
print("torch" in sys.modules)
sys.exit(code)
"""


def test_set_values_are_kept_whole_and_a_bad_core_value_is_refused_without_torch(tmp_path):
    proc = fedpers("config", "--set", "out_dir=runs/sweep #2/a", "--set", "wandb_project=a: b # c",
                   "--set", "rounds=3", "--set", 'data_dir="x #1"')
    assert proc.returncode == 0, proc.stderr
    resolved = __import__("yaml").safe_load(proc.stdout)
    assert (resolved["out_dir"], resolved["wandb_project"], resolved["rounds"], resolved["data_dir"]) == (
        "runs/sweep #2/a", "a: b # c", 3, "x #1")
    proc = subprocess.run([sys.executable, "-c", SET_REFUSAL_IMPORTS, "run", "--set", "rounds=ten"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    one_error_line(proc, "config key 'rounds': expected int, got str 'ten'")
    assert proc.stdout.strip() == "False"  # refused before the methods' modules (and torch) were imported


def test_a_sweeps_set_keeps_the_whole_value_and_the_keys_type(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 1}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
    out = tmp_path / "sweep"
    proc = fedpers("sweep", str(sweep), "--out", str(out), "--report-only", "--set", "wandb_project=x #1: y",
                   "--set", "rounds=3", "--set", "tensorboard=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base = json.loads((out / "sweep.json").read_text())["sweep"]["base"]
    assert base == {"rounds": 3, "wandb_project": "x #1: y", "tensorboard": True}


def test_resume_with_fewer_rounds_than_the_checkpoint_is_refused(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = snapshot(out)
    proc = fedpers("run", *sets("rounds=2", f"checkpoint_dir={out / 'ckpt'}", "resume=true"), "--out", str(out))
    one_error_line(proc, "config key 'rounds'", "holds 3 rounds, more than rounds=2")
    assert snapshot(out) == before


def _npz(path: Path, x_train, y_train, x_test=None, y_test=None) -> Path:
    rng = np.random.default_rng(0)
    x_test = rng.integers(0, 255, (50, 8, 8), dtype=np.uint8) if x_test is None else x_test
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=np.arange(50) % 10 if y_test is None else y_test)
    return path


def _run_on(data: Path, out: Path) -> subprocess.CompletedProcess:
    return fedpers("run", *sets("rounds=1", f"dataset={data}", "num_clients=2", "aux_size=0"), "--out", str(out))


def test_data_with_a_single_class_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    data = _npz(tmp_path / "oneclass.npz", rng.integers(0, 255, (200, 8, 8), dtype=np.uint8), np.zeros(200, int),
                y_test=np.zeros(50, int))
    one_error_line(_run_on(data, tmp_path / "o"), "oneclass: y_train holds a single class (0)")


@pytest.mark.parametrize("case", ["huge", "inf"])
def test_a_huge_or_infinite_float_pixel_is_refused_without_warnings(tmp_path, case):
    rng = np.random.default_rng(0)
    x = rng.random((200, 8, 8)).astype(np.float32)
    x_test = rng.random((50, 8, 8)).astype(np.float32)
    if case == "huge":
        x[3, 2, 2] = 3e38  # finite, but its square overflows float32
        needle = "huge: x_train holds a pixel of magnitude 3e+38"
    else:
        x_test[0, 0, 0] = np.inf
        needle = "inf: x_test contains NaN or Inf pixels"
    one_error_line(_run_on(_npz(tmp_path / f"{case}.npz", x, np.arange(200) % 10, x_test), tmp_path / "o"), needle)


def test_complex_valued_images_are_refused_in_one_line(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.random((200, 8, 8)) + 1j * rng.random((200, 8, 8))).astype(np.complex64)
    proc = _run_on(_npz(tmp_path / "cplx.npz", x, np.arange(200) % 10, x[:50]), tmp_path / "o")
    one_error_line(proc, "cplx: x_train holds complex numbers")
    assert "Warning" not in proc.stderr


def test_standardisation_of_large_float_pixels_is_not_zeros():
    from fedpers.core.data import from_arrays

    rng = np.random.default_rng(0)
    x = rng.random((200, 8, 8)).astype(np.float32)
    x[:40, 0, 0] = 5e18  # below the refusal, yet the float32 sum of squares would overflow
    data = from_arrays("large", x, np.arange(200) % 10, x[:50], np.arange(50) % 10)
    assert np.isfinite(data.x_train).all() and np.count_nonzero(data.x_train) == data.x_train.size
    assert abs(float(data.x_train.std(dtype=np.float64)) - 1.0) < 1e-3


def test_images_too_small_for_the_model_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    data = _npz(tmp_path / "tiny.npz", rng.integers(0, 255, (200, 2, 2), dtype=np.uint8), np.arange(200) % 10,
                rng.integers(0, 255, (50, 2, 2), dtype=np.uint8))
    one_error_line(_run_on(data, tmp_path / "o"), "images of 2x2 pixels are too small for model cnn")


def test_keys_of_another_method_are_named_in_one_warning(tmp_path):
    proc = fedpers("config", "--set", "method=fedavg", "--set", "ditto_lambda=1", "--set", "fedeagd_ema_decay=0.9")
    assert proc.returncode == 0 and proc.stderr.splitlines() == [
        "fedpers: warning: method fedavg ignores ditto_lambda (ditto), fedeagd_ema_decay (fedeagd)"], proc.stderr
    config = tmp_path / "c.yaml"
    config.write_text("method: fedavg\njdfl_m: 3\n")  # an extension's key while it is off
    proc = fedpers("config", str(config))
    assert proc.stderr.splitlines() == ["fedpers: warning: method fedavg ignores jdfl_m (jdfl)"], proc.stderr
    proc = fedpers("config", "--shared", "ditto_lambda=1", "--set", "method=fedavg")  # a sweep's base: no warning
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # a core key that only some methods read: named with the methods that do
    proc = fedpers("config", "--set", "method=fedavg", "--set", "mu=0.1")
    assert proc.stderr.splitlines() == ["fedpers: warning: method fedavg ignores mu (pfedkdh, fedprox)"], proc.stderr
    for reader in ("fedprox", "pfedkdh"):
        assert fedpers("config", "--set", f"method={reader}", "--set", "mu=0.1").stderr == ""


def test_a_sweeps_base_may_carry_other_methods_keys_but_a_rows_own_set_is_warned_about(tmp_path):
    from fedpers.apps.sweep import load_sweep, plan, run_command

    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text("base: {rounds: 1, ditto_lambda: 0.5}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\n"
                          "methods: [fedavg, ditto, {label: odd, method: fedper, set: {fedeagd_ema_decay: 0.9}}]\n")
    sweep = load_sweep(sweep_file)
    warnings = {}
    for run in plan(sweep, tmp_path / "out"):
        cmd = run_command(sweep, run)
        assert cmd[3] == "run" and ["--shared", "ditto_lambda=0.5"] in [cmd[i:i + 2] for i in range(len(cmd))]
        proc = fedpers("config", *cmd[4:])  # the run's own command line, resolved by the real CLI
        assert proc.returncode == 0, proc.stderr
        warnings[run.run_key] = proc.stderr.splitlines()
    assert warnings == {"fedavg": [], "ditto": [], "fedper_fedeagd_ema_decay=0.9": [
        "fedpers: warning: method fedper ignores fedeagd_ema_decay (fedeagd)"]}


def test_a_sweep_on_the_inprocess_engine_runs_without_ray_and_ends_where_that_engine_ends(tmp_path):
    """``--engine inprocess`` reaches every run of a sweep: with a ``ray`` that cannot be imported first on
    the path the runs still finish, and each ends with the final metrics of the in-process engine run
    directly on the same config (persistent heads and pFedKDH's server state included)."""
    from fedpers.apps.inprocess import run_in_process
    from fedpers.apps.sweep import load_sweep, plan
    from fedpers.core.results import read_summary
    from fedpers.registry.config import build_config

    blocked = tmp_path / "no_ray"
    blocked.mkdir()
    (blocked / "ray.py").write_text("raise ImportError('ray is blocked by this test')\n")
    base = ", ".join(f"{k}: {v}" for k, v in (item.split("=") for item in TINY if not item.startswith("method=")))
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(f"base: {{rounds: 2, {base}}}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\n"
                          "methods: [fedper, pfedkdh]\n")
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "fedpers", "sweep", str(sweep_file), "--out", str(out), "--engine",
                           "inprocess"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**ENV, "PYTHONPATH": os.pathsep.join([str(blocked), str(ROOT)])})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = plan(load_sweep(sweep_file), out)
    assert [r.run_key for r in runs] == ["fedper", "pfedkdh"]
    for run in runs:
        direct = tmp_path / "direct" / run.run_key
        run_in_process(build_config({**run.overrides, "out_dir": str(direct)}))
        swept = read_summary(run.run_dir)
        assert swept["rounds"] == 2 and swept["final"] == read_summary(direct)["final"], run.run_key
        assert swept["final"]["personalized_macro_acc"] > 0


def test_the_inprocess_engine_refuses_a_ray_cluster_address(tmp_path):
    one_error_line(fedpers("run", *sets("rounds=1", "ray_address=127.0.0.1:6379"), "--out", str(tmp_path / "o"),
                           "--engine", "inprocess"), "'ray_address'", "--engine inprocess runs without Ray")


def _fake_sweep(tmp_path: Path) -> tuple[Path, Path]:
    """A sweep directory (its sweep.json written by the real CLI) with one finished run written here."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("base: {rounds: 2}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
    out = tmp_path / "sweep"
    assert fedpers("sweep", str(sweep), "--out", str(out), "--report-only").returncode == 0
    run = out / "runs" / "fedper" / "digits_a1" / "seed0"
    run.mkdir(parents=True)
    rounds = [{"round": r, "personalized_macro_acc": 0.5 + r / 10, "per_client_acc": {"0": 0.5}} for r in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    final = {"personalized_macro_acc": 0.7, "personalized_weighted_acc": 0.7, "global_acc": None}
    (run / "summary.json").write_text(json.dumps({"metric": "personalized_macro_acc", "final": final, "best": final,
                                                  "mean_last_5_evaluated": final, "rounds": 2}))
    return out, run


@pytest.mark.parametrize("case", ["no_such_metric", "torn_metrics", "truncated_summary"])
def test_report_refuses_an_unknown_metric_and_torn_files_and_writes_nothing(tmp_path, case):
    out, run = _fake_sweep(tmp_path)
    args = []
    if case == "no_such_metric":
        args, needles = ["--metric", "no_such_metric"], ["'no_such_metric' is not a metric of these runs",
                                                         "personalized_macro_acc, personalized_weighted_acc"]
    elif case == "torn_metrics":
        (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text()[:-20])
        needles = [f"{run / 'metrics.jsonl'} line 2 is not a whole JSON record"]
    else:
        (run / "summary.json").write_text((run / "summary.json").read_text()[:30])
        needles = [f"{run / 'summary.json'} is not a whole summary.json"]
    before = snapshot(out)
    one_error_line(fedpers("report", str(out), *args), *needles)
    assert snapshot(out) == before  # the tables of the last report are as they were


@pytest.mark.parametrize("content, needles", [
    ("- a\n- b\n", ["must be a mapping", "got list"]),
    (b"\x89PNG\r\n\x1a\n\x00\xff", ["is not a text file"]),
    ("base: [1, 2]\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n",
     ["'base' must be a mapping of config key: value, got list"]),
    ("base: {rounds: 1}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [{method: fedper, set: [1]}]\n",
     ["'fedper: set' must be a mapping of config key: value, got list"]),
    ("base: {rounds: 1}\ndatasets: [digits, mnsit]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n",
     ["run fedper/mnsit", "unknown dataset 'mnsit'"]),
    ("base: {rounds: 1}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [.inf]\nmethods: [fedper]\n",
     ["'seeds' must list integers, got inf"]),
], ids=["list", "binary", "list_base", "list_set", "second_dataset_typo", "infinite_seed"])
def test_malformed_sweep_files_are_one_line_before_any_run(tmp_path, content, needles):
    sweep = tmp_path / "s.yaml"
    sweep.write_bytes(content if isinstance(content, bytes) else content.encode())
    one_error_line(fedpers("sweep", str(sweep), "--out", str(tmp_path / "o"), "--dry-run"), *needles)


@pytest.mark.parametrize("content, needles", [
    ("[a, b]: 1\n", ["is not valid YAML (line 1): a key must be a name, got a list"]),
    ("seed: " + "9" * 5000 + "\n", ["is not valid YAML (line 1): a number of 5000 characters is not a config value"]),
    ("alpha: " + "x" * 5000 + "\n", ["config key 'alpha': expected float", "(4802 more characters)"]),
    ("# padding\n" * 110_000, ["has 1,100,000 bytes; a config file holds at most 1,048,576"]),
], ids=["list_key", "5000_digits", "5000_char_value", "too_large"])
def test_odd_config_files_are_one_short_line(tmp_path, content, needles):
    config = tmp_path / "c.yaml"
    config.write_text(content)
    line = one_error_line(fedpers("config", str(config)), *needles)
    assert len(line) < 400


@pytest.mark.parametrize("sets_, needle", [
    (["seed=18446744073709551616"], "config key 'seed': must be below 2**63"),
    (["faulty_clients=1,99", "num_clients=2"], "config key 'faulty_clients': client 99 does not exist (num_clients=2: ids 0..1)"),
])
def test_values_that_would_fail_after_the_engine_started_are_refused_at_config_time(sets_, needle):
    one_error_line(fedpers("config", *[a for s_ in sets_ for a in ("--set", s_)]), needle)


def _free_port() -> int:
    import socket

    with socket.socket() as s_:  # a port nothing listens on once this socket is closed
        s_.bind(("127.0.0.1", 0))
        return s_.getsockname()[1]


@pytest.mark.parametrize("server", ["closed_port", "http_server", "silent_tcp_server"])
def test_a_ray_address_that_is_not_a_ray_head_is_one_line_within_seconds(tmp_path, capsys, server):
    """A closed port, a web server and a TCP server that never answers are each one line naming
    ``ray_address`` within seconds: ``ray.init`` would retry the open ones for minutes, one warning a time.
    The CLI runs in this process (as tests/test_deploy.py's do), so that the seconds measured are the
    check's, not a new interpreter's start-up on a busy machine."""
    import http.server
    import socket
    import threading

    from fedpers.apps.cli import main
    from fedpers.registry.config import load_config

    load_config(None, [])  # the config's imports (torch) before the clock starts
    listener = None
    if server == "closed_port":
        port = _free_port()
        reason = "Connection refused"
    elif server == "http_server":
        class Quiet(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # the error line must be the only line on stderr
                pass

        listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=listener.serve_forever, daemon=True).start()
        port = listener.server_address[1]
        reason = "a server listens there but does not speak gRPC: not a Ray head's GCS port"
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # connections are accepted by the kernel and never answered
        port = listener.getsockname()[1]
        reason = "a server listens there but gave no gRPC answer within 3 s: not a Ray head's GCS port"
    try:
        started = time.monotonic()
        code = main(["run", *sets("rounds=1", f"ray_address=127.0.0.1:{port}"), "--out", str(tmp_path / "o")])
        took = time.monotonic() - started
    finally:
        if isinstance(listener, socket.socket):
            listener.close()
        elif listener is not None:
            listener.shutdown()
            listener.server_close()
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.splitlines() == [
        f"fedpers: error: config key 'ray_address': no Ray cluster answers at 127.0.0.1:{port} ({reason})"]
    assert captured.out == ""  # nothing ran before the refusal
    assert took < 10, f"the refusal took {took:.1f} s"
    assert not (tmp_path / "o").exists()


def test_certs_never_replace_a_users_file_nor_take_a_file_or_no_nodes(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    (d / "server.key").write_text("my own key")
    one_error_line(fedpers("deploy", "certs", "--out", str(d), "--nodes", "1"), "already holds server.key but no CA")
    one_error_line(fedpers("deploy", "certs", "--out", str(d), "--nodes", "1", "--force"), "server.key", "no CA")
    assert sorted(p.name for p in d.iterdir()) == ["server.key"] and (d / "server.key").read_text() == "my own key"
    f = tmp_path / "afile"
    f.write_text("x")
    one_error_line(fedpers("deploy", "certs", "--out", str(f)), f"--out: {f} is a file")
    one_error_line(fedpers("deploy", "certs", "--out", str(tmp_path / "new"), "--nodes", "-2"), "--nodes must be 1..1000")
    assert not (tmp_path / "new").exists()


def test_a_full_disk_while_drawing_the_curves_keeps_the_numbers_and_says_so(tmp_path, monkeypatch, capsys):
    """ENOSPC while curves.png is written is one warning line; summary.json (written
    first) and metrics.jsonl are whole, and no half-written picture is left."""
    import errno
    import json

    import fedpers.core.run_figures as figures
    from fedpers.core.results import ResultsWriter

    def full_disk(history, path, *args, **kwargs):
        path.write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(figures, "curves_png", full_disk)
    writer = ResultsWriter(tmp_path)
    record = {"round": 1, "global_acc": None, "personalized_macro_acc": 0.5, "per_client_acc": {"0": 0.5},
              "train_loss": 1.0, "bytes_up": 0, "bytes_down": 0, "round_seconds": 0.1}
    writer.append_round(record)
    writer.write_summary({"method": "fedper", "dataset": "digits", "final": {}}, [record])
    assert json.loads((tmp_path / "summary.json").read_text())["method"] == "fedper"
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][0]["round"] == 1
    assert not (tmp_path / "curves.png").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not write" in err[0] and "No space left on device" in err[0]


@pytest.mark.parametrize("stage", ["fit", "evaluation"])
def test_replies_that_come_after_a_stop_are_neither_recorded_nor_checkpointed(stage, tmp_path, monkeypatch):
    """The stop (SIGINT / SIGTERM sets STOP_REQUESTED) comes while round 2's messages are out: the engine
    ends its client actors, so the round's replies are failures that no uninterrupted run has (CI saw round
    2 recorded as the mean of 2 of 3 clients). Those replies are refused, not aggregated: the records and
    the checkpoint stay at round 1, and the resumed run writes exactly the records of a run never stopped.
    Deterministic, in one process: the stop is set where the signal would come."""
    from fedpers.apps.inprocess import run_in_process
    from fedpers.core.checkpoint import load_checkpoint
    from fedpers.core.errors import STOP_REQUESTED, Stopping
    from fedpers.core.results import read_metrics
    from fedpers.registry.config import build_config
    from fedpers.registry.methods import strategy_class_for
    from tests.conftest import tiny_overrides

    def cfg(name: str):
        # evaluation messages of their own: with evaluations carried by the next fit, only fit replies come
        return build_config(tiny_overrides(method="fedper", rounds=3, out_dir=str(tmp_path / name / "out"),
                                           checkpoint_dir=str(tmp_path / name / "ckpt"),
                                           client_state_dir=str(tmp_path / name / "state"),
                                           evaluate_with_next_fit=False))

    run_in_process(cfg("whole"))
    stopped = cfg("stopped")
    strategy_class = strategy_class_for(stopped)
    configure = getattr(strategy_class, f"configure_{'fit' if stage == 'fit' else 'evaluate'}")

    def configure_then_stop(self, server_round, *args, **kwargs):
        out = configure(self, server_round, *args, **kwargs)
        if server_round == 2:
            STOP_REQUESTED.set()  # the signal, while round 2's messages are out
        return out

    monkeypatch.setattr(strategy_class, configure.__name__, configure_then_stop)
    try:
        with pytest.raises(Stopping, match=f"round 2: the run is stopping; its {stage} replies"):
            run_in_process(stopped)
    finally:
        STOP_REQUESTED.clear()
    monkeypatch.undo()
    assert [r["round"] for r in read_metrics(stopped.out_dir)] == [1]
    assert load_checkpoint(stopped.checkpoint_dir)["round"] == 1
    run_in_process(stopped.replace(resume=True))
    whole, resumed = read_metrics(cfg("whole").out_dir), read_metrics(stopped.out_dir)
    assert [r["round"] for r in resumed] == [1, 2, 3]
    assert [(r["personalized_macro_acc"], r["per_client_acc"]) for r in resumed] == \
        [(r["personalized_macro_acc"], r["per_client_acc"]) for r in whole]


def test_a_round_with_failures_waits_a_moment_for_a_stop(monkeypatch):
    """A SIGTERM to the whole process group ends the client actors as it reaches the driver, so a round's
    failures can come before the stop is known: a round with failures waits up to STOP_GRACE_S for it;
    one without failures does not wait, and with no stop a round with failures goes on."""
    import threading

    from fedpers.core import errors
    from fedpers.core.errors import STOP_REQUESTED, Stopping, refuse_if_stopping

    monkeypatch.setattr(errors, "STOP_GRACE_S", 0.3)
    start = time.monotonic()
    refuse_if_stopping(3, "fit", failures=0)
    assert time.monotonic() - start < 0.1
    refuse_if_stopping(3, "fit", failures=1)  # no stop comes: the round goes on after the grace
    assert time.monotonic() - start >= 0.3
    monkeypatch.setattr(errors, "STOP_GRACE_S", 30.0)
    threading.Timer(0.1, STOP_REQUESTED.set).start()
    try:
        start = time.monotonic()
        with pytest.raises(Stopping, match="round 3: the run is stopping; its evaluation replies"):
            refuse_if_stopping(3, "evaluation", failures=2)
        assert time.monotonic() - start < 20  # woken by the stop, not by the grace's end
    finally:
        STOP_REQUESTED.clear()


# --- hostile paths and deploy arguments: one line before any work ---------------------------------------------
def _refused_before_work(proc: subprocess.CompletedProcess, line: str, out: Path) -> None:
    """``proc`` printed exactly ``line`` (exit 2) and left no ``out`` behind (it did not exist before)."""
    assert one_error_line(proc) == line
    assert not os.path.lexists(out), "a refused run left the --out it made"


@pytest.mark.parametrize("case", ["a_file", "under_a_file", "under_proc"])
def test_a_client_state_dir_that_cannot_be_written_is_one_line_before_the_run(tmp_path, case):
    """With client_state_spill every client writes its state only to client_state_dir: a path there that
    cannot be a writable directory failed every fit in round 1 ("0 valid client updates")."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    state, problem = {"a_file": (afile, "is a file, not a directory"),
                      "under_a_file": (afile / "state", "cannot be written (Not a directory)"),
                      "under_proc": (Path("/proc/fedpers-state"), "cannot be written (")}[case]
    out = tmp_path / "new" / "run"
    proc = fedpers("run", *sets("rounds=1", "client_state_spill=true", f"client_state_dir={state}"),
                   "--out", str(out), "--engine", "inprocess")
    line = one_error_line(proc)
    assert line.startswith(f"fedpers: error: config key 'client_state_dir': {state} {problem}"), line
    assert case != "under_proc" or line.endswith(")")  # the kernel's reason, which it alone words
    assert not (tmp_path / "new").exists()  # the folders made for --out were taken back


def test_the_inprocess_engine_spills_client_state_as_the_ray_engine_does(tmp_path):
    """Without client_state_dir the run's state lives in a folder of its own in --out, removed at its end
    (every fit used to fail: no state dir); with one that does not exist yet, it is made up front and
    holds each client's state files after the run."""
    own = tmp_path / "own"
    proc = fedpers("run", *sets("rounds=1", "client_state_spill=true"), "--out", str(own), "--engine", "inprocess")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((own / "metrics.jsonl").read_text().splitlines()[0])
    assert record["failed_clients"] == 0 and len(record["fit_clients"]) == 3 and record["client_state_consistent"]
    assert not list(own.glob("client_state-*"))  # the run's own state folder went with the run
    state = tmp_path / "state" / "spill"
    proc = fedpers("run", *sets("rounds=1", "client_state_spill=true", f"client_state_dir={state}"),
                   "--out", str(tmp_path / "given"), "--engine", "inprocess")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p.relative_to(state).as_posix() for p in state.rglob("*.npz")} == {
        f"partition-{c}/personal.npz" for c in range(3)}


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("case", ["name_too_long", "dangling_symlink", "symlink_loop", "under_a_dangling_symlink"])
def test_an_out_that_cannot_be_a_directory_says_what_it_is(tmp_path, command, case):
    from fedpers.core.errors import cut

    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    out, problem = {
        "name_too_long": (tmp_path / ("x" * 300), "cannot be written (File name too long)"),
        "dangling_symlink": (tmp_path / "dangling", f"is a dangling symlink to {tmp_path / 'nowhere'}"),
        "symlink_loop": (tmp_path / "loop_a", "is a symlink loop"),
        "under_a_dangling_symlink": (tmp_path / "dangling" / "run",
                                     f"cannot be made: {tmp_path / 'dangling'} is a dangling symlink to "
                                     f"{tmp_path / 'nowhere'}"),
    }[case]
    label = "--out (config key 'out_dir')" if command == "run" else "--out"
    if command == "run":
        proc = fedpers("run", *sets("rounds=1"), "--out", str(out))
    else:
        sweep = tmp_path / "s.yaml"
        sweep.write_text("base: {rounds: 1}\ndatasets: [digits]\nalphas: [1.0]\nseeds: [0]\nmethods: [fedper]\n")
        proc = fedpers("sweep", str(sweep), "--out", str(out))
    assert one_error_line(proc) == f"fedpers: error: {label}: {cut(str(out))} {problem}"
    assert not (tmp_path / "nowhere").exists()


def test_a_refused_run_takes_back_the_folders_it_made_and_nothing_else(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    missing = ["rounds=1", f"dataset={tmp_path / 'missing.npz'}"]
    for out in (tmp_path / "new" / "a" / "b", keep / "new" / "run", keep):
        proc = fedpers("run", *sets(*missing), "--out", str(out))
        assert one_error_line(proc) == f"fedpers: error: data file not found: {tmp_path / 'missing.npz'}"
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt"] and (keep / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("args, line", [
    (["--host", "a b/c"], "--host 'a b/c': not a DNS name (letters, digits, hyphens and dots, each label at most "
                          "63 characters) or an IP address"),
    (["--host=-edge.example.org"], "--host '-edge.example.org': not a DNS name (letters, digits, hyphens and dots, "
                                   "each label at most 63 characters) or an IP address"),
    (["--nodes", "100000"], "--nodes must be 1..1000 (one key pair per SuperNode), got 100000"),
], ids=["space_and_slash", "leading_hyphen", "too_many_nodes"])
def test_certs_refuse_a_bad_host_name_or_node_count_before_writing(tmp_path, args, line):
    started = time.monotonic()
    proc = fedpers("deploy", "certs", "--out", str(tmp_path / "pki"), *args)
    _refused_before_work(proc, f"fedpers: error: {line}", tmp_path / "pki")
    assert time.monotonic() - started < 5


def test_certs_take_dns_names_and_ip_addresses(tmp_path):
    from fedpers.apps.deploy import DEFAULT_CERT_HOSTS, cert_hosts, is_host_name

    assert cert_hosts(["fl.example.org", "10.0.0.7", "::1", "edge-1"]) == [
        *DEFAULT_CERT_HOSTS, "fl.example.org", "10.0.0.7", "::1", "edge-1"]
    assert is_host_name(".".join(["a"] * 127))  # 253 characters, the most a DNS name has
    assert not any(map(is_host_name, ["a b", "a/b", "a..b", "-a", "a-", "a_b", "x" * 64, ".".join(["a"] * 128)]))


@pytest.mark.parametrize("args, line", [
    (["--clients", "2", "--set", "num_clients=5"],
     "--clients 2 and --set num_clients=5 disagree: each SuperNode is one client; give one of them"),
    (["--clients", "2", "--timeout", "-5"], "--timeout must be a number of seconds > 0, got -5"),
    (["--timeout", "nan"], "--timeout must be a number of seconds > 0, got nan"),
], ids=["clients_and_num_clients", "negative_timeout", "nan_timeout"])
def test_deploy_local_refuses_contradicting_or_bad_arguments_before_anything_starts(tmp_path, args, line):
    started = time.monotonic()
    proc = fedpers("deploy", "local", *args, "--out", str(tmp_path / "o"))
    _refused_before_work(proc, f"fedpers: error: {line}", tmp_path / "o")
    assert time.monotonic() - started < 5  # no data loaded, no process started


def test_deploy_local_takes_num_clients_from_the_config_or_from_clients(tmp_path, monkeypatch):
    """--clients alone sets num_clients over the config file's (as a --set would); without --clients the
    run has the config's num_clients; the same number given twice is no contradiction."""
    from fedpers.apps import cli, deploy

    ran = []
    monkeypatch.setattr(cli, "preflight", lambda cfg, simulation: None)
    monkeypatch.setattr(deploy, "deploy_local", lambda cfg, clients, out, **kw: ran.append(
        (cfg.num_clients, clients)) or {"metric": "m", "final": {"m": 1.0}})
    config = tmp_path / "c.yaml"
    config.write_text("num_clients: 10\n")
    for args in (["--clients", "3", str(config)], [str(config)], ["--set", "num_clients=4", "--clients", "4"]):
        assert cli.main(["deploy", "local", *args, "--out", str(tmp_path / "o")]) == 0
    assert ran == [(3, 3), (10, 10), (4, 4)]
