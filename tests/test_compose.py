"""docker-compose.yml against the deployment rules below (static; `make compose-check` runs the stack live).

Each rule is a function returning its violations, so every test also runs on a deliberately broken copy of
the file and must fail there: a check that cannot fail checks nothing.
"""
from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SECRETS_DIRS = ("/run/fedpers-secrets/", "/run/secrets/")  # the entry point's private copies, compose's mounts
CERTS_SOURCE = "${FEDPERS_CERTS:-./deploy/certs}"


def load(name: str = "docker-compose.yml") -> dict:
    return yaml.safe_load((ROOT / name).read_text())


@pytest.fixture(scope="module")
def compose():
    return load()


# --- helpers ------------------------------------------------------------------------------------------
def _opts(argv) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv or [] if isinstance(a, str) and a.startswith("--") and "=" in a)


WRAPPER = "fedpers-supernode-start"  # fedpers/apps/supernode_start.py: its own options, then -- and Flower's


def _flower_command(service: dict) -> list[str]:
    """The Flower program and its arguments, past the SuperNode start wrapper if there is one."""
    cmd = [str(a) for a in service.get("command") or []]
    if cmd[:1] == [WRAPPER]:
        return cmd[cmd.index("--") + 1:] if "--" in cmd else []
    return cmd


def _program(service: dict) -> str | None:
    cmd = _flower_command(service)
    return cmd[0] if cmd else None


def _runtime_target(service: dict) -> str:
    return _opts(service.get("command")).get("--runtime-api-address", "")


def _is_serverapp_runner(service: dict) -> bool:
    return _runtime_target(service).startswith("runtime-proxy:")


def _supernodes(services: dict) -> dict[str, dict]:
    return {n: s for n, s in services.items() if _program(s) == "flower-supernode"}


def _runners(services: dict, default_profile_only: bool = True) -> dict[str, dict]:
    """flower-superexec services (ServerApp and ClientApp runners)."""
    return {n: s for n, s in services.items() if _program(s) == "flower-superexec"
            and not (default_profile_only and s.get("profiles"))}


def _secret_names(service: dict) -> set[str]:
    return {s if isinstance(s, str) else s.get("source") for s in service.get("secrets", [])}


def _volume_sources(service: dict) -> list[str]:
    out = []
    for v in service.get("volumes", []):
        out.append(v.split(":", 1)[0] if isinstance(v, str) else str(v.get("source", "")))
    return out


def _named_files(service: dict) -> set[str]:
    """Basenames of the secret files a service's command, entry point, environment and healthcheck name."""
    texts = [str(a) for a in (service.get("command") or []) + (service.get("entrypoint") or [])]
    texts += [str(a) for a in service.get("command") or [] if isinstance(a, str)]
    texts += [str(v) for v in (service.get("environment") or {}).values()]
    texts += [str(a) for a in (service.get("healthcheck", {}).get("test") or [])]
    names = set()
    for text in texts:
        for d in SECRETS_DIRS:
            names |= set(re.findall(re.escape(d) + r"([A-Za-z0-9_.-]+)", text))
    env = service.get("environment") or {}
    if any("register-supernodes.sh" in str(a) for a in service.get("entrypoint") or []):
        # the script reads $CERTS_DIR/ca.crt and $CERTS_DIR/supernode-<i>.key.pub for i < NUM_SUPERNODES
        assert env.get("CERTS_DIR") == "/run/fedpers-secrets"
        names |= {"ca.crt"} | {f"supernode-{i}.key.pub" for i in range(int(env["NUM_SUPERNODES"]))}
    return names


# --- the rules --------------------------------------------------------------------------------------------
def rule_no_ca_key_or_certs_dir(c: dict) -> list[str]:
    bad = []
    for name, spec in (c.get("secrets") or {}).items():
        if Path(str(spec.get("file", ""))).name == "ca.key" or name == "ca.key":
            bad.append(f"secret {name} is the CA key")
    for name, s in c["services"].items():
        for src in _volume_sources(s):
            norm = src.rstrip("/")
            if norm in ("./deploy/certs", "deploy/certs", CERTS_SOURCE) or Path(norm).name == "ca.key" \
                    or "deploy/certs" in norm or "FEDPERS_CERTS" in norm:
                bad.append(f"{name} mounts {src} (certs belong in compose secrets, one file each)")
        for secret in _secret_names(s):
            spec = (c.get("secrets") or {}).get(secret, {})
            if Path(str(spec.get("file", ""))).name == "ca.key":
                bad.append(f"{name} gets the CA key as secret {secret}")
    return bad


