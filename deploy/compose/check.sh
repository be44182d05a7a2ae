#!/bin/bash
# make compose-check: the compose stack as shipped (docker-compose.yml), live, on a local base image.
#  0. prerequisites (deploy/compose/prereqs.sh: installed with apt where root, else one line naming them),
#  1. base image (deploy/compose/build-base.sh; cached), 2. throwaway certs + superexec secret,
#  3. `up -d --build` with docker-compose.yml + deploy/compose/local-base.yml (base images only),
#  4. the app bundle the operator submits (files and size, the same as `flwr build` of this checkout) and a
#     short digits run submitted from the operator container (Control API on 127.0.0.1:9095 of
#     fleet-proxy's network namespace), 5. run finished + metrics in the results volume,
#  6. reachability probes (deploy/compose/probe.py) from inside containers, from the host and from a second
#     network namespace routed through the host,
#  6b. unsigned bodies above the Fleet proxy's bounds get 413 and leave the SuperLink's memory as it was; the
#     proxy's TLS policy (no SHA-1/CBC suites), 7. a SuperNode killed and restarted at once rejoins,
#  8. a run the nodes do not fit ends failed with its one-line reason, 9. published ports, users, secrets,
#     memory limits, the runners' read-only data volume, 10. teardown by project name (always, also on failure
#     or Ctrl-C), and the dockerd prereqs.sh started, if it started one.
# Env: FEDPERS_BIN (dir with fedpers; default .venv/bin), CHECK_OUT (log; default
# results/compose-check/compose-check-<UTC time>.out, never an existing file), CHECK_PROJECT (default
# fedpers-check), KEEP_CHECK_DIR=1, KEEP_DOCKERD=1 (leave running a dockerd this check started).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN="${FEDPERS_BIN:-.venv/bin}"
PROJECT="${CHECK_PROJECT:-fedpers-check}"
OUT="${CHECK_OUT:-results/compose-check/compose-check-$(date -u +%Y%m%dT%H%M%SZ).out}"
if [ -e "$OUT" ]; then echo "compose-check: $OUT exists (a result is never overwritten): set CHECK_OUT"; exit 2; fi
mkdir -p "$(dirname "$OUT")" || { echo "compose-check: cannot create $(dirname "$OUT")"; exit 2; }
[ -x "$BIN/fedpers" ] || { echo "compose-check: $BIN/fedpers missing: make venv (or FEDPERS_BIN=...)"; exit 1; }
exec > >(tee "$OUT") 2>&1
T0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - T0 )) s] $*"; }
fail() { echo "compose-check FAILED: $*"; exit 1; }
stop_started_dockerd() {  # the dockerd prereqs.sh started for this check, by its PID, and no other
  local how pid
  how=$(cat "$FEDPERS_DOCKERD_STARTED" 2>/dev/null); rm -f "$FEDPERS_DOCKERD_STARTED"
  [ -n "$how" ] && [ "${KEEP_DOCKERD:-0}" != 1 ] || return 0
  if [ "$how" = systemd ]; then
    echo "compose-check: stopping the docker service it started"; systemctl stop docker.socket docker.service
  elif [ "$(cat "/proc/${how#pid }/comm" 2>/dev/null)" = dockerd ]; then
    pid=${how#pid }
    echo "compose-check: stopping the dockerd it started (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do [ -e "/proc/$pid" ] || break; sleep 0.5; done
  fi
}

step "0. prerequisites (deploy/compose/prereqs.sh)"
# prereqs.sh records a dockerd it starts here; the teardown stops that one (KEEP_DOCKERD=1: leave it).
export FEDPERS_DOCKERD_STARTED="$(mktemp /tmp/fedpers-dockerd-started.XXXXXX)"
deploy/compose/prereqs.sh fedpers/local-base:bookworm || { stop_started_dockerd; exit 1; }
WORK="$(mktemp -d /tmp/fedpers-compose-check.XXXXXX)"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# This checkout's code for `fedpers deploy certs` (the images are built from it too), whatever checkout
# the venv's fedpers was installed from.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if docker compose version >/dev/null 2>&1; then DC=(docker compose); else DC=(docker-compose); fi
COMPOSE=("${DC[@]}" -p "$PROJECT" -f docker-compose.yml -f deploy/compose/local-base.yml)
CERTS="$WORK/certs"
export FEDPERS_CERTS="$CERTS"
NS="fedpers-check-nb"          # the neighbour: a network namespace routed through the host
STACK=0                        # set once `up` ran: before that there is no stack to tear down

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$STACK" = 1 ]; then
    if [ "$rc" != 0 ]; then
      echo; echo "== logs (last 40 lines per service) after the failure"
      "${COMPOSE[@]}" logs --no-color --tail=40 2>&1 | tail -400
    fi
    step "teardown: ${COMPOSE[*]} down -v --remove-orphans"
    "${COMPOSE[@]}" down -v --remove-orphans --timeout 10 2>&1 | tail -30
  fi
  ip netns del "$NS" 2>/dev/null; ip link del fpcn-h 2>/dev/null
  # Whatever compose did not remove (e.g. after an interrupted up), by the project's label.
  local left
  left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null)
  [ -n "$left" ] && docker rm -f $left >/dev/null
  left=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null)
  [ -n "$left" ] && docker network rm $left >/dev/null
  left=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null)
  [ -n "$left" ] && docker volume rm $left >/dev/null
  echo "left over: containers=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" | wc -l)" \
       "networks=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)" \
       "volumes=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)"
  [ "${KEEP_CHECK_DIR:-0}" = 1 ] || rm -rf "$WORK"
  stop_started_dockerd
  echo "compose-check: $([ "$rc" = 0 ] && echo PASSED || echo "FAILED (rc $rc)") in $(( $(date +%s) - T0 )) s; log $OUT"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

