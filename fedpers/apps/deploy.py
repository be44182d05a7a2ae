"""Real Flower deployment: SuperLink + SuperNodes as separate processes, TLS, SuperNode authentication.

    fedpers deploy local --clients 3 [CONFIG.yaml] [--set key=value ...] --out DIR
    fedpers deploy certs --out deploy/certs --nodes 3 [--host superlink ...]

``deploy local`` makes a throwaway CA, a SuperLink certificate for 127.0.0.1/localhost and one EC
(P-384) key pair per SuperNode (``cryptography``), starts ``flower-superlink`` with TLS and
``--enable-supernode-auth`` on a free loopback port, registers every SuperNode public key with
``flwr supernode register``, starts N ``flower-supernode`` processes (``partition-id=i
num-partitions=N``), submits the experiment with ``flwr run`` (a SuperLink connection with the CA as
root certificate, in a private ``FLWR_HOME`` under the output directory), waits for the run to end and
stops every process it started, by process group (also on error and Ctrl-C). The ServerApp and
ClientApps are the same ``fedpers.apps.server_app`` objects as in simulation; results are the same
``metrics.jsonl``/``summary.json``.

Transport: Flower 1.42's SuperNode speaks only the Fleet API over HTTPS (protobuf over HTTP/1.1, served
by the SuperLink's uvicorn on ``--host/--port`` together with the Control and Runtime APIs). The gRPC
(grpc-rere) Fleet server still exists in the SuperLink behind an internal switch, but the 1.42 SuperNode
has no gRPC client, so HTTPS is the transport. TLS and node authentication (signed request headers,
checked against the registered public keys) work on it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from fedpers.core.errors import FedpersError, shown
from fedpers.core.rundir import removed_if_refused, writable_dir
from fedpers.apps.fleet_bodies import (DEFAULT_FLEET_MAX_OBJECT_BODY, FLEET_BOUND_ENV, check_fleet_bound,
                                       nginx_size)
from fedpers.apps.processes import descendants, process_state, signal_pids, start_time

FEDERATION = "fedpers"  # name of the SuperLink connection in the private FLWR_HOME
FLWR_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            # A SuperExec checks for a new ClientApp/ServerApp task every second by default: a LAN can
            # afford 0.1 s, and each message starts sooner by the difference.
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}
SUPEREXEC_SECRET = "superexec.secret"
PROXY_TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "fleet-proxy.conf.template"


# --------------------------------------------------------------------------------------------------
# PKI: throwaway CA, SuperLink certificate, SuperNode key pairs
# --------------------------------------------------------------------------------------------------
@dataclass
class Pki:
    """Paths of the TLS material and SuperNode keys in one directory."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    node_keys: list[Path] = field(default_factory=list)  # OpenSSH private keys; public key = <path>.pub
    superexec_secret: Path | None = None  # shared by a Flower process and its SuperExec (process isolation)

    def node_public(self, i: int) -> Path:
        return self.node_keys[i].with_name(self.node_keys[i].name + ".pub")


DEFAULT_CERT_DAYS = 30
# The longest a TLS server certificate may be valid for Apple's platforms, which an edge SuperNode may run on
# (certificates issued since July 2019); a CA or a key kept longer should be replaced, not renewed.
MAX_CERT_DAYS = 825