def rule_only_proxy_publishes(c: dict) -> list[str]:
    """Only fleet-proxy publishes a port, and only its Fleet listener; its Control listener is a loopback
    address of its own network namespace (never published: Docker's forwarding accepts traffic to a
    published port whatever the host address says)."""
    bad = []
    services = c["services"]
    for name, s in services.items():
        if s.get("network_mode") == "host":
            bad.append(f"{name} uses the host network")
        if s.get("ports") and name != "fleet-proxy":
            bad.append(f"{name} publishes {s['ports']}")
    proxy = services.get("fleet-proxy")
    if proxy is None:
        return bad + ["no fleet-proxy service"]
    env = proxy.get("environment") or {}
    control = str(env.get("CONTROL_LISTEN", ""))
    fleet = str(env.get("FLEET_LISTEN", "")).rsplit(":", 1)[-1]
    published = {str(p).split(":")[-1]: str(p) for p in proxy.get("ports", [])}
    if not control.startswith("127.0.0.1:"):
        bad.append(f"fleet-proxy's Control listener {control!r} is not on 127.0.0.1")
    if fleet not in published:
        bad.append(f"fleet-proxy does not publish its Fleet listener {fleet}")
    if set(published) - {fleet}:
        bad.append(f"fleet-proxy publishes more than the Fleet listener: {sorted(published.values())}")
    return bad


def rule_superlink_on_loopback_with_the_proxies(c: dict) -> list[str]:
    """The SuperLink listens on 127.0.0.1 inside fleet-proxy's network namespace (no network of its own),
    and the proxies forward there; only the operator's side shares the namespace besides them."""
    bad = []
    services = c["services"]
    link = services.get("superlink", {})
    if link.get("network_mode") != "service:fleet-proxy" or link.get("networks") or link.get("ports"):
        bad.append("superlink is not (only) in fleet-proxy's network namespace")
    host, port = _opts(link.get("command")).get("--host"), _opts(link.get("command")).get("--port")
    if host != "127.0.0.1":
        bad.append(f"superlink listens on {host}, not 127.0.0.1")
    for name in ("fleet-proxy", "runtime-proxy"):
        target = str((services.get(name, {}).get("environment") or {}).get("SUPERLINK_ADDRESS"))
        if target != f"127.0.0.1:{port}":
            bad.append(f"{name} forwards to {target}, not the SuperLink's 127.0.0.1:{port}")
    sharing = {n for n, s in services.items() if s.get("network_mode") == "service:fleet-proxy"}
    if sharing != {"superlink", "runtime-proxy", "operator", "register-supernodes"}:
        bad.append(f"fleet-proxy's network namespace is shared by {sorted(sharing)}")
    return bad


def rule_each_clientapp_on_its_own_node_network(c: dict) -> list[str]:
    """A ClientApp runner is on one internal network, node-N, with its SuperNode only; the SuperNode's
    Runtime API binds to its address there; the ServerApp runner is alone with runtime-proxy."""
    bad = []
    services, networks = c["services"], c.get("networks") or {}
    members: dict[str, set[str]] = {}
    for name, s in services.items():
        nets = s.get("networks") or ([] if s.get("network_mode") else ["default"])
        for net in (nets if isinstance(nets, list) else list(nets)):
            members.setdefault(net, set()).add(name)
    for name, s in _supernodes(services).items():
        i = name.rsplit("-", 1)[-1]
        net = f"node-{i}"
        if not (networks.get(net) or {}).get("internal"):
            bad.append(f"{net} is not an internal network")
        if members.get(net) != {name, f"clientapp-{i}"}:
            bad.append(f"{net} holds {sorted(members.get(net, []))}, not just {name} and clientapp-{i}")
        aliases = ((s.get("networks") or {}).get(net) or {}).get("aliases", []) if isinstance(
            s.get("networks"), dict) else []
        bind = _opts(s.get("command")).get("--bind-host-of")
        if not bind or bind not in aliases:
            bad.append(f"{name}'s Runtime API is not bound to its {net} address (--bind-host-of an alias there)")
        runner = services.get(f"clientapp-{i}", {})
        if (runner.get("networks") or []) != [net]:
            bad.append(f"clientapp-{i} is on {runner.get('networks')}, not [{net}] only")
        if _runtime_target(runner).split(":")[0] not in {bind, name}:
            bad.append(f"clientapp-{i} talks to {_runtime_target(runner)}, not its own SuperNode")
    if members.get("serverappio") != {"serverapp", "fleet-proxy"} or not (networks.get("serverappio") or {}).get(
            "internal"):
        bad.append(f"the internal serverappio network holds {sorted(members.get('serverappio', []))}, "
                   "not just the ServerApp runner (and fleet-proxy's namespace)")
    return bad