echo "compose-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n): $(${DC[@]} version --short 2>/dev/null || ${DC[@]} version | head -1)," \
     "$(docker version --format 'engine {{.Server.Version}}' 2>/dev/null)"

step "1. local base image (deploy/compose/build-base.sh)"
t=$(date +%s)
deploy/compose/build-base.sh || fail "base image build"
T_BASE=$(( $(date +%s) - t )); echo "base image step: $T_BASE s"

step "2. certificates and superexec secret in $WORK/certs"
"$BIN/fedpers" deploy certs --out "$CERTS" --nodes 3 || fail "fedpers deploy certs"
[ -s "$CERTS/superexec.secret" ] || fail "fedpers deploy certs wrote no superexec.secret"
ls -l "$CERTS" | sed 's/^/  /'

step "3. ${COMPOSE[*]} up -d --build"
t=$(date +%s)
"${COMPOSE[@]}" build 2>&1 | grep -E '^(Step|Successfully|Building)|ERROR|error' | grep -vE '^Step [0-9]+/[0-9]+ : (ENV|ARG|LABEL)' \
  | tail -80
[ "${PIPESTATUS[0]}" = 0 ] || fail "docker compose build"
T_BUILD=$(( $(date +%s) - t )); echo "build: $T_BUILD s"
t=$(date +%s)
STACK=1
"${COMPOSE[@]}" up -d || fail "docker compose up"
op() { "${COMPOSE[@]}" exec -T operator "$@"; }   # the operator's seat (Control API on its loopback)
online_nodes() {
  op flwr supernode ls --format json 2>/dev/null | "$BIN/python" -c '
import json, sys
text = sys.stdin.read(); text = text[text.find("{"):] if "{" in text else "{}"
print(sum(n.get("status") == "online" for n in json.loads(text).get("nodes", [])))' 2>/dev/null || echo 0
}
wait_online() {  # wait_online SECONDS: until 3 SuperNodes are online, as the SuperLink sees them
  local online=0
  for _ in $(seq 1 "$(( $1 / 2 ))"); do
    online=$(online_nodes); [ "$online" = 3 ] && return 0
    sleep 2
  done
  echo "only $online of 3 SuperNodes online"; return 1
}
# up returns once every dependency condition held; the SuperNodes still have to reach the proxy.
wait_online 180 || { "${COMPOSE[@]}" ps; fail "the SuperNodes did not come online through fleet-proxy"; }
"${COMPOSE[@]}" ps
T_UP=$(( $(date +%s) - t )); echo "stack up: $T_UP s (3 SuperNodes online, seen from the operator container)"

