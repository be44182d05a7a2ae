"""Deployment: state store and checkpoint units, the edge client, and real multi-process
SuperLink/SuperNode runs on 127.0.0.1 with TLS and SuperNode authentication (marker ``deployment``).

The deployment tests share one SuperLink + 3 SuperNodes (module fixture); every process they start is
stopped by process group / PID in the fixture's teardown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedpers.core.checkpoint import checkpoint_path, load_checkpoint
from fedpers.registry.config import build_config
from fedpers.core.errors import ConfigError, FedpersError
from fedpers.core.results import read_metrics
from fedpers.core.state_store import ClientStateStore, atomic_save_npz, config_fingerprint, load_npz
from tests.conftest import ROOT, tiny_overrides

BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------------------------------
# units: state store, client state across a restart, server checkpoint
# ------------------------------------------------------------------------------------------------
def test_state_store_round_trip_and_guards(tmp_path):
    store = ClientStateStore(tmp_path, partition_id=2, fingerprint="abc")
    assert store.load("personal") is None and store.names() == []
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], dtype=np.int64)]
    path = store.save("personal", arrays)
    assert path == tmp_path / "partition-2" / "personal.npz"
    back = store.load("personal")
    assert [a.dtype for a in back] == [np.float32, np.int64]
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back))
    store.save("personal", [arrays[0] * 2])  # overwrite
    assert np.array_equal(store.load("personal")[0], arrays[0] * 2) and len(store.load("personal")) == 1
    assert store.names() == ["personal"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temp files left
    assert ClientStateStore(tmp_path, 2, "other-experiment").load("personal") is None
    with pytest.raises(ValueError):
        store.save("../escape", arrays)


def test_atomic_write_keeps_the_previous_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "x.npz"
    atomic_save_npz(path, {"a": np.ones(3)}, {"round": 1})

    def boom(*args, **kwargs):
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_save_npz(path, {"a": np.zeros(3)}, {"round": 2})
    arrays, meta = load_npz(path)
    assert meta == {"round": 1} and np.array_equal(arrays["a"], np.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]


def test_fingerprint_ignores_run_mechanics_only():
    a = build_config(tiny_overrides())
    assert config_fingerprint(a) == config_fingerprint(a.replace(rounds=9, out_dir="/x", client_state_dir="/s",
                                                                 checkpoint_dir="/c", resume=True, round_timeout=5))
    assert config_fingerprint(a) != config_fingerprint(a.replace(alpha=0.3))


def _context(pid: int, state_dir: str = "") -> Context:
    node_config = {"partition-id": pid, "num-partitions": 3}
    if state_dir:
        node_config["state-dir"] = state_dir
    return Context(run_id=1, node_id=100 + pid, node_config=node_config, state=RecordDict(), run_config={})


def test_client_state_survives_a_supernode_restart(tmp_path):
    from clients.base import STATE_PREFIX, arrays_digest
    from clients.pfedkdh import PFedKDHClient
    from fedpers.core.federation import get_federation
    from fedpers.core.models import build_model, get_arrays

    cfg = build_config(tiny_overrides(client_state_dir=str(tmp_path / "state")))
    fed = get_federation(cfg)
    broadcast = get_arrays(build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim,
                                       dropout=cfg.dropout, seed=cfg.seed), "all")
    client = PFedKDHClient(cfg, _context(1))
    _, _, metrics = client.fit(broadcast, {"server_round": 1})
    assert (tmp_path / "state" / "partition-1" / "personal.npz").is_file()
    restarted = PFedKDHClient(cfg, _context(1))  # fresh context.state: the SuperNode restarted
    assert restarted.context.state.get(STATE_PREFIX + "personal") is None
    assert arrays_digest(restarted.load_state("personal")) == metrics["state_digest"]
    _, _, eval_metrics = restarted.evaluate(broadcast, {"server_round": 1})
    assert eval_metrics["state_digest"] == metrics["state_digest"]
    # in-memory only (default): nothing written, nothing restored
    plain = build_config(tiny_overrides())
    PFedKDHClient(plain, _context(0)).fit(broadcast, {"server_round": 1})
    assert PFedKDHClient(plain, _context(0)).load_state("personal") is None
    # the node config's state-dir wins over client_state_dir
    PFedKDHClient(cfg, _context(2, str(tmp_path / "node2"))).fit(broadcast, {"server_round": 1})
    assert (tmp_path / "node2" / "partition-2" / "personal.npz").is_file()


def test_spilled_client_state_lives_on_disk_only(tmp_path):
    from clients.base import STATE_PREFIX, arrays_digest
    from clients.fedeagd import FedEAGDClient
    from fedpers.core.federation import get_federation
    from fedpers.core.models import build_model, get_arrays

    cfg = build_config(tiny_overrides(method="fedeagd", client_state_spill=True,
                                      client_state_dir=str(tmp_path / "spill")))
    fed = get_federation(cfg)
    broadcast = get_arrays(build_model(fed.input_shape, fed.num_classes, feature_dim=cfg.feature_dim,
                                       dropout=cfg.dropout, seed=cfg.seed, kind="se_cnn"), "backbone")
    context = _context(1)
    _, _, metrics = FedEAGDClient(cfg, context).fit(broadcast, {"server_round": 1})
    assert not [k for k in context.state if k.startswith(STATE_PREFIX)]  # nothing kept in memory
    saved = sorted(p.name for p in (tmp_path / "spill" / "partition-1").glob("*.npz"))
    assert "personal.npz" in saved and len(saved) >= 2  # the head/residual and the EMA teacher
    again = FedEAGDClient(cfg, context)  # the next message, same context
    assert arrays_digest(again.load_state("personal")) == metrics["state_digest"]
    _, _, eval_metrics = again.evaluate(broadcast, {"server_round": 1})
    assert eval_metrics["state_digest"] == metrics["state_digest"]
    with pytest.raises(ConfigError, match="client_state_spill"):
        FedEAGDClient(cfg.replace(client_state_dir=""), _context(2)).fit(broadcast, {"server_round": 1})


def test_checkpoint_round_trip(tmp_path):
    import torch

    from fedpers.core.federation import get_federation
    from fedpers.registry.methods import get_method
    from fedpers.core.results import ResultsWriter

    cfg = build_config(tiny_overrides(checkpoint_dir=str(tmp_path / "ckpt"), out_dir=str(tmp_path / "a")))
    fed = get_federation(cfg)
    cls = get_method(cfg.method).strategy_class()
    strategy = cls(cfg, fed, ResultsWriter(cfg.out_dir))
    with torch.no_grad():
        for p in strategy.model.parameters():
            p.add_(0.5)
    record = {"round": 1, "global_acc": 0.5, "personalized_macro_acc": 0.25, "per_client_acc": {"0": 0.25},
              "train_loss": 1.0, "bytes_up": 10, "bytes_down": 20, "round_seconds": 0.1, "fit_clients": [0]}
    strategy.book.history.append(record)
    strategy.book.totals = {"bytes_up": 10, "bytes_down": 20}
    strategy.book.last_fit_digest = {0: "d0"}
    strategy.save_checkpoint()
    assert checkpoint_path(cfg.checkpoint_dir).is_file()

    resumed_cfg = cfg.replace(rounds=5, resume=True, out_dir=str(tmp_path / "b"))
    resumed = cls(resumed_cfg, fed, ResultsWriter(resumed_cfg.out_dir))
    state = load_checkpoint(cfg.checkpoint_dir, resumed_cfg)
    assert state["round"] == 1
    resumed.load_state_dict(state)
    for a, b in zip(strategy.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    assert resumed.book.history == [record] and resumed.book.totals == strategy.book.totals
    assert resumed.book.last_fit_digest == {0: "d0"}
    assert read_metrics(resumed_cfg.out_dir) == [record]  # metrics.jsonl continues after the done rounds
    with pytest.raises(FedpersError, match="different experiment.*alpha"):
        load_checkpoint(cfg.checkpoint_dir, cfg.replace(alpha=0.3))
    with pytest.raises(FedpersError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_deploy_cli_certs_and_bad_input(tmp_path, capsys):
    from fedpers.apps.cli import main

    assert main(["deploy", "certs", "--out", str(tmp_path / "c"), "--nodes", "2", "--host", "fl.example.org"]) == 0
    assert {p.name for p in (tmp_path / "c").iterdir()} == {
        "ca.crt", "ca.key", "server.pem", "server.key", "supernode-0.key", "supernode-0.key.pub",
        "supernode-1.key", "supernode-1.key.pub", "superexec.secret"}
    for private in ("supernode-0.key", "ca.key", "server.key", "superexec.secret"):
        assert oct((tmp_path / "c" / private).stat().st_mode & 0o777) == "0o600", private
    secret = (tmp_path / "c" / "superexec.secret").read_text()
    assert len(secret) == 64 and int(secret, 16) >= 0  # 32 random bytes, hex
    # --host adds a name to those the compose stack needs (it used to replace them)
    assert _cert_names(tmp_path / "c" / "server.pem") == [
        "fleet-proxy", "runtime-proxy", "superlink", "localhost", "127.0.0.1", "fl.example.org"]
    assert main(["deploy", "certs", "--out", str(tmp_path / "d"), "--nodes", "1"]) == 0
    assert _cert_names(tmp_path / "d" / "server.pem") == ["fleet-proxy", "runtime-proxy", "superlink", "localhost",
                                                          "127.0.0.1"]
    assert main(["deploy", "local", "--clients", "0", "--out", str(tmp_path / "o")]) == 2
    assert "--clients must be >= 1" in capsys.readouterr().err


def _cert_names(pem: Path) -> list[str]:
    from fedpers.apps.deploy import certificate_names

    return certificate_names(pem)


def _days_left(pem: Path) -> float:
    from fedpers.apps.deploy import certificate_expiry

    return (certificate_expiry(pem) - __import__("datetime").datetime.now(__import__("datetime").timezone.utc)).total_seconds() / 86400


def _expired_certificate(pem: Path, signer_key: Path, issuer_pem: Path | None = None) -> None:
    """Replace the certificate in ``pem`` by one with the same subject, names and public key that expired a
    day ago, signed with ``signer_key`` (itself, for a CA; ``issuer_pem``'s subject as issuer otherwise)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    old = x509.load_pem_x509_certificate(pem.read_bytes())
    issuer = x509.load_pem_x509_certificate(issuer_pem.read_bytes()).subject if issuer_pem else old.subject
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(issuer).public_key(old.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=31))
               .not_valid_after(now - dt.timedelta(days=1)))
    for extension in old.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    key = serialization.load_pem_private_key(signer_key.read_bytes(), None)
    pem.write_bytes(builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def test_certs_validity_is_an_option_bounded_and_said(tmp_path, capsys):
    from fedpers.apps.cli import main
    from fedpers.apps.deploy import MAX_CERT_DAYS

    assert main(["deploy", "certs", "--out", str(tmp_path / "c"), "--days", "365"]) == 0
    out = capsys.readouterr().out
    for pem in ("ca.crt", "server.pem"):
        assert 364.9 < _days_left(tmp_path / "c" / pem) <= 365
    assert re.search(r"; valid until \d{4}-\d\d-\d\d \d\d:\d\d UTC \(365 days\): renew before then with "
                     r"`fedpers deploy certs --renew --out .*/c`$", out.strip()), out
    assert main(["deploy", "certs", "--out", str(tmp_path / "d")]) == 0  # the default: 30 days
    assert 29.9 < _days_left(tmp_path / "d" / "server.pem") <= 30
    for days in ("0", str(MAX_CERT_DAYS + 1)):
        assert main(["deploy", "certs", "--out", str(tmp_path / "e"), "--days", days]) == 2
        assert capsys.readouterr().err.strip() == (
            f"fedpers: error: --days must be 1..{MAX_CERT_DAYS} (the longest a TLS server certificate may be valid for "
            f"Apple's platforms, which an edge SuperNode may run on), got {days}")
    assert not (tmp_path / "e").exists()


def test_renewal_keeps_the_ca_key_the_node_keys_and_the_secret_and_the_old_ca_still_verifies(tmp_path, capsys):
    from cryptography import x509

    from fedpers.apps.cli import main

    c = tmp_path / "c"
    assert main(["deploy", "certs", "--out", str(c), "--nodes", "2", "--host", "fl.example.org", "--days", "5"]) == 0
    kept = {name: (c / name).read_bytes() for name in ("ca.key", "supernode-0.key", "supernode-0.key.pub",
                                                      "supernode-1.key", "superexec.secret")}
    old_ca = x509.load_pem_x509_certificate((c / "ca.crt").read_bytes())
    old_server_key = (c / "server.key").read_bytes()
    _expired_certificate(c / "ca.crt", c / "ca.key")  # even an expired CA certificate is renewed
    capsys.readouterr()
    assert main(["deploy", "certs", "--out", str(c), "--renew", "--days", "90", "--host", "edge.example.org"]) == 0
    assert capsys.readouterr().out.startswith(f"fedpers | renewed: CA {c}/ca.crt (same key), SuperLink certificate ")
    assert {name: (c / name).read_bytes() for name in kept} == kept  # registrations and runners unchanged
    assert (c / "server.key").read_bytes() != old_server_key and oct((c / "server.key").stat().st_mode & 0o777) == "0o600"
    assert 89.9 < _days_left(c / "ca.crt") <= 90 and 89.9 < _days_left(c / "server.pem") <= 90
    assert _cert_names(c / "server.pem") == ["fleet-proxy", "runtime-proxy", "superlink", "localhost", "127.0.0.1",
                                             "fl.example.org", "edge.example.org"]
    server = x509.load_pem_x509_certificate((c / "server.pem").read_bytes())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate((c / "ca.crt").read_bytes()))
    server.verify_directly_issued_by(old_ca)  # a SuperNode that still holds the previous ca.crt trusts it
    assert main(["deploy", "certs", "--out", str(c), "--renew", "--force"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedpers: error: --renew keeps the CA key and the SuperNode keys: leave out --force and --nodes")
    assert main(["deploy", "certs", "--out", str(tmp_path / "none"), "--renew"]) == 2
    assert "ca.key not found: --renew signs with the CA key" in capsys.readouterr().err


def _tls_server(cert: Path, key: Path):
    """A TLS server on a free loopback port presenting ``cert`` (each handshake, then closed): (address, stop)."""
    import socket
    import ssl
    import threading

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    stopped = threading.Event()

    def serve():
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                context.wrap_socket(conn, server_side=True).close()
            except (OSError, ssl.SSLError):
                conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", stopped.set


def _wrapped_supernode(tmp_path: Path, address: str, ca: Path, key: Path, retry_for: str = "20"):
    """The start wrapper running a real flower-supernode against ``address`` until it ends."""
    from fedpers.apps.deploy import flower_env

    env = flower_env(tmp_path / "home")
    env["PATH"] = str(BIN) + os.pathsep + env["PATH"]
    return subprocess.run([sys.executable, "-m", "fedpers.apps.supernode_start", "--retry-for", retry_for, "--",
                           str(BIN / "flower-supernode"), "--superlink", address, "--root-certificates", str(ca),
                           "--auth-supernode-private-key", str(key), "--node-config", "partition-id=0 num-partitions=1",
                           "--host", "127.0.0.1", "--port", str(_free_port()), "--isolation", "process"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def _free_port() -> int:
    from fedpers.apps.deploy import free_port

    return free_port()


def _gave_up(res: subprocess.CompletedProcess) -> list[str]:
    return [line for line in res.stdout.splitlines() if line.startswith("fedpers-supernode-start:")]


@pytest.mark.deployment
def test_a_supernode_facing_an_expired_certificate_gives_up_at_once_and_says_so(tmp_path):
    from fedpers.apps.deploy import make_pki

    pki = make_pki(tmp_path / "pki", 1)
    _expired_certificate(pki.server_cert, pki.ca_key, issuer_pem=pki.ca_cert)
    address, stop = _tls_server(pki.server_cert, pki.server_key)
    try:
        res = _wrapped_supernode(tmp_path, address, pki.ca_cert, pki.node_keys[0])
    finally:
        stop()
    assert res.returncode == 78, res.stdout[-2000:]
    assert "certificate verify failed: certificate has expired" in res.stdout  # what Flower itself says
    assert _gave_up(res) == [
        "fedpers-supernode-start: giving up: the SuperLink's TLS certificate or the CA certificate it is checked "
        "against (--root-certificates) has expired (certificate has expired): renew them with `fedpers deploy certs "
        "--renew --out DIR` and restart the proxy, the SuperLink and the SuperNodes (deploy/README.md, "
        "\"Certificates\")"]


@pytest.mark.deployment
def test_a_supernode_trusting_another_ca_gives_up_at_once_and_says_so(deployment, tmp_path):
    from fedpers.apps.deploy import make_pki

    other = make_pki(tmp_path / "other", 1)
    res = _wrapped_supernode(tmp_path, deployment.address, other.ca_cert, deployment.pki.node_keys[0])
    assert res.returncode == 78
    (line,) = _gave_up(res)
    assert line.startswith("fedpers-supernode-start: giving up: the SuperLink's TLS certificate is not signed by the "
                           "CA this SuperNode trusts (--root-certificates: ")


def test_certs_readme_lists_every_name_the_stack_needs():
    from fedpers.apps.deploy import DEFAULT_CERT_HOSTS

    readme = (ROOT / "deploy" / "certs" / "README.md").read_text()
    for name in DEFAULT_CERT_HOSTS:
        assert f"`{name}`" in readme, name


def test_deploy_config_paths_state_and_resume(tmp_path):
    from fedpers.apps.deploy import deploy_config

    out = tmp_path / "out"
    stale = out / "deploy" / "state" / "partition-0"
    stale.mkdir(parents=True)
    cfg = deploy_config(build_config(tiny_overrides()), out, resume=False)
    assert cfg.out_dir == str(out) and cfg.client_state_dir == str(out / "deploy" / "state")
    assert cfg.checkpoint_dir == str(out / "checkpoint") and not stale.exists()  # a fresh run: no stale heads
    stale.mkdir(parents=True)
    deploy_config(build_config(tiny_overrides(resume=True)), out, resume=True)
    assert stale.exists()  # resume keeps the clients' state


# ------------------------------------------------------------------------------------------------
# docker-compose.yml, Dockerfiles, edge client
# ------------------------------------------------------------------------------------------------
def _help_flags(command: str) -> set[str]:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    out = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True, env=env, timeout=120)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout))


def _flags(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


# docker-compose.yml, its Dockerfiles and overrides: tests/test_compose.py
def test_edge_client_flags_exist_in_flower_help():
    edge = (ROOT / "deploy" / "edge" / "start-edge-client.sh").read_text()
    cmd = edge[edge.index("exec flower-supernode"):].split()
    assert not set(_flags(cmd)) - _help_flags("flower-supernode")


def test_edge_dockerfile_copies_existing_files():
    text = (ROOT / "deploy" / "Dockerfile.client-cpu").read_text()
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in text and "slim" in text.splitlines()[3]
    for src in re.findall(r"^COPY (\S+)", text, flags=re.M):
        assert (ROOT / src).exists(), f"Dockerfile.client-cpu: COPY {src} missing"


def test_edge_client_install_is_cpu_only_and_script_parses():
    req = (ROOT / "deploy" / "edge" / "requirements.txt").read_text()
    assert "whl/cpu" in req and "flwr==1.42.0" in req and "ray" not in req and "[simulation]" not in req
    script = ROOT / "deploy" / "edge" / "start-edge-client.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert subprocess.run(["sh", "-n", str(ROOT / "deploy" / "register-supernodes.sh")]).returncode == 0
    assert os.access(script, os.X_OK)
    assert "--root-certificates" in script.read_text() and "--auth-supernode-private-key" in script.read_text()


# ------------------------------------------------------------------------------------------------
# real deployment on 127.0.0.1: TLS, SuperNode auth, state dirs, checkpoint/resume, a killed SuperNode
# ------------------------------------------------------------------------------------------------
RUN_TIMEOUT = 900


def _cfg(out: Path, **extra):
    base = tiny_overrides(method="pfedkdh", variant="ea", out_dir=str(out), client_state_dir=str(out / "state"),
                          checkpoint_dir=str(out / "checkpoint"))
    base.update(extra)
    return build_config(base)


def _wait_for(predicate, timeout: float, what: str, procs=()):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        for p in procs:
            if not p.alive():
                raise AssertionError(f"{p.name} ended while waiting for {what}:\n{p.tail(40)}")
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def _checkpoint_round(cfg) -> int:
    """The round of the server checkpoint (0 before the first)."""
    try:
        return int(load_checkpoint(cfg.checkpoint_dir)["round"])
    except FedpersError:
        return 0


def _rounds(out: Path) -> list[int]:
    try:
        return [r["round"] for r in read_metrics(out)]
    except (FileNotFoundError, ValueError):
        return []


def _need_nginx() -> None:
    from fedpers.apps.deploy import nginx_binary

    try:
        nginx_binary()
    except FedpersError as exc:  # `make test` installs it where it can (root + apt)
        pytest.skip(f"the deployment puts nginx in front of the SuperLink and {exc}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from fedpers.apps.deploy import LocalDeployment

    _need_nginx()
    # OUT/deploy, as `fedpers deploy local --out OUT` lays it out: `deploy restart-node --out OUT` finds it
    dep = LocalDeployment(tmp_path_factory.mktemp("deploy-out") / "deploy", num_nodes=3)
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()
        for pid in dep.pids():
            assert not _pid_alive(pid), f"process {pid} survived the teardown"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return state.exists() and state.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def clean_run(deployment, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    cfg = _cfg(out, rounds=2)
    summary = deployment.run(cfg, timeout=RUN_TIMEOUT)
    return cfg, out, summary


@pytest.mark.deployment
def test_unregistered_supernode_is_refused(deployment, tmp_path):
    from fedpers.apps.deploy import make_node_key

    rogue = make_node_key(tmp_path / "rogue.key")
    proc = deployment.start_node(0, key=rogue, name="rogue", retry_for=3)
    _wait_for(lambda: not proc.alive(), 120, "the unregistered SuperNode to be refused")
    assert proc.exit_code() == 78  # given up: no retry changes the answer
    log = proc.log_path.read_text()
    assert "Failed to activate SuperNode" in log and log.count("the SuperLink refused this SuperNode (exit 305") == 2
    assert log.strip().splitlines()[-1] == (
        "fedpers-supernode-start: giving up: the SuperLink still refuses this SuperNode's key after 3 s of retries "
        "(exit 305, Failed to activate SuperNode): the key is not registered with the SuperLink (flwr supernode "
        "register <its .pub>), or another SuperNode with this key is online")


@pytest.mark.deployment
def test_deployed_run_finishes_and_heads_persist(deployment, clean_run):
    from clients.base import arrays_digest
    from fedpers.apps.bundle import build, contents

    cfg, out, summary = clean_run
    rounds = read_metrics(out)
    assert [r["round"] for r in rounds] == [1, 2] and summary["rounds"] == 2
    # the run's app bundle carried the code, the same files as the repository's (tests/test_app_bundle.py)
    assert deployment.bundle.startswith(f"app bundle: {len(contents(build(ROOT)))} files, ")
    for r in rounds:
        assert set(r["per_client_acc"]) == {"0", "1", "2"} and r["failed_clients"] == 0
        assert r["client_state_consistent"] is True and r["round_seconds"] > 0
    assert summary["final"]["personalized_macro_acc"] is not None
    ckpt = load_checkpoint(cfg.checkpoint_dir, cfg)
    assert ckpt["round"] == 2
    for pid in range(3):  # every SuperNode's private head is on disk and is the one it last trained
        head = ClientStateStore(cfg.client_state_dir, pid, config_fingerprint(cfg)).load("personal")
        assert head is not None and arrays_digest(head) == ckpt["last_fit_digest"][str(pid)]


@pytest.mark.deployment
def test_killed_server_resumes_from_checkpoint(deployment, clean_run):
    cfg, out, _ = clean_run
    before = read_metrics(out)
    resumed = cfg.replace(rounds=4, resume=True)
    run = deployment.submit(resumed)
    _wait_for(lambda: 3 in _rounds(out), RUN_TIMEOUT, "round 3", [run])
    run_id = re.search(r"Successfully started run (\d+)", run.log_path.read_text()).group(1)
    res = deployment.flwr(["stop", run_id, "fedpers"])  # kill the ServerApp mid-run
    assert res.returncode == 0, res.stdout + res.stderr
    run.stop()
    done = load_checkpoint(cfg.checkpoint_dir)["round"]
    assert done >= 3 and not (out / "summary.json").exists()
    summary = deployment.run(resumed, timeout=RUN_TIMEOUT)
    rounds = read_metrics(out)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4] and summary["rounds"] == 4
    assert rounds[:2] == before  # the finished rounds are kept as they were
    assert load_checkpoint(cfg.checkpoint_dir)["round"] == 4
    assert all(r["client_state_consistent"] for r in rounds)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.deployment
def test_killed_supernode_does_not_stall_the_run_and_rejoins(deployment, tmp_path):
    from fedpers.apps.processes import descendants

    cfg = _cfg(tmp_path, rounds=4, min_fit_updates=2, round_timeout=120.0)
    run = deployment.submit(cfg)
    # round 1 has ended once its checkpoint is written (its record waits for the evaluations that round
    # 2's fit replies carry: evaluate_with_next_fit)
    _wait_for(lambda: _checkpoint_round(cfg) >= 1, RUN_TIMEOUT, "round 1", [run])
    assert (tmp_path / "state" / "partition-2" / "personal.npz").is_file()
    wrapper = deployment.nodes[2]  # fedpers.apps.supernode_start, which runs flower-supernode
    node = next(p for p in descendants(wrapper.pid) if "flower-supernode" in _cmdline(p))
    children = descendants(node)  # subprocess isolation: its flower-superexec (and any flwr-clientapp)
    assert any("flower-superexec" in _cmdline(p) for p in children)
    os.kill(node, signal.SIGKILL)  # the SuperNode dies mid-run: round 2 has started and waits for it
    _wait_for(lambda: not wrapper.alive(), 120, "the start wrapper to end with its SuperNode")
    assert wrapper.exit_code() == 128 + signal.SIGKILL
    assert [p for p in children if _pid_alive(p)] == []  # no orphan flower-superexec
    # restarted at once, while the SuperLink still lists the killed node as online (it refuses it: exit
    # 305, until it misses the heartbeats): the start wrapper retries until it is let in
    res = subprocess.run([str(BIN / "fedpers"), "deploy", "restart-node", "--out", str(deployment.root.parent), "2"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, FLWR_TELEMETRY_ENABLED="0"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("fedpers | SuperNode 2 started again (pid ")
    summary = deployment.wait(run, cfg, RUN_TIMEOUT)
    r1, r2, r3, r4 = read_metrics(tmp_path)
    assert summary["rounds"] == 4
    # Round 2 ends without node 2's update (its message is answered "Node Unavailable" once the SuperLink
    # misses the heartbeats) and keeps min_fit_updates valid updates.
    assert len(r2["fit_nodes"]) >= cfg.min_fit_updates
    assert r2["round_seconds"] < cfg.round_timeout + 90  # round timeout + Flower's heartbeat expiry
    # the restarted node is let in within 5 s of the SuperLink noticing; round 4 has it again
    assert r4["fit_clients"] == [0, 1, 2] and set(r4["per_client_acc"]) == {"0", "1", "2"}  # sampled again
    assert r4["client_state_consistent"] is True
    log = (deployment.logs / "supernode-2.log").read_text()
    restarted = log.split("--- fedpers deploy restart-node 2 at ", 1)[1]
    assert "the SuperLink refused this SuperNode (exit 305" in restarted  # the start wrapper's retry
    assert "SuperNode ID:" in restarted  # ... and then it joined
    assert "client 2 restored state 'personal'" in restarted  # starting from the head it had before the kill


@pytest.mark.deployment
def test_a_node_that_does_not_fit_the_run_is_a_failed_client_and_can_fail_the_run(deployment, tmp_path):
    from fedpers.apps.deploy import make_node_key

    # An edge node joins the 3 nodes (num-partitions=3) as partition 3 of 4.
    key = make_node_key(tmp_path / "edge.key")
    deployment.register(key.with_name("edge.key.pub"))
    edge = deployment.start_node(3, key=key, name="edge", num_partitions=4)
    try:
        _wait_for(lambda: "SuperNode ID:" in edge.log_path.read_text(), 120, "the edge node to join", [edge])
        edge_id = re.findall(r"SuperNode ID: (\d+)", edge.log_path.read_text())[-1]
        # a 3-client run: the 3 nodes fit, the edge node refuses and is the round's failed client
        fits = _cfg(tmp_path / "fits", rounds=1, fraction_fit=1.0)
        summary = deployment.run(fits, timeout=RUN_TIMEOUT)
        (record,) = read_metrics(tmp_path / "fits")
        assert summary["rounds"] == 1 and record["fit_clients"] == [0, 1, 2]
        assert record["failed_clients"] == 1 and record["refused_nodes"] == [
            {"node": edge_id, "reason": "node config num-partitions=4 but the run has num_clients=3"}]
        # a 4-client run (what the edge node was started for): only the edge node fits, the run needs 4
        starved = _cfg(tmp_path / "starved", num_clients=4, rounds=1, fraction_fit=1.0)
        with pytest.raises(FedpersError) as info:
            deployment.run(starved, timeout=RUN_TIMEOUT)
        assert str(info.value) == (
            "round 1: 1 of num_clients=4 clients have a SuperNode that fits the run, fewer than the 4 it needs (max "
            "of min_fit_updates=1 and the 4 sampled per round); 3 node(s) refused: node config num-partitions=3 but "
            "the run has num_clients=4 (start each SuperNode with --node-config \"partition-id=N num-partitions=4\")")
        assert not (tmp_path / "starved" / "summary.json").exists()
        status = deployment.flwr(["ls", "fedpers", "--format", "json"])
        runs = json.loads(status.stdout[status.stdout.index("{"):])["runs"]
        assert [r["status"] for r in runs if "fewer than the 4 it needs" in r.get("status-details", "")] == [
            "finished:failed"]
    finally:
        edge.stop()  # the other tests share the deployment: 3 nodes again


def test_restart_node_without_a_deployment_is_one_line(tmp_path, capsys):
    from fedpers.apps.cli import main

    assert main(["deploy", "restart-node", "--out", str(tmp_path), "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fedpers: error: {tmp_path}/deploy/nodes/supernode-1.json: no SuperNode 1 of a `fedpers deploy "
                   f"local` in {tmp_path} (is `fedpers deploy local --out {tmp_path}` running?)")


# ------------------------------------------------------------------------------------------------
# the Fleet API proxy: only the Fleet API on the network, the Control API on the operator's side
# ------------------------------------------------------------------------------------------------
def _https_status(address: str, path: str, ca: Path, method: str = "POST", headers: dict | None = None) -> int:
    """HTTP status of ``method path`` at ``address`` over TLS (verified against ``ca``)."""
    import ssl
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"https://{address}{path}", data=b"" if method == "POST" else None, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(ca)), timeout=10) as res:
            return res.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _access_log_paths(dep) -> list[tuple[str, str]]:
    """(method, path) of every request the proxy's access log holds."""
    text = (dep.logs / "fleet-proxy-access.log").read_text()
    return re.findall(r'"(GET|POST|HEAD|PUT|DELETE) (\S+) HTTP', text)


@pytest.mark.deployment
def test_supernodes_reach_the_superlink_only_through_the_proxy(deployment, clean_run):
    dep = deployment
    assert dep.superlink_address.startswith("127.0.0.1:") and dep.address != dep.superlink_address
    for proc in dep.nodes.values():  # every SuperNode was pointed at the proxy's Fleet listener
        assert proc.argv[proc.argv.index("--superlink") + 1] == dep.address
    fleet = {path for method, path in _access_log_paths(dep) if method == "POST" and path.startswith("/v1/fleet/")}
    # the whole clean run (registration, messages, model objects) went through the proxy
    assert {"/v1/fleet/activate-node", "/v1/fleet/pull-messages", "/v1/fleet/push-messages",
            "/v1/fleet/pull-object", "/v1/fleet/push-object"} <= fleet


@pytest.mark.deployment
def test_only_the_fleet_api_passes_the_published_port(deployment):
    dep, ca = deployment, deployment.pki.ca_cert
    for path in ("/v1/control/list-runs", "/v1/control/start-run", "/v1/runtime/get-run", "/health", "/"):
        assert _https_status(dep.address, path, ca) == 403, path
    assert _https_status(dep.address, "/v1/fleet/pull-messages", ca, method="GET") == 403  # POST only
    # a Fleet request passes to the SuperLink, whose node authentication rejects it (no node signature)
    assert _https_status(dep.address, "/v1/fleet/get-run", ca, headers={"Content-Type": "application/protobuf"}) == 401
    # and the operator's listener passes nothing but the Control API
    for path in ("/v1/fleet/pull-messages", "/v1/runtime/get-run"):
        assert _https_status(dep.control_address, path, ca) == 403, path


@pytest.mark.deployment
def test_control_api_works_from_the_operator_side(deployment):
    dep = deployment
    assert dep.control_address.startswith("127.0.0.1:")
    res = dep.flwr(["ls", "fedpers", "--format", "json"])  # the operator's CLI, via the loopback listener
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout[res.stdout.index("{"):])["success"] is True
    assert any(path.startswith("/v1/control/list-runs") for _, path in _access_log_paths(dep))


@pytest.mark.deployment
def test_superexec_needs_the_shared_secret(tmp_path):
    from fedpers.apps.deploy import LocalDeployment

    _need_nginx()
    cfg = build_config(tiny_overrides(method="fedavg", rounds=1, num_clients=1, out_dir=str(tmp_path / "run"),
                                      client_state_dir=str(tmp_path / "state"),
                                      checkpoint_dir=str(tmp_path / "checkpoint")))
    with LocalDeployment(tmp_path / "deploy", 1, isolation="process") as dep:
        assert dep.pki.superexec_secret.stat().st_mode & 0o777 == 0o600
        rogue = dep.start_superexec(0, "rogue-superexec", secret=None)
        _wait_for(lambda: not rogue.alive(), 120, "the SuperExec without the secret to be turned away")
        assert "SuperExec authentication failed" in dep.nodes[0].log_path.read_text()
        summary = dep.run(cfg, timeout=RUN_TIMEOUT)  # the SuperExec holding the secret serves the run
        assert summary["rounds"] == 1 and dep.executors[0].alive()
        assert "launch" not in rogue.log_path.read_text().lower()


# ------------------------------------------------------------------------------------------------
# the proxy's body bound: what an unsigned request can make the SuperLink read
# ------------------------------------------------------------------------------------------------
def test_fleet_bodies_are_flowers_objects_chunked_at_5_mib():
    from fedpers.apps.fleet_bodies import MIB, fleet_bodies_of

    small = fleet_bodies_of([np.zeros((256, 1024), np.float32)], {"train_loss": 0.5})  # 1 MiB of floats
    assert small.upload == MIB and MIB < small.push_object < MIB + 1024  # the array, its npy header, the request
    # a 12 MiB array travels as 5 MiB chunks: the largest body is one chunk, not the array
    big = fleet_bodies_of([np.zeros((3, 1024, 1024), np.float32)], {"train_loss": 0.5})
    assert big.upload == 12 * MIB and 5 * MIB < big.push_object < 5 * MIB + 1024
    # the record listing the arrays and the object tree of push-messages grow with the number of arrays (about
    # 140 bytes each), not with their size
    many = fleet_bodies_of([np.full(4, i, np.float32) for i in range(200)], {})
    assert big.push_messages < 4096 and 200 * 100 < many.push_messages < 200 * 200
    assert 200 * 100 < many.push_object < 200 * 200  # the ArrayRecord, the largest of its objects


def test_default_fleet_bound_fits_the_default_models_and_names_its_key():
    from fedpers.apps.fleet_bodies import DEFAULT_FLEET_MAX_OBJECT_BODY, MIB, check_fleet_bound, fleet_bodies, nginx_size

    bound = nginx_size(DEFAULT_FLEET_MAX_OBJECT_BODY, "x")
    assert bound == 6 * MIB
    for method in ("pfedkdh", "scaffold", "fedeagd"):  # whole model, two model-sized sections, se_cnn backbone
        bodies = check_fleet_bound(build_config(tiny_overrides(method=method)), bound)
        assert bodies.push_object < 5 * MIB + 1024
    bodies = fleet_bodies(build_config(tiny_overrides()))
    with pytest.raises(FedpersError) as info:
        check_fleet_bound(build_config(tiny_overrides()), 1024)
    assert str(info.value) == (
        f"a client of this run sends push-object bodies of {bodies.push_object} bytes "
        f"({bodies.push_object / MIB:.2f} MiB), more than the Fleet proxy accepts (1024 bytes): raise the proxy's "
        "bound (`fedpers deploy local --fleet-max-object-body`, or FLEET_MAX_OBJECT_BODY for docker compose) to "
        "at least 1m")
    assert [nginx_size(v, "k") for v in ("6m", "512K", "1g", "1048576")] == [6 * MIB, 512 * 1024, 1024 * MIB, MIB]
    for bad in ("0", "6 MB", "6 m", " 6m", "-1", "", "1.5m"):
        with pytest.raises(FedpersError, match=f"^--fleet-max-object-body: {re.escape(repr(bad))} is not an nginx"):
            nginx_size(bad, "--fleet-max-object-body")


def test_deploy_local_refuses_a_run_larger_than_the_bound_before_anything_starts(tmp_path, capsys):
    from fedpers.apps.cli import main

    args = ["deploy", "local", "--clients", "3", "--out", str(tmp_path / "o")]
    sets = [a for k, v in tiny_overrides().items() if k != "num_clients" for a in ("--set", f"{k}={v}")]
    assert main(args + sets + ["--fleet-max-object-body", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedpers: error: --fleet-max-object-body: '0' is not an nginx size above 0 (e.g. 6m, 512k, 1g or a number "
        "of bytes)")
    assert main(args + sets + ["--fleet-max-object-body", "4k"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedpers: error: a client of this run sends push-object bodies of ") and "\n" not in err
    assert "--fleet-max-object-body" in err and not (tmp_path / "o" / "deploy").exists()  # nothing started


def test_server_app_checks_a_run_against_the_proxy_bound_it_is_given(monkeypatch):
    from fedpers.apps.fleet_bodies import FLEET_BOUND_ENV
    from fedpers.apps.server_app import check_fleet_proxy_bound

    cfg = build_config(tiny_overrides())
    monkeypatch.delenv(FLEET_BOUND_ENV, raising=False)
    check_fleet_proxy_bound(cfg)  # no bound given (a simulation): nothing to check
    monkeypatch.setenv(FLEET_BOUND_ENV, "6m")
    check_fleet_proxy_bound(cfg)
    monkeypatch.setenv(FLEET_BOUND_ENV, "2k")
    with pytest.raises(FedpersError, match="more than the Fleet proxy accepts \\(2048 bytes\\)"):
        check_fleet_proxy_bound(cfg)


def test_the_deployment_engine_bounds_a_round_unless_the_run_sets_a_bound(monkeypatch):
    from flwr.superlink.grid import InMemoryGrid

    from fedpers.apps import server_app

    seen = []

    class Stop(Exception):
        pass

    def record(context):
        seen.append(context.run_config.get("round_timeout"))
        raise Stop

    monkeypatch.setattr(server_app, "server_fn", record)
    monkeypatch.delenv("FEDPERS_FLEET_MAX_OBJECT_BODY", raising=False)
    for grid, timeout in ((object(), 0.0), (object(), 60.0), (InMemoryGrid.__new__(InMemoryGrid), 0.0)):
        config = {**build_config(tiny_overrides()).to_dict(), "round_timeout": timeout}
        with pytest.raises(Stop):
            server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    # deployed: 0 becomes the deployment default, a bound the run sets is kept; simulated: 0 stays "no limit"
    assert seen == [server_app.DEPLOYMENT_ROUND_TIMEOUT, 60.0, 0.0] and server_app.DEPLOYMENT_ROUND_TIMEOUT == 1800.0


def _rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _post_unsigned(address: str, ca: Path, path: str, size: int, chunked: bool) -> str:
    """The status code ``size`` bytes of zeros POSTed to ``path`` without a node signature get (Content-Length
    or chunked): the request `make compose-check` sends the compose stack (deploy/compose/probe.py)."""
    import importlib.util
    import ssl

    spec = importlib.util.spec_from_file_location("compose_probe", ROOT / "deploy" / "compose" / "probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe.post_body(f"https://{address}{path}", size, chunked, ssl.create_default_context(cafile=str(ca)))


@pytest.mark.deployment
def test_an_oversized_unsigned_push_object_is_refused_by_the_proxy(deployment):
    from fedpers.apps.fleet_bodies import MIB, nginx_size

    bound = nginx_size(deployment.max_object_body, "bound")
    pid = deployment.superlink.pid
    before = _rss_mib(pid)
    for chunked in (False, True):  # a declared length is refused at once; a chunked body where it passes the bound
        status = _post_unsigned(deployment.address, deployment.pki.ca_cert, "/v1/fleet/push-object", 128 * MIB,
                                chunked)
        assert status == "413", (chunked, status)
    # every other Fleet path is bounded at 1 MiB
    assert _post_unsigned(deployment.address, deployment.pki.ca_cert, "/v1/fleet/push-messages", 2 * MIB, False) == "413"
    time.sleep(1.0)
    # 2 x 128 MiB sent: the SuperLink saw at most the bound's worth of one (it used to read it all, and keep it)
    assert _rss_mib(pid) - before < 4 * bound / MIB, (before, _rss_mib(pid))
    # a body within the bound still reaches the SuperLink, whose node authentication answers it
    assert _post_unsigned(deployment.address, deployment.pki.ca_cert, "/v1/fleet/push-object", MIB, False) in (
        "400", "401")


def _handshake(address: str, ca: Path, version, ciphers: str | None = None) -> tuple[str, str] | None:
    """(TLS version, cipher suite) of a handshake with ``address`` offering only ``version`` (and ``ciphers``),
    None when the server refuses it."""
    import socket
    import ssl

    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = context.maximum_version = version
    if ciphers:
        context.set_ciphers(ciphers)
    try:
        with context.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host) as tls:
            return str(tls.version()), tls.cipher()[0]
    except ssl.SSLError:
        return None


@pytest.mark.deployment
def test_the_proxy_speaks_tls_12_and_13_with_aead_suites_only(deployment):
    import ssl

    ca = deployment.pki.ca_cert
    for address in (deployment.address, deployment.control_address):
        # SHA-1 (and SHA-256) CBC suites of TLS 1.2: refused (nginx's own default list accepts them)
        for suite in ("ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384"):
            assert _handshake(address, ca, ssl.TLSVersion.TLSv1_2, suite) is None, (address, suite)
        assert _handshake(address, ca, ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256") == (
            "TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256")
        assert _handshake(address, ca, ssl.TLSVersion.TLSv1_3)[0] == "TLSv1.3"


def test_deploy_without_nginx_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    from fedpers.apps import deploy

    monkeypatch.setattr(deploy.shutil, "which", lambda name: None)
    monkeypatch.setattr(deploy.os, "access", lambda path, mode: False)
    dep = deploy.LocalDeployment(tmp_path / "d", num_nodes=1)
    with pytest.raises(FedpersError, match="nginx not found: .*apt-get install nginx-light"):
        dep.start()
    assert dep.superlink is None and not (tmp_path / "d").exists()  # nothing started, nothing written


def test_proxy_template_renders_every_variable(tmp_path):
    from fedpers.apps.deploy import PROXY_TEMPLATE, render_proxy_conf

    conf = render_proxy_conf(superlink="127.0.0.1:1", fleet_listen="127.0.0.1:2", control_listen="127.0.0.1:3",
                             cert=tmp_path / "s.pem", key=tmp_path / "s.key", ca=tmp_path / "ca.crt",
                             tls_name="localhost")
    assert "${" not in conf and "$" not in conf.replace("$host", "")  # nginx variables stay out of the template
    assert "listen 127.0.0.1:2 ssl;" in conf and "listen 127.0.0.1:3 ssl;" in conf
    assert conf.count("location /v1/fleet/") == 1 and conf.count("location /v1/control/") == 1
    assert conf.count("return 403;") == 2
    assert set(re.findall(r"\$\{(\w+)\}", PROXY_TEMPLATE.read_text())) == {
        "SUPERLINK_ADDRESS", "FLEET_LISTEN", "CONTROL_LISTEN", "PROXY_CERT", "PROXY_KEY", "SUPERLINK_CA",
        "SUPERLINK_TLS_NAME", "FLEET_MAX_OBJECT_BODY"}
    assert "location = /v1/fleet/push-object" in conf and "client_max_body_size 6m;" in conf