def rule_named_files_mounted(c: dict) -> list[str]:
    bad = []
    declared = set(c.get("secrets") or {})
    for name, s in c["services"].items():
        have = _secret_names(s)
        for missing in sorted(_named_files(s) - have):
            bad.append(f"{name} names {missing} but does not get it as a secret")
        for undeclared in sorted(have - declared):
            bad.append(f"{name} uses undeclared secret {undeclared}")
        for src in _volume_sources(s):
            if src.startswith("./") and not (ROOT / src).exists():
                bad.append(f"{name} mounts missing {src}")
            elif not src.startswith(("./", "/")) and src not in (c.get("volumes") or {}):
                bad.append(f"{name} mounts undeclared volume {src}")
    return bad


def rule_supernodes_via_proxy(c: dict) -> list[str]:
    bad = []
    services = c["services"]
    proxy = services.get("fleet-proxy", {})
    fleet_port = str((proxy.get("environment") or {}).get("FLEET_LISTEN", "")).rsplit(":", 1)[-1]
    for name, s in _supernodes(services).items():
        target = _opts(s["command"]).get("--superlink")
        if target != f"fleet-proxy:{fleet_port}":
            bad.append(f"{name} connects to {target}, not the proxy")
        if s.get("network_mode"):
            bad.append(f"{name} shares another service's network namespace ({s['network_mode']})")
    return bad


def rule_one_runner_per_supernode(c: dict) -> list[str]:
    services = c["services"]
    wanted = sorted(f"{_opts(s['command']).get('--bind-host-of', n)}:{_opts(s['command']).get('--port', '9094')}"
                    for n, s in _supernodes(services).items())
    got = sorted(_runtime_target(s) for s in _runners(services).values() if not _is_serverapp_runner(s))
    bad = [] if got == wanted and wanted else [f"default-profile ClientApp runners {got} != SuperNodes {wanted}"]
    if not any(_is_serverapp_runner(s) for s in _runners(services).values()):
        bad.append("no ServerApp runner in the default profile")
    return bad


def rule_superexec_secret_both_ends(c: dict) -> list[str]:
    bad = []
    services = c["services"]
    flag = "--superexec-auth-secret-file"
    by_alias = {_opts(s["command"]).get("--bind-host-of"): n for n, s in _supernodes(services).items()}
    by_alias["runtime-proxy"] = "superlink"  # runtime-proxy passes the ServerApp runner to the SuperLink
    for name, s in _runners(services, default_profile_only=False).items():
        host = _runtime_target(s).rsplit(":", 1)[0]
        peer = services.get(by_alias.get(host, host))
        mine = _opts(s["command"]).get(flag)
        theirs = _opts((peer or {}).get("command")).get(flag)  # the wrapper's argv holds Flower's too
        if not mine or not theirs:
            bad.append(f"{name} <-> {host}: {flag} missing on {'both ends' if not (mine or theirs) else 'one end'}")
        elif Path(mine).name != Path(theirs).name:
            bad.append(f"{name} <-> {host}: different secrets {mine} / {theirs}")
    return bad