step "4. a short run from the operator container: flwr run /app/fedpers-app --stream (Control API 127.0.0.1:9095)"
# The bundle the run sends (code included) is the one `flwr build` makes of this checkout: same files, same
# size (fedpers/apps/bundle.py; docs/running.md states it).
BUNDLE_HERE=$("$BIN/python" -m fedpers.apps.bundle .) || fail "the checkout's app bundle"
BUNDLE_OP=$(op python -m fedpers.apps.bundle /app/fedpers-app) || fail "the operator's app bundle"
echo "  checkout:                 $BUNDLE_HERE"
echo "  operator /app/fedpers-app: $BUNDLE_OP"
[ "$BUNDLE_OP" = "$BUNDLE_HERE" ] || fail "the operator's app bundle is not the checkout's"
TORCH_LOCKED=$(sed -n 's/^torch==//p' requirements.lock)
TORCH_RUNNERS=$(op python -c 'import torch; print(torch.__version__)')
echo "  torch in the runners' image: $TORCH_RUNNERS (requirements.lock: $TORCH_LOCKED)"
[ "${TORCH_RUNNERS%%+*}" = "$TORCH_LOCKED" ] || [ -n "${BASE_TORCH:-}" ] \
  || fail "the images run torch $TORCH_RUNNERS, not the locked $TORCH_LOCKED (BASE_TORCH=... chooses another on purpose)"
# rounds' seconds are in metrics.jsonl (round_seconds) below.
RUN_CONFIG="dataset='digits' num_clients=3 fraction_fit=1.0 rounds=2 local_epochs=1 batch_size=32 aux_size=100
 alpha=1.0 feature_dim=64 ea_steps=3 device='cpu' out_dir='/results/check' client_state_dir='/state'
 checkpoint_dir='/checkpoint/check'"
t=$(date +%s)
timeout 1200 "${COMPOSE[@]}" exec -T operator flwr run /app/fedpers-app --stream --run-config "$(echo $RUN_CONFIG)" \
  >"$WORK/run.log" 2>&1
rc=$?
tail -25 "$WORK/run.log"
[ "$rc" = 0 ] || fail "flwr run exited $rc"
T_RUN=$(( $(date +%s) - t )); echo "run: $T_RUN s"

runs_json() { op flwr ls --format json >"$WORK/ls.json" 2>&1; }
step "5. the run finished and wrote its metrics (results volume, via the serverapp container)"
runs_json
"$BIN/python" - "$WORK/ls.json" <<'PY' || fail "the run did not finish as completed"
import json, sys
text = open(sys.argv[1]).read(); runs = json.loads(text[text.find("{"):]).get("runs", [])
print("runs:", [(r.get("run-id"), r.get("status"), r.get("elapsed")) for r in runs])
assert len(runs) == 1 and runs[0].get("status") == "finished:completed", "run not finished:completed"
PY
"${COMPOSE[@]}" exec -T serverapp cat /results/check/metrics.jsonl >"$WORK/metrics.jsonl" || fail "no metrics.jsonl"
"${COMPOSE[@]}" exec -T serverapp test -s /results/check/summary.json || fail "no summary.json"
"$BIN/python" - "$WORK/metrics.jsonl" <<'PY' || fail "metrics.jsonl"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert [r["round"] for r in rows] == [1, 2], [r.get("round") for r in rows]
for r in rows:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})
    assert r["failed_clients"] == 0 and "refused_nodes" not in r, r
PY

