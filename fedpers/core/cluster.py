"""Running the Ray simulation on an existing (multi-host) Ray cluster.

With ``ray_address`` set, Flower's Ray backend joins that cluster instead of starting a private Ray.
Client data is not shipped by the driver: every simulated client loads the dataset itself, from the
same path on whatever node its Ray actor runs (so the path must be readable on every node; checked up
front by :func:`check_data_on_nodes`). Per-client state (``context.state``: persistent heads, EMA teachers,
...) is held by Flower's simulation engine in the driver process and travels with each message to the
actor that handles it and back, so it stays correct when a client runs on different nodes in
different rounds.
"""

from __future__ import annotations

import os
import socket

from fedpers.core.errors import ConfigError, DataError, cut, shown
from fedpers.core.schema import Config
from fedpers.core.synthetic import SYNTHETIC


def node_identity() -> str:
    """Where this code runs: the Ray node id inside a Ray worker, else the host name."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - identity is informational
        pass
    return socket.gethostname()


def data_paths(cfg: Config) -> list[str]:
    """Paths every node must be able to read for this run (none for embedded datasets)."""
    if cfg.dataset.endswith(".npz") or os.sep in cfg.dataset:
        paths = [os.path.abspath(cfg.dataset)]
    elif cfg.dataset not in ("digits", SYNTHETIC) and cfg.data_dir:  # both need no file
        paths = [os.path.abspath(cfg.data_dir)]
    else:
        paths = []
    if cfg.partition == "file":
        paths.append(os.path.abspath(cfg.partition_file))
    return paths


def _readable(paths: list[str]) -> tuple[str, str, list[str]]:
    import ray

    missing = [p for p in paths if not os.access(p, os.R_OK)]
    return ray.get_runtime_context().get_node_id(), socket.gethostname(), missing


# How long the check of a ``ray_address`` waits for each of its two answers (a TCP connection, then a reply of
# Ray's GCS): a Ray head answers both in milliseconds, also across a data centre; ``ray.init`` itself retries
# an address that is not a Ray head for minutes, one warning line after another.
RAY_ADDRESS_TIMEOUT_S = 3.0
# The GCS call that tells a Ray head from another server: every Ray driver makes it first (to learn the
# cluster's id), it takes an empty request, and a GCS answers it before anything else is set up.
GCS_CLUSTER_ID_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def check_reachable(address: str, timeout_s: float = RAY_ADDRESS_TIMEOUT_S) -> None:
    """A ``HOST:PORT`` Ray address accepts a TCP connection and answers as Ray's GCS, each within
    ``timeout_s``: ``ray.init`` retries an address that is closed, or open but not a Ray head (a web server,
    another service), for minutes before it fails. Other forms (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not host:
        return
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"config key 'ray_address': expected HOST:PORT, got {shown(address)}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:  # refused, unknown host, no route, timed out
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"config key 'ray_address': no Ray cluster answers at {cut(address)} "
                          f"({reason})") from None
    problem = _not_a_gcs(address, timeout_s)
    if problem:
        raise ConfigError(f"config key 'ray_address': no Ray cluster answers at {cut(address)} (a server "
                          f"listens there but {problem}: not a Ray head's GCS port)")


def _not_a_gcs(address: str, timeout_s: float) -> str | None:
    """What tells that ``address`` is not Ray's GCS (None when it answers as one): one gRPC call of
    :data:`GCS_CLUSTER_ID_METHOD` with a deadline of ``timeout_s``. A GCS that refuses the call for want of
    a token (a cluster with token authentication) is a GCS; a TLS cluster (``RAY_USE_TLS``) is left to
    Ray, whose client holds its certificates."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(GCS_CLUSTER_ID_METHOD, request_serializer=lambda _: b"",
                                   response_deserializer=bytes)
        try:
            call(None, timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"gave no gRPC answer within {timeout_s:g} s"
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return "is a gRPC server without Ray's GCS service"
            return "does not speak gRPC"
    return None


def check_data_on_nodes(cfg: Config, timeout_s: float = 120.0) -> int:
    """Connect to ``cfg.ray_address``, run a tiny task pinned to every alive node that checks the run's
    data paths, disconnect. Returns the number of alive nodes; a node that cannot read a path is a
    DataError naming the node and the path. ``timeout_s`` bounds the wait for a node to answer. The CLI
    checks the address with :func:`check_reachable` first (``ray.init`` retries a wrong one for minutes)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    paths = data_paths(cfg)
    try:
        ray.init(address=cfg.ray_address, logging_level="ERROR", log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - unreachable, not a Ray cluster, another Ray version: one line
        raise ConfigError(f"config key 'ray_address': cannot join the Ray cluster at {cfg.ray_address} "
                          f"({type(exc).__name__}: {cut(str(exc).strip())})") from None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        probe = ray.remote(num_cpus=0)(_readable)
        futures = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(paths) for n in nodes]
        for node, future in zip(nodes, futures):
            try:
                _, host, missing = ray.get(future, timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - report which node did not answer
                raise DataError(f"Ray node {node['NodeManagerAddress']} ({node['NodeID'][:8]}) did not "
                                f"answer the data check ({type(exc).__name__})") from None
            if missing:
                raise DataError(f"Ray node {node['NodeManagerAddress']} ({host}) cannot read {missing[0]}: "
                                "put the data at the same path on every node")
        return len(nodes)
    finally:
        ray.shutdown()


class LocalRayCluster:
    """A Ray cluster of ``num_nodes`` nodes as separate ``ray start --block`` processes on 127.0.0.1
    (for tests and benchmarks on one machine). Every process group it starts is killed by PID on
    :meth:`stop`; it never runs ``ray stop``, which would end every Ray on the machine."""

    def __init__(self, num_nodes: int = 2, cpus_per_node: int = 1, port: int | None = None,
                 start_timeout_s: float = 90.0):
        import subprocess
        import sys
        import tempfile
        import time

        self.port = port or _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._tmp = tempfile.mkdtemp(prefix="fedpers-ray-")
        self.processes: list[subprocess.Popen] = []
        ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        common = ["--block", "--num-cpus", str(cpus_per_node), "--node-ip-address", "127.0.0.1",
                  "--disable-usage-stats"]
        try:
            self._start([ray_cli, "start", "--head", "--port", str(self.port), "--include-dashboard", "false",
                         "--temp-dir", self._tmp, *common], env, "head")
            self._wait_for_nodes(1, start_timeout_s)
            for i in range(1, num_nodes):
                self._start([ray_cli, "start", "--address", self.address, *common], env, f"worker{i}")
            self._wait_for_nodes(num_nodes, start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self._started = time.time()

    def _start(self, cmd: list[str], env: dict, name: str) -> None:
        import subprocess

        log = open(os.path.join(self._tmp, f"{name}.log"), "w")
        self.processes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def _wait_for_nodes(self, count: int, timeout_s: float) -> None:
        import subprocess
        import sys
        import time

        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                 "print(sum(1 for n in ray.nodes() if n['Alive'])); ray.shutdown()")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"a Ray node exited at start-up (logs in {self._tmp})")
            out = subprocess.run([sys.executable, "-c", probe, self.address], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= count:
                return
            time.sleep(2)
        raise RuntimeError(f"Ray cluster did not reach {count} nodes in {timeout_s:.0f} s (logs in {self._tmp})")

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index`` (0 = head) and everything it started."""
        import signal

        try:
            os.killpg(self.processes[index].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.processes[index].wait(timeout=30)

    def stop(self) -> None:
        """Kill every node's process group, workers first."""
        for index in reversed(range(len(self.processes))):
            self.kill_node(index)

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