def rule_health_and_ordering(c: dict) -> list[str]:
    bad = []
    services = c["services"]
    for name in ("superlink", "fleet-proxy", "runtime-proxy"):
        test = services.get(name, {}).get("healthcheck", {}).get("test")
        if not test:
            bad.append(f"{name} has no healthcheck")
    link_health = services.get("superlink", {}).get("healthcheck", {}).get("test") or []
    if not any("/health" in str(a) and "https://" in str(a) for a in link_health):
        bad.append("the SuperLink healthcheck does not GET /health over TLS")
    proxy_health = " ".join(map(str, services.get("fleet-proxy", {}).get("healthcheck", {}).get("test") or []))
    if "/health" not in proxy_health:
        bad.append("fleet-proxy's healthcheck does not include the SuperLink's /health")
    for name, s in services.items():
        deps = s.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        if "superlink" in deps and deps["superlink"].get("condition") != "service_healthy":
            bad.append(f"{name} does not wait for a healthy SuperLink")
        if name in _supernodes(services) and deps.get("fleet-proxy", {}).get("condition") != "service_healthy":
            bad.append(f"{name} does not wait for a healthy fleet-proxy")
    for name in ("runtime-proxy", "register-supernodes"):
        if "superlink" not in (services.get(name, {}).get("depends_on") or {}):
            bad.append(f"{name} does not depend on the SuperLink")
    serverapp_deps = services.get("serverapp", {}).get("depends_on") or {}
    if not isinstance(serverapp_deps, dict) or serverapp_deps.get("runtime-proxy", {}).get("condition") != \
            "service_healthy":
        bad.append("serverapp does not wait for a healthy runtime-proxy")
    return bad


def rule_runners_read_the_data_only(c: dict) -> list[str]:
    """A runner executes the code of whatever run it is handed: it mounts the shared ``data`` volume
    read-only (no run changes the datasets of the next, or of another node) and does not take it over."""
    bad = []
    for name, s in _runners(c["services"], default_profile_only=False).items():
        for volume in s.get("volumes", []):
            if isinstance(volume, str) and volume.split(":", 1)[0] == "data" and not volume.endswith(":ro"):
                bad.append(f"{name} mounts the data volume read-write ({volume})")
        if "/data" in str((s.get("environment") or {}).get("FEDPERS_OWN_DIRS", "")).split():
            bad.append(f"{name} takes /data over at start (FEDPERS_OWN_DIRS): a read-only mount cannot be chowned")
    return bad


def rule_every_service_has_a_memory_limit(c: dict) -> list[str]:
    """Every service has ``mem_limit``: the service key docker-compose 1.29 applies to a Compose
    Specification file (no ``version:``) without ``--compatibility``, which ``deploy.resources.limits``
    would need."""
    bad = []
    for name, s in c["services"].items():
        if not re.fullmatch(r"\d+[kmg]", str(s.get("mem_limit", ""))):
            bad.append(f"{name} has no mem_limit")
        if (s.get("deploy") or {}).get("resources", {}).get("limits"):
            bad.append(f"{name} sets deploy.resources.limits, which docker-compose 1.29 ignores")
    return bad


def rule_a_supernode_that_gave_up_waits_and_shows_it(c: dict) -> list[str]:
    """Under ``restart: unless-stopped`` (which starts a container again whatever its exit status) the
    SuperNode start wrapper waits after giving up instead of exiting, and the health check reads the cause
    it writes: no restart loop, and ``docker compose ps`` shows the node unhealthy."""
    from fedpers.apps.supernode_start import GAVE_UP_FILE

    bad = []
    for name, s in _supernodes(c["services"]).items():
        cmd = [str(a) for a in s.get("command") or []]
        wrapper_opts = cmd[1:cmd.index("--")] if cmd[:1] == [WRAPPER] and "--" in cmd else []
        if s.get("restart") == "unless-stopped" and "--wait-after-giving-up" not in wrapper_opts:
            bad.append(f"{name}: its start wrapper exits after giving up, and unless-stopped restarts it forever")
        if GAVE_UP_FILE.name not in " ".join(map(str, (s.get("healthcheck") or {}).get("test") or [])):
            bad.append(f"{name}: its health check does not read the wrapper's {GAVE_UP_FILE.name}")
    return bad


RULES = [rule_no_ca_key_or_certs_dir, rule_only_proxy_publishes, rule_superlink_on_loopback_with_the_proxies,
         rule_each_clientapp_on_its_own_node_network, rule_named_files_mounted,
         rule_supernodes_via_proxy, rule_one_runner_per_supernode, rule_superexec_secret_both_ends,
         rule_health_and_ordering, rule_runners_read_the_data_only, rule_every_service_has_a_memory_limit,
         rule_a_supernode_that_gave_up_waits_and_shows_it]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_compose_rule_holds(compose, rule):
    assert rule(compose) == []


# --- broken copies: each must be caught by its rule ----------------------------------------------------------
def _drop_flag(argv, flag):
    return [a for a in argv if not str(a).startswith(flag)]