step "6. what must be unreachable is unreachable (deploy/compose/probe.py; 'unreachable' = no name, refused, no route or timeout)"
cid() { "${COMPOSE[@]}" ps -q "$1" | head -1; }
ip_on() {  # ip_on SERVICE NETWORK: the service's address on the project's network NETWORK
  docker inspect -f "{{with index .NetworkSettings.Networks \"${PROJECT}_$2\"}}{{.IPAddress}}{{end}}" "$(cid "$1")"
}
probe_in() {  # probe_in SERVICE "WANT METHOD URL" ...: from inside that container
  local svc="$1"; shift
  docker exec -i -e PROBE_FROM="$svc" "$(cid "$svc")" python - "$@" <deploy/compose/probe.py
}
PROXY_FLEET=$(ip_on fleet-proxy fleet); PROXY_SAIO=$(ip_on fleet-proxy serverappio)
N0_NODE=$(ip_on supernode-0 node-0); N1_NODE=$(ip_on supernode-1 node-1); N1_FLEET=$(ip_on supernode-1 fleet)
echo "  fleet-proxy's namespace (SuperLink, runtime-proxy, operator): fleet $PROXY_FLEET, serverappio $PROXY_SAIO;" \
     "supernode-0 node-0 $N0_NODE; supernode-1 node-1 $N1_NODE, fleet $N1_FLEET"
[ -n "$PROXY_FLEET" ] && [ -n "$PROXY_SAIO" ] && [ -n "$N0_NODE" ] && [ -n "$N1_NODE" ] || fail "container addresses"
PROBES=0
probed() { [ "$1" = 0 ] || PROBES=1; }
echo " a ClientApp (clientapp-0, network node-0): its own SuperNode's Runtime API only"
probe_in clientapp-0 \
  "401|403 POST http://supernode-0-runtime:9094/v1/runtime/acquire-task" \
  "unreachable POST http://supernode-1:9094/v1/runtime/acquire-task" \
  "unreachable POST http://$N1_NODE:9094/v1/runtime/acquire-task" \
  "unreachable POST http://$N1_FLEET:9094/v1/runtime/acquire-task" \
  "unreachable POST https://fleet-proxy:9095/v1/control/list-nodes" \
  "unreachable POST https://$PROXY_FLEET:9095/v1/control/list-nodes" \
  "unreachable POST https://$PROXY_FLEET:9093/v1/control/list-nodes" \
  "unreachable POST https://$PROXY_SAIO:9091/v1/runtime/get-nodes"; probed $?
echo " a SuperNode (supernode-0, networks fleet + node-0): the Fleet API only"
probe_in supernode-0 \
  "403 POST https://fleet-proxy:9093/v1/control/list-nodes" \
  "403 GET https://fleet-proxy:9093/docs" \
  "403 GET https://fleet-proxy:9093/openapi.json" \
  "403 POST https://fleet-proxy:9093/v1/runtime/get-nodes" \
  "unreachable POST https://fleet-proxy:9095/v1/control/list-nodes" \
  "unreachable GET https://fleet-proxy:9092/docs" \
  "unreachable POST http://supernode-1:9094/v1/runtime/acquire-task" \
  "unreachable POST http://$N1_NODE:9094/v1/runtime/acquire-task" \
  "unreachable POST https://$PROXY_SAIO:9091/v1/runtime/get-nodes"; probed $?
echo " the ServerApp runner (serverapp, network serverappio): POST /v1/runtime/... through runtime-proxy only"
probe_in serverapp \
  "401|403 POST https://runtime-proxy:9091/v1/runtime/get-nodes" \
  "403 GET https://runtime-proxy:9091/v1/runtime/get-nodes" \
  "403 POST https://runtime-proxy:9091/v1/control/list-nodes" \
  "403 POST https://runtime-proxy:9091/v1/fleet/pull-messages" \
  "403 GET https://runtime-proxy:9091/docs" \
  "403 GET https://runtime-proxy:9091/openapi.json" \
  "403 GET https://runtime-proxy:9091/health" \
  "unreachable POST https://runtime-proxy:9095/v1/control/list-nodes" \
  "unreachable GET https://runtime-proxy:9092/docs" \
  "unreachable POST http://$N0_NODE:9094/v1/runtime/acquire-task"; probed $?