def make_ca(directory: Path, days: int = DEFAULT_CERT_DAYS, reuse_key: bool = False) -> tuple[Path, Path]:
    """A self-signed CA (``ca.crt``, ``ca.key``) valid for ``days``; ``reuse_key``: signed with the
    ``ca.key`` already in ``directory`` (a renewal: the same subject and key, so certificates it signs also
    verify against the CA certificate it replaces, for as long as that one is valid)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    if reuse_key:
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    else:
        key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedpers throwaway CA")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"
    if not reuse_key:
        _write_private(ca_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return ca_cert, ca_key


def make_server_cert(directory: Path, ca_cert: Path, ca_key: Path, hosts: Sequence[str],
                     days: int = DEFAULT_CERT_DAYS, stem: str = "server") -> tuple[Path, Path]:
    """A server certificate signed by the CA, valid for ``hosts`` (DNS names and IP addresses)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP384R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(signer, hashes.SHA256()))
    pem, pkey = directory / f"{stem}.pem", directory / f"{stem}.key"
    _write_private(pkey, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pem, pkey


def make_node_key(path: Path) -> Path:
    """An EC P-384 SuperNode key pair in OpenSSH format (``path`` private, ``path.pub`` public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.with_name(path.name + ".pub").write_bytes(pub + f" {path.name}\n".encode())
    return path


def make_pki(directory: str | os.PathLike, num_nodes: int,
             hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = DEFAULT_CERT_DAYS) -> Pki:
    """CA, SuperLink certificate for ``hosts`` (both valid for ``days``) and ``num_nodes`` SuperNode key pairs
    in ``directory``."""
    d = Path(directory)
    ca_cert, ca_key = make_ca(d, days)
    cert, key = make_server_cert(d, ca_cert, ca_key, list(hosts), days)
    nodes = [make_node_key(d / f"supernode-{i}.key") for i in range(num_nodes)]
    return Pki(d, ca_cert, ca_key, cert, key, nodes, make_superexec_secret(d / SUPEREXEC_SECRET))


def make_superexec_secret(path: Path) -> Path:
    """A random shared secret (64 hex characters, 0600) for ``--superexec-auth-secret-file``: with it a
    SuperLink or SuperNode only hands work to (and takes results from) a SuperExec holding the same file."""
    _write_private(path, secrets.token_hex(32).encode())
    return path


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only: a fresh 0600 file moved over ``path``, so an existing
    file's wider mode never applies to the new key, not even for an instant."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    """A console script next to this interpreter (the venv's), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def flower_env(flwr_home: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every Flower process: telemetry off, no runtime `uv sync`, private FLWR_HOME."""
    env = dict(os.environ)
    env.update(FLWR_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    if extra:
        env.update(extra)
    return env


class Proc:
    """One started process in its own session/process group (pgid == its pid).

    The process is not reaped until :meth:`stop`, so its PID and process group cannot be recycled while
    we may still signal them: a signal sent here only ever reaches processes this object started.
    """

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None):
        self.name, self.argv, self.log_path = name, argv, log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("ab")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      cwd=str(cwd) if cwd else None, start_new_session=True)
        self.pid = self.popen.pid

    def _unreaped_status(self) -> int | None:
        """Exit status if the process ended (left unreaped), None while it runs."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.popen.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def alive(self) -> bool:
        return self._unreaped_status() is None

    def exit_code(self) -> int | None:
        """The exit code once ended (negative: killed by that signal), None while running."""
        return self._unreaped_status()

    def stop(self, grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
        """SIGTERM the process, its group and its descendants; SIGKILL what is left after ``grace``; reap."""
        try:
            if self.popen.returncode is None:  # not reaped: our PID/pgid, safe to signal
                tree = descendants(self.pid)
                if self.alive():
                    _signal_group(self.pid, sig)
                    signal_pids(tree, sig)
                    end = time.monotonic() + grace
                    while self.alive() and time.monotonic() < end:
                        time.sleep(0.1)
                signal_pids(descendants(self.pid) + tree, signal.SIGKILL)
                _signal_group(self.pid, signal.SIGKILL)  # the leader is at most a zombie: pgid still ours
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=grace)
        finally:
            self._log.close()

    def kill(self) -> None:
        """Abrupt death of the process, its group and its descendants (fault injection), then reap."""
        self.stop(grace=0.0, sig=signal.SIGKILL)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_for_port(host: str, port: int, timeout: float, proc: Proc | None = None) -> None:
    """Block until ``host:port`` accepts TCP connections."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and not proc.alive():
            raise FedpersError(f"{proc.name} exited with code {proc.exit_code()}:\n{proc.tail()}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.3)
    raise FedpersError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


def _stop_tree(proc: "Proc", grace: float) -> None:
    """Stop ``proc``, its process group and every descendant (SuperExec may detach into its own group)."""
    proc.stop(grace=grace)


# --------------------------------------------------------------------------------------------------
# the Fleet API proxy (nginx) in front of the SuperLink
# --------------------------------------------------------------------------------------------------
def render_proxy_conf(*, superlink: str, fleet_listen: str, control_listen: str, cert: Path, key: Path,
                      ca: Path, tls_name: str, max_object_body: str = DEFAULT_FLEET_MAX_OBJECT_BODY,
                      template: Path = PROXY_TEMPLATE) -> str:
    """``deploy/nginx/fleet-proxy.conf.template`` with its variables filled in: the same file the compose
    stack's nginx renders with envsubst, so the local deployment exercises what compose ships.
    ``max_object_body``: the push-object bound (an nginx size, :data:`DEFAULT_FLEET_MAX_OBJECT_BODY`)."""
    import string

    if not template.is_file():
        raise FedpersError(f"{template} not found: `fedpers deploy local` needs a source checkout (deploy/nginx/)")
    return string.Template(template.read_text()).substitute(
        SUPERLINK_ADDRESS=superlink, FLEET_LISTEN=fleet_listen, CONTROL_LISTEN=control_listen,
        PROXY_CERT=str(cert), PROXY_KEY=str(key), SUPERLINK_CA=str(ca), SUPERLINK_TLS_NAME=tls_name,
        FLEET_MAX_OBJECT_BODY=max_object_body)


def nginx_binary() -> str:
    """The nginx executable, or a FedpersError saying how to install it."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if not found:
        raise FedpersError("nginx not found: `fedpers deploy local` puts nginx in front of the SuperLink so that "
                           "only the Fleet API is reachable (Debian/Ubuntu: apt-get install nginx-light)")
    return found


def write_proxy_files(directory: Path, logs: Path, server_conf: str) -> Path:
    """A self-contained nginx main config (pid, logs and temp files under ``directory``/``logs``) that
    includes ``server_conf``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    (directory / "fleet-proxy.conf").write_text(server_conf)
    temp = {name: directory / "tmp" / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    (directory / "tmp").mkdir(exist_ok=True)  # nginx makes the leaves, not their parent
    main = directory / "nginx.conf"
    main.write_text("\n".join([
        "# written by fedpers deploy local: nginx as the Fleet API proxy (see fleet-proxy.conf)",
        "worker_processes 1;",
        f"pid {directory / 'nginx.pid'};",
        f"error_log {logs / 'fleet-proxy-error.log'} notice;",
        "events { worker_connections 256; }",
        "http {",
        f"    access_log {logs / 'fleet-proxy-access.log'};",
        *[f"    {name}_temp_path {path};" for name, path in temp.items()],
        f"    include {directory / 'fleet-proxy.conf'};",
        "}", ""]))
    return main


# --------------------------------------------------------------------------------------------------
# a local deployment: SuperLink + N SuperNodes on 127.0.0.1
# --------------------------------------------------------------------------------------------------
def write_flwr_config(flwr_home: Path, address: str, root_cert: Path, name: str = FEDERATION) -> Path:
    """A Flower CLI config (``FLWR_HOME/config.toml``) whose default SuperLink connection is ``name``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n'
                    f'root-certificates = "{root_cert.resolve()}"\n')
    return path


class LocalDeployment:
    """SuperLink + SuperNodes as separate processes on 127.0.0.1, TLS and SuperNode authentication.

    Use as a context manager: every process it starts is stopped on exit (also on errors and Ctrl-C).
    """

    def __init__(self, root: str | os.PathLike, num_nodes: int, isolation: str = "subprocess",
                 host: str = "127.0.0.1", startup_timeout: float = 120.0,
                 max_object_body: str = DEFAULT_FLEET_MAX_OBJECT_BODY):
        if isolation not in ("subprocess", "process"):
            raise FedpersError(f"isolation must be subprocess or process, got {isolation!r}")
        self.root = Path(root).resolve()
        self.num_nodes = num_nodes
        self.isolation = isolation
        self.host = host  # where the proxy's Fleet listener is (what SuperNodes connect to)
        self.max_object_body = max_object_body  # the proxy's push-object bound (an nginx size)
        self.startup_timeout = startup_timeout
        self.logs = self.root / "logs"
        self.flwr_home = self.root / "flwr_home"
        self.pki: Pki | None = None
        self.superlink_port = self.port = self.control_port = 0
        self.superlink: Proc | None = None
        self.proxy: Proc | None = None
        self.nodes: dict[int, Proc] = {}
        self.executors: dict[int, Proc] = {}  # isolation=process: one flower-superexec per SuperNode
        self.node_ports: dict[int, int] = {}
        self._extra: list[Proc] = []
        self._runs = 0
        self.bundle = ""  # the last submitted run's app bundle, in one line (fedpers.apps.bundle.describe)

    # --- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "LocalDeployment":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> str:
        """The Fleet API as the SuperNodes see it: the proxy's Fleet listener."""
        return f"{self.host}:{self.port}"

    @property
    def control_address(self) -> str:
        """The Control API as the operator's ``flwr`` CLI sees it: the proxy's loopback listener."""
        return f"127.0.0.1:{self.control_port}"

    @property
    def superlink_address(self) -> str:
        """The SuperLink itself: loopback only, so nothing on the network reaches its Control API."""
        return f"127.0.0.1:{self.superlink_port}"

    def start(self) -> None:
        """Certificates and keys, SuperLink (loopback), the nginx proxy, key registration, SuperNodes."""
        nginx = nginx_binary()  # before anything starts: a missing nginx is one line, not a half deployment
        self.root.mkdir(parents=True, exist_ok=True)
        hosts = tuple(dict.fromkeys((self.host, "127.0.0.1", "localhost")))
        self.pki = pki = make_pki(self.root / "pki", self.num_nodes, hosts=hosts)
        self.superlink_port, self.port = free_port("127.0.0.1"), free_port(self.host)
        self.control_port = free_port("127.0.0.1")
        write_flwr_config(self.flwr_home, self.control_address, pki.ca_cert)
        self.superlink = Proc("superlink", [
            _bin("flower-superlink"), "--ssl-ca-certfile", str(pki.ca_cert), "--ssl-certfile", str(pki.server_cert),
            "--ssl-keyfile", str(pki.server_key), "--enable-supernode-auth", "--host", "127.0.0.1",
            "--port", str(self.superlink_port), "--disable-runtime-dependency-installation",
        ], self.logs / "superlink.log", {**self._env(self.flwr_home), FLEET_BOUND_ENV: self.max_object_body},
            cwd=self.root)  # the ServerApp it starts checks a run against the proxy's bound
        conf = render_proxy_conf(superlink=self.superlink_address, fleet_listen=self.address,
                                 control_listen=self.control_address, cert=pki.server_cert, key=pki.server_key,
                                 ca=pki.ca_cert, tls_name="localhost", max_object_body=self.max_object_body)
        main_conf = write_proxy_files(self.root / "proxy", self.logs, conf)
        self.proxy = Proc("fleet-proxy", [nginx, "-p", str(self.root / "proxy"), "-c", str(main_conf),
                                          "-g", "daemon off;"], self.logs / "fleet-proxy.log", self._env(self.flwr_home))
        wait_for_port("127.0.0.1", self.superlink_port, self.startup_timeout, self.superlink)
        wait_for_port(self.host, self.port, self.startup_timeout, self.proxy)
        wait_for_port("127.0.0.1", self.control_port, self.startup_timeout, self.proxy)
        for i in range(self.num_nodes):
            self.register(pki.node_public(i))
        for i in range(self.num_nodes):
            self.start_node(i)

    def stop(self) -> None:
        """Stop every process this deployment started (SuperNodes and executors first, SuperLink last),
        and the SuperNodes ``fedpers deploy restart-node`` started for it since."""
        for proc in [*self._extra, *self.executors.values(), *self.nodes.values()]:
            _stop_tree(proc, grace=3.0)
        for i in range(self.num_nodes):
            stop_recorded_node(self.root, i)
        for proc in (self.proxy, self.superlink):
            if proc is not None:
                _stop_tree(proc, grace=5.0)
        self._extra.clear()

    def pids(self) -> list[int]:
        """PIDs of the processes started directly (their children are stopped with them)."""
        procs = [self.superlink, self.proxy, *self.nodes.values(), *self.executors.values(), *self._extra]
        return [p.pid for p in procs if p is not None]

    # --- SuperNodes ----------------------------------------------------------------------------------
    def register(self, public_key: Path) -> None:
        """Register a SuperNode public key with the SuperLink (``flwr supernode register``)."""
        res = self.flwr(["supernode", "register", str(public_key), FEDERATION], timeout=120)
        if res.returncode != 0 or "registered successfully" not in res.stdout:
            raise FedpersError(f"flwr supernode register {public_key.name} failed:\n{res.stdout}{res.stderr}")

    def start_node(self, i: int, key: Path | None = None, name: str | None = None,
                   num_partitions: int | None = None, state_dir: str | None = None,
                   retry_for: float | None = None) -> Proc:
        """Start SuperNode ``i`` (partition-id ``i``), authenticated with its key (or ``key``), through the
        start wrapper (:mod:`fedpers.apps.supernode_start`: a refusal right after a restart is retried for
        ``retry_for`` seconds, default 150 for the deployment's own nodes and 0 for another ``name``; the
        SuperNode's children end with it). The deployment's own nodes are recorded in ``nodes/`` for
        ``fedpers deploy restart-node``."""
        assert self.pki is not None
        key = key or self.pki.node_keys[i]
        name = name or f"supernode-{i}"
        own = name == f"supernode-{i}"
        port = self.node_ports.get(i) if own else None
        port = port or free_port("127.0.0.1")
        node_config = f"partition-id={i} num-partitions={num_partitions or self.num_nodes}"
        if state_dir:
            node_config += f' state-dir="{state_dir}"'
        home = self.root / f"home-{name}"
        if retry_for is None:
            retry_for = DEFAULT_RETRY_FOR if own else 0.0
        # The SuperNode's own ClientApp-facing port stays on loopback: only its SuperExec connects to it.
        argv = [sys.executable, "-m", "fedpers.apps.supernode_start", "--retry-for", f"{retry_for:g}", "--",
                _bin("flower-supernode"), "--superlink", self.address, "--root-certificates", str(self.pki.ca_cert),
                "--auth-supernode-private-key", str(key), "--node-config", node_config,
                "--host", "127.0.0.1", "--port", str(port), "--isolation", self.isolation]
        if self.isolation == "process":
            argv += ["--superexec-auth-secret-file", str(self.pki.superexec_secret)]
        proc = Proc(name, argv, self.logs / f"{name}.log", self._env(home), cwd=self.root)
        if not own:
            self._extra.append(proc)
            return proc
        self.nodes[i] = proc
        self.node_ports[i] = port
        if self.isolation == "process":  # the ClientApp executor runs as its own process
            wait_for_port("127.0.0.1", port, self.startup_timeout, proc)
            self.executors[i] = self.start_superexec(i, f"superexec-{i}", self.pki.superexec_secret)
        write_node_record(self.root, i, {"node": _launch_record(proc, home),
                                         "superexec": _launch_record(self.executors[i], self.root / f"home-{name}")
                                         if i in self.executors else None})
        return proc

    def start_superexec(self, i: int, name: str, secret: Path | None) -> Proc:
        """A ``flower-superexec`` for SuperNode ``i``'s ClientApps (isolation=process), authenticated with
        ``secret`` (None: without the secret, which the SuperNode must refuse)."""
        argv = [_bin("flower-superexec"), "--runtime-api-address", f"127.0.0.1:{self.node_ports[i]}", "--insecure"]
        if secret is not None:
            argv += ["--superexec-auth-secret-file", str(secret)]
        proc = Proc(name, argv, self.logs / f"{name}.log", self._env(self.root / f"home-supernode-{i}"), cwd=self.root)
        if name != f"superexec-{i}":
            self._extra.append(proc)
        return proc

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and its children (fault injection); its state dir is kept."""
        for procs in (self.executors, self.nodes):
            proc = procs.pop(i, None)
            if proc is not None:
                proc.kill()

    def node_id(self, i: int) -> str | None:
        """Flower node id of SuperNode ``i`` (from its log), once it connected."""
        proc = self.nodes.get(i)
        path = proc.log_path if proc else self.logs / f"supernode-{i}.log"
        ids = re.findall(r"SuperNode ID: (\d+)", path.read_text(errors="replace")) if path.is_file() else []
        return ids[-1] if ids else None

    def node_status(self) -> dict[str, str]:
        """Node id -> status (online, offline, registered, ...) as the SuperLink reports it."""
        res = self.flwr(["supernode", "ls", FEDERATION, "--format", "json"])
        text = res.stdout[res.stdout.find("{"):] if "{" in res.stdout else "{}"
        try:
            nodes = json.loads(text).get("nodes", [])
        except json.JSONDecodeError:
            return {}
        return {str(n.get("node-id")): str(n.get("status")) for n in nodes}

    # --- runs ----------------------------------------------------------------------------------------
    def flwr(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this deployment's private FLWR_HOME."""
        return subprocess.run([_bin("flwr"), *args], env=self._env(self.flwr_home), capture_output=True,
                              text=True, timeout=timeout, cwd=self.root)

    def submit(self, cfg) -> Proc:
        """``flwr run`` of ``cfg`` (streamed to a log); returns the running ``flwr run`` process. The app
        directory holds the app's packages, so the bundle the SuperLink and SuperNodes get is the one
        ``flwr build`` makes of the repository (:mod:`fedpers.apps.bundle`; :attr:`bundle` says its size)."""
        from fedpers.apps.bundle import build, describe
        from fedpers.apps.simulation import write_app_dir

        self._runs += 1
        app = write_app_dir(cfg, self.root / f"app-{self._runs}", code=True)
        self.bundle = describe(build(app))
        proc = Proc(f"flwr-run-{self._runs}", [_bin("flwr"), "run", str(app), FEDERATION, "--stream"],
                    self.logs / f"flwr-run-{self._runs}.log", self._env(self.flwr_home), cwd=self.root)
        self._extra.append(proc)
        return proc

    def wait(self, run: Proc, cfg, timeout: float) -> dict:
        """Wait for a submitted run to end; return its summary, or raise with the run's error line."""
        from fedpers.core.results import read_summary

        end = time.monotonic() + timeout
        while run.alive() and time.monotonic() < end:
            time.sleep(1.0)
        if run.alive():
            _stop_tree(run, grace=2.0)
            raise FedpersError(f"the run did not finish within {timeout:.0f} s (log: {run.log_path})")
        summary_path = Path(cfg.out_dir) / "summary.json"
        log = run.log_path.read_text(errors="replace")
        if not summary_path.is_file() or run_error(log):
            raise FedpersError(run_error(log) or f"the run ended without {summary_path} (log: {run.log_path})")
        return read_summary(cfg.out_dir)

    def run(self, cfg, timeout: float = 3600) -> dict:
        """Submit ``cfg`` and wait for its summary."""
        return self.wait(self.submit(cfg), cfg, timeout)

    def _env(self, flwr_home: Path) -> dict[str, str]:
        env = flower_env(flwr_home)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return env


def run_error(log: str) -> str | None:
    """The fedpers error of a failed run in its streamed log (``FedpersError: ...``), if any."""
    for line in log.splitlines():
        if "FedpersError:" in line:
            return line.split("FedpersError:", 1)[1].strip()
    return None


# --------------------------------------------------------------------------------------------------
# restarting a SuperNode of a running `deploy local` (fedpers deploy restart-node)
# --------------------------------------------------------------------------------------------------
DEFAULT_RETRY_FOR = 150.0  # seconds a restarted SuperNode retries Flower's 305 refusal (supernode_start.py)
NODES_DIR = "nodes"  # OUT/deploy/nodes/supernode-<i>.json: how node i was started, and its current PIDs


def _launch_record(proc: Proc, home: Path) -> dict:
    """How ``proc`` was started (argv, log, cwd, its FLWR_HOME) and which process it is (PID + start time)."""
    return {"argv": proc.argv, "log": str(proc.log_path), "home": str(home), "pid": proc.pid,
            "started": start_time(proc.pid)}


def node_record_path(root: Path, i: int) -> Path:
    """Where SuperNode ``i`` of the deployment in ``root`` (``OUT/deploy``) is recorded."""
    return Path(root) / NODES_DIR / f"supernode-{i}.json"


def write_node_record(root: Path, i: int, record: dict) -> None:
    """Record how SuperNode ``i`` runs (written whole, then renamed: a reader never sees half a file)."""
    path = node_record_path(root, i)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


def _stop_recorded(entry: dict | None, grace: float = 3.0) -> None:
    """Stop the process of a launch record, its process group and its descendants, if it is still the
    recorded process (same PID and start time): a PID reused since is never signalled."""
    if not entry:
        return
    pid = int(entry["pid"])
    if entry.get("started") is None or start_time(pid) != entry["started"]:
        return
    tree = descendants(pid)
    _signal_group(pid, signal.SIGTERM)
    signal_pids([pid, *tree], signal.SIGTERM)
    end = time.monotonic() + grace
    while start_time(pid) == entry["started"] and process_state(pid) != "Z" and time.monotonic() < end:
        time.sleep(0.1)
    if start_time(pid) == entry["started"]:
        signal_pids([pid, *descendants(pid), *tree], signal.SIGKILL)
        _signal_group(pid, signal.SIGKILL)


def stop_recorded_node(root: Path, i: int) -> None:
    """Stop SuperNode ``i`` (and its SuperExec) as recorded in ``root``, whoever started it."""
    path = node_record_path(root, i)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    _stop_recorded(record.get("superexec"))
    _stop_recorded(record.get("node"))


def restart_node(out: str | os.PathLike, i: int) -> dict:
    """``fedpers deploy restart-node --out OUT N``: stop SuperNode ``N`` of the ``deploy local`` running in
    ``OUT`` if it still runs, and start it again as it was started (same key, node config, port, state
    directory), detached from this command; returns its new record. The start wrapper retries while the
    SuperLink still lists the killed node as online (exit 305, for up to 150 s), so this works right after
    a kill. The ``deploy local`` command stops the restarted node when it ends."""
    root = Path(out).resolve() / "deploy"
    path = node_record_path(root, i)
    if not path.is_file():
        have = sorted(p.stem for p in (root / NODES_DIR).glob("supernode-*.json")) if (root / NODES_DIR).is_dir() else []
        raise FedpersError(f"{path}: no SuperNode {i} of a `fedpers deploy local` in {out}"
                           + (f" (it has {', '.join(have)})" if have else " (is `fedpers deploy local --out "
                              f"{out}` running?)"))
    try:
        record = json.loads(path.read_text())
        for entry in (record["node"], record.get("superexec") or {"argv": [], "log": "", "home": ""}):
            entry["argv"], entry["log"], entry["home"]  # noqa: B018 (each key must be there)
    except (ValueError, KeyError, TypeError) as exc:
        raise FedpersError(f"{path}: not a node record of `fedpers deploy local` ({exc})") from None
    if not (root / "pki").is_dir():
        raise FedpersError(f"{root / 'pki'} is missing: the deployment in {out} is gone")
    stop_recorded_node(root, i)
    new: dict = {}
    for kind, entry in (("node", record["node"]), ("superexec", record.get("superexec"))):
        if not entry:
            new[kind] = None
            continue
        env = flower_env(Path(entry["home"]))
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        with open(entry["log"], "ab") as log:
            log.write(f"\n--- fedpers deploy restart-node {i} at {dt.datetime.now().isoformat(timespec='seconds')}"
                      f" ---\n".encode())
            log.flush()
            popen = subprocess.Popen(entry["argv"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root),
                                     start_new_session=True)
        new[kind] = {**entry, "pid": popen.pid, "started": start_time(popen.pid)}
    write_node_record(root, i, new)
    return new


def deploy_config(cfg, out: Path, resume: bool):
    """``cfg`` with absolute paths and, unless set, client state and checkpoint under ``out``; a pooled
    layout is refused (each SuperNode of a deployment is one client, named by its node config)."""
    import shutil

    from fedpers.core.errors import ConfigError

    if cfg.client_layout == "pool":
        raise ConfigError("config key 'client_layout': pool is a simulation layout; a deployment runs one client "
                          "per SuperNode (use nodes or auto)")
    changes: dict[str, object] = {"out_dir": str(out)}
    for key in ("dataset", "data_dir", "partition_file"):
        value = str(cfg[key])
        if value and Path(value).exists():
            changes[key] = str(Path(value).resolve())
    state = Path(cfg.client_state_dir).resolve() if cfg.client_state_dir else out / "deploy" / "state"
    ckpt = Path(cfg.checkpoint_dir).resolve() if cfg.checkpoint_dir else out / "checkpoint"
    if not resume and not cfg.client_state_dir and state.exists():
        shutil.rmtree(state)  # a fresh experiment must not pick up another run's heads
    changes.update(client_state_dir=str(state), checkpoint_dir=str(ckpt))
    return cfg.replace(**changes)


def deploy_local(cfg, clients: int, out: str | os.PathLike, isolation: str = "subprocess",
                 timeout: float = 3600, max_object_body: str = DEFAULT_FLEET_MAX_OBJECT_BODY) -> dict:
    """``fedpers deploy local``: run ``cfg`` on a fresh loopback deployment of ``clients`` SuperNodes, whose
    proxy accepts push-object bodies up to ``max_object_body`` (a run that needs more is refused first)."""
    out = Path(out).resolve()
    if clients != cfg.num_clients:
        cfg = cfg.replace(num_clients=clients)
    bound = nginx_size(max_object_body, "--fleet-max-object-body")
    bodies = check_fleet_bound(cfg, bound)  # before anything is written or started
    cfg = deploy_config(cfg, out, resume=bool(cfg.resume))
    out.mkdir(parents=True, exist_ok=True)
    # `kill` of this command stops what it started (the CLI has its own handler for it already: exit 143)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        with contextlib.suppress(ValueError):  # not in the main thread: Ctrl-C still works
            signal.signal(signal.SIGTERM, _raise_interrupt)
    print(f"fedpers | deploy: {bodies.line(bound)}", flush=True)
    with LocalDeployment(out / "deploy", clients, isolation=isolation, max_object_body=max_object_body) as dep:
        print(f"fedpers | deploy: SuperLink https://{dep.superlink_address} (loopback, TLS, SuperNode auth, pid "
              f"{dep.superlink.pid}) behind nginx: Fleet API https://{dep.address}, Control API "
              f"https://{dep.control_address}; {clients} SuperNodes ({isolation} isolation), logs {dep.logs}; "
              f"restart a killed SuperNode: fedpers deploy restart-node --out {out} N", flush=True)
        run = dep.submit(cfg)
        print(f"fedpers | deploy: {dep.bundle}, sent to the SuperLink and each SuperNode", flush=True)
        return dep.wait(run, cfg, timeout)


def _raise_interrupt(signum, frame) -> None:
    from fedpers.core.errors import Interrupted

    raise Interrupted(signum)


# Every name the compose stack's TLS listeners are reached by: SuperNodes -> fleet-proxy, the ServerApp
# runner -> runtime-proxy, the operator and the registrar -> 127.0.0.1 (Control, in fleet-proxy's network
# namespace), the proxies -> the SuperLink (verified as `superlink`), health checks -> localhost.
# `fedpers deploy certs --host NAME` adds to these, never replaces them.
DEFAULT_CERT_HOSTS = ("fleet-proxy", "runtime-proxy", "superlink", "localhost", "127.0.0.1")


# `fedpers deploy certs --nodes` at most: one key pair per SuperNode an operator provisions by hand from one
# folder. A fleet beyond this is not run from one folder of private keys, and a slip of the keyboard (an
# extra zero) would otherwise write hundreds of thousands of key files for minutes before anyone noticed.
MAX_CERT_NODES = 1000
# One label of a DNS name (RFC 1123): letters, digits and hyphens, 1 to 63 of them, no hyphen at either end.
_DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_host_name(host: str) -> bool:
    """Whether ``host`` can name a server in a certificate: an IP address, or a DNS name of RFC 1123 labels
    (at most 253 characters)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return len(host) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in host.split("."))


def cert_hosts(extra: Iterable[str] = ()) -> list[str]:
    """The SuperLink certificate's names: :data:`DEFAULT_CERT_HOSTS`, then each of ``extra`` not among them
    (in order, without repeats). A name that is neither a DNS name nor an IP address is refused: a
    certificate made with it is valid for no address a SuperNode can reach."""
    extra = [h.strip() for h in extra if h.strip()]
    for host in extra:
        if not is_host_name(host):
            raise FedpersError(f"--host {shown(host)}: not a DNS name (letters, digits, hyphens and dots, each "
                               "label at most 63 characters) or an IP address")
    return list(dict.fromkeys([*DEFAULT_CERT_HOSTS, *extra]))


def check_cert_days(days: int) -> None:
    """Refuse a validity outside 1..:data:`MAX_CERT_DAYS` days (one line naming ``--days``)."""
    if not 1 <= days <= MAX_CERT_DAYS:
        raise FedpersError(f"--days must be 1..{MAX_CERT_DAYS} (the longest a TLS server certificate may be valid for "
                           f"Apple's platforms, which an edge SuperNode may run on), got {days}")


def certificate_names(pem: Path) -> list[str]:
    """The subject alternative names of the certificate in ``pem``, in order (DNS names and IP addresses)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(getattr(name, "value", name)) for name in sans]


def certificate_expiry(pem: Path) -> dt.datetime:
    """When the certificate in ``pem`` stops being valid (UTC)."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.read_bytes()).not_valid_after_utc


def make_certs(out: str | os.PathLike, nodes: int, hosts: Iterable[str], *, force: bool = False,
               days: int = DEFAULT_CERT_DAYS) -> Pki:
    """``fedpers deploy certs``: CA, SuperLink certificate for ``hosts`` (the caller adds them to
    :data:`DEFAULT_CERT_HOSTS` with :func:`cert_hosts`), both valid for ``days``, SuperNode key pairs. A
    directory that already holds a CA is refused unless ``force``: replacing a CA invalidates every
    certificate and node registration made with it (:func:`renew_certs` keeps them)."""
    check_cert_days(days)
    if not 1 <= nodes <= MAX_CERT_NODES:
        raise FedpersError(f"--nodes must be 1..{MAX_CERT_NODES} (one key pair per SuperNode), got {nodes}")
    if not str(out).strip():
        raise FedpersError("--out must name a directory, not be empty")
    d = Path(out)
    with removed_if_refused(d):
        writable_dir(d, "--out")
    existing = [p.name for p in (d / "ca.crt", d / "ca.key") if p.exists()]
    if existing and not force:
        raise FedpersError(f"{out} already holds a CA ({', '.join(existing)}): pass --force to replace it "
                           "(certificates and registered node keys made with it stop working)")
    if not existing:  # no CA of ours here: a file of these names is the user's own, never replaced
        names = ["server.pem", "server.key", SUPEREXEC_SECRET]
        names += [f"supernode-{i}.key{pub}" for i in range(nodes) for pub in ("", ".pub")]
        mine = [name for name in names if (d / name).exists()]
        if mine:
            raise FedpersError(f"{out} already holds {', '.join(mine[:3])}{' ...' if len(mine) > 3 else ''} but no "
                               "CA: move those files away or choose another --out (they are never replaced)")
    try:
        return make_pki(out, nodes, hosts=tuple(hosts), days=days)
    except OSError as exc:
        raise FedpersError(f"--out {out} cannot be written ({exc.strerror or exc})") from None


def renew_certs(out: str | os.PathLike, extra_hosts: Iterable[str] = (), *, days: int = DEFAULT_CERT_DAYS) -> Pki:
    """``fedpers deploy certs --renew``: a new CA certificate signed with the CA key already in ``out`` (same
    subject and key) and a new SuperLink certificate (a new key) for the names the current one holds plus
    ``extra_hosts``, both valid for ``days``; the SuperNode keys (so their registrations) and the superexec
    secret are kept. A SuperNode still holding the previous ``ca.crt`` verifies the new SuperLink certificate
    until that ``ca.crt`` itself expires."""
    check_cert_days(days)
    d = Path(out)
    if not (d / "ca.key").is_file():
        raise FedpersError(f"{d / 'ca.key'} not found: --renew signs with the CA key `fedpers deploy certs` wrote in "
                           f"--out (without it, make new certificates and keys without --renew)")
    current = certificate_names(d / "server.pem") if (d / "server.pem").is_file() else []
    try:
        ca_cert, ca_key = make_ca(d, days, reuse_key=True)
        server_cert, server_key = make_server_cert(d, ca_cert, ca_key, cert_hosts([*current, *extra_hosts]), days)
    except OSError as exc:
        raise FedpersError(f"--out {out} cannot be written ({exc.strerror or exc})") from None
    except ValueError as exc:  # not a key this command wrote
        raise FedpersError(f"{d / 'ca.key'} is not a CA key of `fedpers deploy certs` ({exc})") from None
    nodes = sorted(d.glob("supernode-*.key"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    secret = d / SUPEREXEC_SECRET
    return Pki(d, ca_cert, ca_key, server_cert, server_key, nodes, secret if secret.is_file() else None)