BREAKS = {
    "certs dir mounted": (rule_no_ca_key_or_certs_dir,
                          lambda c: c["services"]["superlink"].setdefault("volumes", []).append("./deploy/certs:/certs:ro")),
    "ca.key as a secret": (rule_no_ca_key_or_certs_dir, lambda c: (
        c["secrets"].__setitem__("ca.key", {"file": f"{CERTS_SOURCE}/ca.key"}),
        c["services"]["register-supernodes"]["secrets"].append("ca.key"))),
    "superlink publishes": (rule_only_proxy_publishes, lambda c: c["services"]["superlink"].__setitem__("ports", ["9093:9093"])),
    "control published": (rule_only_proxy_publishes, lambda c: c["services"]["fleet-proxy"].__setitem__(
        "ports", ["9093:9093", "127.0.0.1:9095:9095"])),
    "control on all interfaces": (rule_only_proxy_publishes, lambda c: c["services"]["fleet-proxy"][
        "environment"].__setitem__("CONTROL_LISTEN", "9095")),
    "superlink on a network": (rule_superlink_on_loopback_with_the_proxies, lambda c: (
        c["services"]["superlink"].pop("network_mode"), c["services"]["superlink"].__setitem__("networks", ["fleet"]))),
    "superlink on every interface": (rule_superlink_on_loopback_with_the_proxies,
                                     lambda c: c["services"]["superlink"]["command"].__setitem__(
                                         c["services"]["superlink"]["command"].index("--host=127.0.0.1"),
                                         "--host=0.0.0.0")),
    "serverapp in the proxy's namespace": (rule_superlink_on_loopback_with_the_proxies, lambda c: (
        c["services"]["serverapp"].pop("networks"), c["services"]["serverapp"].__setitem__(
            "network_mode", "service:fleet-proxy"))),
    "clientapp on the fleet network": (rule_each_clientapp_on_its_own_node_network,
                                       lambda c: c["services"]["clientapp-1"]["networks"].append("fleet")),
    "clientapp on another node's network": (rule_each_clientapp_on_its_own_node_network,
                                            lambda c: c["services"]["clientapp-1"].__setitem__("networks", ["node-0"])),
    "node network not internal": (rule_each_clientapp_on_its_own_node_network,
                                  lambda c: c["networks"].__setitem__("node-2", {})),
    "supernode runtime on every interface": (rule_each_clientapp_on_its_own_node_network,
                                             lambda c: c["services"]["supernode-0"]["command"].remove(
                                                 "--bind-host-of=supernode-0-runtime")),
    "node key not mounted": (rule_named_files_mounted,
                             lambda c: c["services"]["supernode-1"]["secrets"].remove("supernode-1.key")),
    "proxy key not mounted": (rule_named_files_mounted,
                              lambda c: c["services"]["fleet-proxy"]["secrets"].remove("server.key")),
    "registrar without a public key": (rule_named_files_mounted, lambda c: c["services"]["register-supernodes"]["secrets"].remove(
        "supernode-2.key.pub")),
    "supernode straight to the superlink": (rule_supernodes_via_proxy, lambda c: c["services"]["supernode-0"].__setitem__(
        "command", [a if not a.startswith("--superlink=") else "--superlink=superlink:9093"
                    for a in c["services"]["supernode-0"]["command"]])),
    "clientapp runner only in a profile": (rule_one_runner_per_supernode,
                                           lambda c: c["services"]["clientapp-2"].__setitem__("profiles", ["cpu"])),
    "runner without the secret": (rule_superexec_secret_both_ends, lambda c: c["services"]["clientapp-0"].__setitem__(
        "command", _drop_flag(c["services"]["clientapp-0"]["command"], "--superexec-auth-secret-file"))),
    "superlink without the secret": (rule_superexec_secret_both_ends, lambda c: c["services"]["superlink"].__setitem__(
        "command", _drop_flag(c["services"]["superlink"]["command"], "--superexec-auth-secret-file"))),
    "no superlink healthcheck": (rule_health_and_ordering, lambda c: c["services"]["superlink"].pop("healthcheck")),
    "clientapp writes the data": (rule_runners_read_the_data_only, lambda c: c["services"]["clientapp-2"].__setitem__(
        "volumes", ["state-2:/state", "data:/data"])),
    "serverapp takes the data over": (rule_runners_read_the_data_only, lambda c: c["services"]["serverapp"][
        "environment"].__setitem__("FEDPERS_OWN_DIRS", "/results /data")),
    "supernode exits after giving up": (rule_a_supernode_that_gave_up_waits_and_shows_it, lambda c: c["services"][
        "supernode-2"]["command"].remove("--wait-after-giving-up")),
    "supernode without its health check": (rule_a_supernode_that_gave_up_waits_and_shows_it,
                                           lambda c: c["services"]["supernode-0"].pop("healthcheck")),
    "superlink without a memory limit": (rule_every_service_has_a_memory_limit,
                                         lambda c: c["services"]["superlink"].pop("mem_limit")),
    "a limit compose 1.29 ignores": (rule_every_service_has_a_memory_limit, lambda c: c["services"]["operator"].__setitem__(
        "deploy", {"resources": {"limits": {"memory": "1g"}}})),
    "serverapp does not wait for health": (rule_health_and_ordering,
                                           lambda c: c["services"]["serverapp"].__setitem__("depends_on", ["runtime-proxy"])),
}