echo " the host: the Fleet port only (nothing published for Control; the SuperLink has no address of its own)"
PROBE_FROM=host python3 deploy/compose/probe.py \
  "403 POST https://127.0.0.1:9093/v1/control/list-nodes" \
  "403 GET https://127.0.0.1:9093/docs" \
  "403 POST https://127.0.0.1:9093/v1/runtime/get-nodes" \
  "unreachable POST https://127.0.0.1:9095/v1/control/list-nodes" \
  "unreachable POST https://$PROXY_FLEET:9095/v1/control/list-nodes" \
  "unreachable POST https://$PROXY_SAIO:9095/v1/control/list-nodes" \
  "unreachable GET https://$PROXY_FLEET:9092/docs" \
  "unreachable GET https://$PROXY_SAIO:9092/docs" \
  "403 POST https://$PROXY_SAIO:9091/v1/control/list-nodes" \
  "403 GET https://$PROXY_SAIO:9091/docs"; probed $?
[ "$(docker inspect -f '{{.HostConfig.NetworkMode}}' "$(cid superlink)")" = "container:$(cid fleet-proxy)" ] \
  || fail "the SuperLink is not in fleet-proxy's network namespace"
echo "  superlink: NetworkMode container:<fleet-proxy>, no address of its own"
echo " a neighbour (network namespace $NS, 10.213.99.2, routing the compose subnets through the host)"
ip netns add "$NS" && ip link add fpcn-h type veth peer name fpcn-n && ip link set fpcn-n netns "$NS" \
  && ip addr add 10.213.99.1/30 dev fpcn-h && ip link set fpcn-h up \
  && ip -n "$NS" addr add 10.213.99.2/30 dev fpcn-n && ip -n "$NS" link set fpcn-n up \
  && ip -n "$NS" link set lo up && ip -n "$NS" route add default via 10.213.99.1 \
  || fail "could not set up the neighbour namespace"
ip netns exec "$NS" env PROBE_FROM=neighbour python3 deploy/compose/probe.py \
  "403 POST https://10.213.99.1:9093/v1/control/list-nodes" \
  "403 POST https://$PROXY_FLEET:9093/v1/control/list-nodes" \
  "unreachable POST https://10.213.99.1:9095/v1/control/list-nodes" \
  "unreachable POST https://$PROXY_FLEET:9095/v1/control/list-nodes" \
  "unreachable GET https://$PROXY_FLEET:9092/docs" \
  "unreachable POST https://$PROXY_SAIO:9091/v1/runtime/get-nodes" \
  "unreachable POST http://$N0_NODE:9094/v1/runtime/acquire-task" \
  "unreachable POST http://$N1_FLEET:9094/v1/runtime/acquire-task"; probed $?
[ "$PROBES" = 0 ] || fail "a probe got another answer than the wanted one (see <-- FAILED above)"

step "6b. unsigned bodies above the proxy's bounds get 413 from fleet-proxy, and the SuperLink's memory stays; TLS policy"
# The SuperLink reads a whole body before it checks the node's signature: fleet-proxy bounds push-object at
# FLEET_MAX_OBJECT_BODY (6m) and the other Fleet paths at 1m (deploy/nginx/fleet-proxy.conf.template).
link_rss() {  # the SuperLink's resident MiB (flower-superlink is PID 1 of its container)
  "${COMPOSE[@]}" exec -T superlink sh -c 'grep "^VmRSS:" /proc/1/status' | awk '{print int($2 / 1024)}'
}
RSS_BEFORE=$(link_rss)
PROBE_FROM=host python3 deploy/compose/probe.py \
  "413 POST:256MiB https://127.0.0.1:9093/v1/fleet/push-object" \
  "413 POST:256MiB:chunked https://127.0.0.1:9093/v1/fleet/push-object" \
  "413 POST:2MiB https://127.0.0.1:9093/v1/fleet/push-messages" \
  || fail "fleet-proxy did not refuse an unsigned body above its bound"