@pytest.mark.parametrize("what", sorted(BREAKS))
def test_compose_rule_catches_broken_copy(compose, what):
    rule, breaker = BREAKS[what]
    broken = copy.deepcopy(compose)
    breaker(broken)
    assert rule(broken), f"{rule.__name__} did not notice: {what}"


# --- images, overrides, build context ------------------------------------------------------------------------
def test_images_build_from_flower_images(compose):
    dockerfiles = {}
    for name, s in compose["services"].items():
        build = s.get("build")
        if not build:
            assert name in ("fleet-proxy", "runtime-proxy") and s["image"].startswith("nginx:"), name
            continue
        path = ROOT / build["context"] / build["dockerfile"]
        assert path.is_file(), f"{name}: {path} missing"
        dockerfiles[path] = build.get("args", {}).get("BASE_IMAGE")
    for path, base in dockerfiles.items():
        text = path.read_text()
        default = re.search(r"^ARG BASE_IMAGE=(\S+)", text, flags=re.M)
        assert default and re.fullmatch(r"flwr/(superlink|supernode|superexec):1\.42\.0", default.group(1)), path
        assert base == default.group(1), f"{path.name}: compose BASE_IMAGE {base} != {default.group(1)}"
        assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, flags=re.M), path
        assert "fedpers-entrypoint" in text and "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in text
        for src in re.findall(r"^COPY (\S+)", text, flags=re.M):
            assert (ROOT / src).exists(), f"{path.name}: COPY {src} missing"


def test_gpu_override_replaces_the_cpu_runners(compose):
    gpu = load("docker-compose.gpu.yml")["services"]
    cpu_runners = {n for n, s in _runners(compose["services"]).items() if not _is_serverapp_runner(s)}
    assert set(gpu) == cpu_runners  # same names: the override replaces, never adds runners
    for s in gpu.values():
        devices = s["deploy"]["resources"]["reservations"]["devices"]
        assert any("gpu" in d.get("capabilities", []) for d in devices)
        assert s["build"]["args"]["TORCH_INDEX"] == "https://pypi.org/simple" and s["image"] != compose[
            "services"]["clientapp-0"]["image"]
        assert "command" not in s  # commands (and the secret flag) stay those of docker-compose.yml


def test_local_base_override_swaps_only_bases():
    local = load("deploy/compose/local-base.yml")["services"]
    for name, s in local.items():
        if name in ("fleet-proxy", "runtime-proxy"):  # same start-up (render-and-run.sh), Debian's nginx
            assert s == {"image": "fedpers/local-base:bookworm", "user": "root"}, name
            continue
        assert set(s) == {"build"} and set(s["build"]) == {"args"}, name
        assert set(s["build"]["args"]) <= {"BASE_IMAGE", "TORCH", "TORCH_INDEX"}, name


def test_dockerignore_excludes_local_state():
    lines = {ln.strip().rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")}
    for path in (".venv", "results", "deploy/certs", "benchmarks/results", ".git", ".pytest_cache",
                 "**/__pycache__"):
        assert path in lines, f".dockerignore lacks {path}"


def test_compose_flags_exist_in_flower_help(compose):
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    checked = 0
    files = [compose, load("deploy/compose/local-base.yml")]
    known: dict[str, set[str]] = {}
    for name, s in compose["services"].items():
        prog = _program(s)
        if not prog or not prog.startswith("flower-"):
            continue
        if prog not in known:
            out = subprocess.run([str(BIN / prog), "--help"], capture_output=True, text=True, env=env, timeout=120)
            known[prog] = set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout))
            assert known[prog], f"{prog} --help printed no flags"
        unknown = {a.split("=", 1)[0] for a in _flower_command(s)[1:] if a.startswith("--")} - known[prog]
        assert not unknown, f"{name}: {prog} has no {sorted(unknown)}"
        checked += 1
    assert checked >= 8 and files


def test_entrypoint_and_scripts_parse():
    for script in ("deploy/compose/check.sh", "deploy/compose/build-base.sh", "deploy/compose/prereqs.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0, script
        assert os.access(ROOT / script, os.X_OK), script
    for script in ("deploy/register-supernodes.sh", "deploy/operator.sh", "deploy/nginx/render-and-run.sh"):
        assert subprocess.run(["sh", "-n", str(ROOT / script)]).returncode == 0, script
    compile((ROOT / "deploy/compose/entrypoint.py").read_text(), "entrypoint.py", "exec")


# --- the nginx template ------------------------------------------------------------------------------------
TEMPLATE = ROOT / "deploy" / "nginx" / "fleet-proxy.conf.template"


def _render(values: dict[str, str]) -> str:
    text = string.Template(TEMPLATE.read_text()).safe_substitute(values)
    return text


def test_template_variables_are_the_compose_ones(compose):
    names = set(re.findall(r"\$\{([A-Z_]+)\}", TEMPLATE.read_text()))
    env = compose["services"]["fleet-proxy"]["environment"]
    assert names == set(env), f"template needs {sorted(names)}, compose sets {sorted(env)}"
    rendered = _render({k: _compose_default(str(v)) for k, v in env.items()})
    assert "${" not in rendered


def _compose_default(value: str) -> str:
    """``value`` as compose interpolates it when the variables it names are unset (``${NAME:-default}``)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_the_fleet_bound_is_one_value_for_the_proxy_and_the_serverapp(compose):
    from fedpers.apps.fleet_bodies import DEFAULT_FLEET_MAX_OBJECT_BODY, FLEET_BOUND_ENV

    proxy = compose["services"]["fleet-proxy"]["environment"]["FLEET_MAX_OBJECT_BODY"]
    assert proxy == compose["services"]["serverapp"]["environment"][FLEET_BOUND_ENV]
    assert _compose_default(proxy) == DEFAULT_FLEET_MAX_OBJECT_BODY and proxy.startswith("${FLEET_MAX_OBJECT_BODY:-")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_template_renders_and_nginx_accepts_it(tmp_path):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (apt-get install nginx): `nginx -t` of the rendered template not run")
    from fedpers.apps.deploy import make_certs

    pki = make_certs(tmp_path / "certs", 1, ["superlink", "localhost", "127.0.0.1"])
    conf = _render({
        "SUPERLINK_ADDRESS": "127.0.0.1:9", "FLEET_LISTEN": f"127.0.0.1:{_free_port()}",
        "CONTROL_LISTEN": f"127.0.0.1:{_free_port()}", "PROXY_CERT": str(pki.server_cert),
        "PROXY_KEY": str(pki.server_key), "SUPERLINK_TLS_NAME": "superlink", "SUPERLINK_CA": str(pki.ca_cert),
        "FLEET_MAX_OBJECT_BODY": "6m"})
    assert "${" not in conf
    (tmp_path / "fleet-proxy.conf").write_text(conf)
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi", "logs"):
        (tmp_path / d).mkdir()
    main = f"""
error_log stderr;
pid {tmp_path}/nginx.pid;
events {{}}
http {{
    access_log off;
    client_body_temp_path {tmp_path}/body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
    include {tmp_path}/fleet-proxy.conf;
}}
"""
    (tmp_path / "nginx.conf").write_text(main)
    res = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(tmp_path / "nginx.conf")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # and it must fail on a broken rendering (a listener without its certificate)
    (tmp_path / "fleet-proxy.conf").write_text(conf.replace(str(pki.server_cert), str(tmp_path / "missing.pem")))
    res = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(tmp_path / "nginx.conf")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