sleep 2
RSS_AFTER=$(link_rss)
echo "  SuperLink RSS: ${RSS_BEFORE} MiB before, ${RSS_AFTER} MiB after 2 x 256 MiB unsigned push-object bodies"
[ -n "$RSS_BEFORE" ] && [ -n "$RSS_AFTER" ] && [ $(( RSS_AFTER - RSS_BEFORE )) -lt 24 ] \
  || fail "the SuperLink's memory grew by more than 4 x the 6 MiB bound"
python3 - <<'PY' || fail "fleet-proxy's TLS policy"
import socket, ssl
def handshake(version, suite=None):
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ctx.maximum_version = version
    if suite:
        ctx.set_ciphers(suite)
    try:
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", 9093), timeout=10)) as tls:
            return tls.version(), tls.cipher()[0]
    except ssl.SSLError:
        return None
for suite in ("ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384"):
    print(f"  TLS 1.2 {suite}: {handshake(ssl.TLSVersion.TLSv1_2, suite) or 'refused'}")
    assert handshake(ssl.TLSVersion.TLSv1_2, suite) is None, suite
print(f"  TLS 1.2 AEAD: {handshake(ssl.TLSVersion.TLSv1_2, 'ECDHE-ECDSA-AES128-GCM-SHA256')}; "
      f"TLS 1.3: {handshake(ssl.TLSVersion.TLSv1_3)}")
assert handshake(ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256") and handshake(ssl.TLSVersion.TLSv1_3)
PY

step "7. a SuperNode killed and restarted at once rejoins (supernode-1: its flower-supernode SIGKILLed)"
t=$(date +%s)
N1_PID=$("${COMPOSE[@]}" exec -T supernode-1 python -c '
import os
for p in sorted(os.listdir("/proc")):
    if p.isdigit() and p != "1":
        argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        if any(os.path.basename(a) == b"flower-supernode" for a in argv[:2]):
            print(p); break')
[ -n "$N1_PID" ] || fail "no flower-supernode process in supernode-1"
SINCE=$(date -u +%Y-%m-%dT%H:%M:%S)
"${COMPOSE[@]}" exec -T supernode-1 sh -c "kill -9 $N1_PID"
# The start wrapper (PID 1) ends the SuperNode's children and exits 137; `restart: unless-stopped` starts
# the container again at once, while the SuperLink still lists the node online: exit 305, retried until
# the SuperLink has missed the killed node's heartbeats and lets the key in again.
rejoined=0
for _ in $(seq 1 100); do
  docker logs --since "$SINCE" "$(cid supernode-1)" >"$WORK/supernode-1.log" 2>&1
  grep -q "SuperNode ID" "$WORK/supernode-1.log" && { rejoined=1; break; }
  sleep 2
done
[ "$rejoined" = 1 ] || fail "supernode-1 did not rejoin within 200 s"
wait_online 60 || fail "supernode-1 rejoined but the SuperLink does not list 3 SuperNodes online"
grep -E "refused this SuperNode|SuperNode ID" "$WORK/supernode-1.log" | tail -6 | sed 's/^/  /'
grep -q "the SuperLink refused this SuperNode (exit 305" "$WORK/supernode-1.log" \
  || fail "the restarted supernode-1 was not refused first: the retry was not exercised"
echo "  supernode-1 restarts: $(docker inspect -f '{{.RestartCount}}' "$(cid supernode-1)"); back online after" \
     "$(( $(date +%s) - t )) s"

step "8. a run the SuperNodes do not fit (num_clients=2; every node has num-partitions=3) ends failed, in one line"
timeout 900 "${COMPOSE[@]}" exec -T operator flwr run /app/fedpers-app --stream --run-config \
  "dataset='digits' num_clients=2 fraction_fit=1.0 rounds=2 round_timeout=300 device='cpu' out_dir='/results/misfit' client_state_dir='/state' checkpoint_dir='/checkpoint/misfit'" \
  >"$WORK/misfit.log" 2>&1
grep -E "refuses this run|FedpersError" "$WORK/misfit.log" | sed 's/^/  /'
runs_json
"$BIN/python" - "$WORK/ls.json" <<'PY' || fail "the run the nodes do not fit did not end failed with its reason"
import json, sys
text = open(sys.argv[1]).read(); runs = json.loads(text[text.find("{"):]).get("runs", [])
failed = [r for r in runs if r.get("status") == "finished:failed"]
assert len(runs) == 2 and len(failed) == 1, [(r.get("run-id"), r.get("status")) for r in runs]
details = failed[0]["status-details"]
print("  status:", failed[0]["status"], "|", details)
assert "\n" not in details
assert "of num_clients=2 clients have a SuperNode that fits the run, fewer than the 2 it needs" in details, details
assert "refused: node config num-partitions=3 but the run has num_clients=2" in details, details
PY

step "9. published ports, users, secrets"
for svc in fleet-proxy runtime-proxy superlink serverapp supernode-0 clientapp-0 operator; do
  echo "  $svc publishes: $(docker ps --filter "id=$(cid "$svc")" --format '{{.Ports}}')"
done
published=$(docker ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Ports}}' | grep -- '->' || true)
[ "$(echo "$published" | grep -c -- '->')" = 1 ] && echo "$published" | grep -q "fleet-proxy" \
  && ! echo "$published" | grep -q 9095 || fail "something other than fleet-proxy's 9093 is published: $published"
# Secrets as the services see them: the copy owned by app, no ca.key anywhere.
"${COMPOSE[@]}" exec -T superlink sh -c 'ls -ln /run/fedpers-secrets; id app; ls -ln /superlink' | sed 's/^/  superlink: /'
for svc in superlink serverapp supernode-0 clientapp-0 operator; do  # the proxies: nginx master is root by design
  uid=$("${COMPOSE[@]}" exec -T "$svc" sh -c 'grep "^Uid:" /proc/1/status' | awk '{print $2}')
  echo "  $svc: main process uid $uid"
  [ "$uid" = 49999 ] || fail "$svc runs as uid $uid, not app (49999)"
done
for svc in superlink fleet-proxy runtime-proxy register-supernodes operator serverapp supernode-0 clientapp-0; do
  c=$(cid "$svc")
  [ -n "$c" ] || c=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$svc" | head -1)
  mounts=$(docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' "$c")
  echo "  $svc mounts: $(for m in $mounts; do case "$m" in "$CERTS"/*) basename "$m";; esac; done | tr '\n' ' ')"
  case " $mounts " in *"/ca.key "*|*" $CERTS "*) fail "$svc mounts ca.key or the whole certs directory";; esac
done
# Memory limits (mem_limit; docker-compose.yml says why each) and the runners' read-only data volume.
for svc in fleet-proxy runtime-proxy superlink operator serverapp supernode-0 clientapp-0; do
  limit=$(docker inspect -f '{{.HostConfig.Memory}}' "$(cid "$svc")")
  echo "  $svc: memory limit $(( limit / 1048576 )) MiB"
  [ "$limit" -gt 0 ] || fail "$svc runs without a memory limit"
done
for svc in serverapp clientapp-0; do
  rw=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/data"}}{{.RW}}{{end}}{{end}}' "$(cid "$svc")")
  echo "  $svc: /data writable: $rw"
  [ "$rw" = false ] || fail "$svc mounts the data volume writable"
done
echo
echo "all checks passed; timings: base image ${T_BASE} s, compose build ${T_BUILD} s, up until 3 SuperNodes online" \
     "${T_UP} s, 2-round run ${T_RUN} s; $BUNDLE_OP"
