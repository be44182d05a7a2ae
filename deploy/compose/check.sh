#!/bin/bash
# make compose-check: the compose stack as shipped (docker-compose.yml), live, on a local base image.
#  1. base image (deploy/compose/build-base.sh; cached), 2. throwaway certs + superexec secret,
#  3. `up -d --build` with docker-compose.yml + deploy/compose/local-base.yml (base images only),
#  4. a short digits run submitted from the operator side through the loopback Control listener,
#  5. run finished + metrics in the results volume, 6. what must be refused is refused,
#  7. teardown by project name (always, also on failure or Ctrl-C).
# Env: FEDPERS_BIN (dir with fedpers and flwr; default .venv/bin), CHECK_OUT (log; default
# deploy/compose/compose-check-<UTC time>.out, never an existing file), CHECK_PROJECT (default
# fedpers-check), KEEP_CHECK_DIR=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN="${FEDPERS_BIN:-.venv/bin}"
PROJECT="${CHECK_PROJECT:-fedpers-check}"
OUT="${CHECK_OUT:-deploy/compose/compose-check-$(date -u +%Y%m%dT%H%M%SZ).out}"
if [ -e "$OUT" ]; then echo "compose-check: $OUT exists (a committed result is never overwritten): set CHECK_OUT"; exit 2; fi
WORK="$(mktemp -d /tmp/fedpers-compose-check.XXXXXX)"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# This checkout's code for `fedpers deploy certs` and for `flwr run`'s check of the app's components (the
# images are built from it too), whatever checkout the venv's fedpers was installed from.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee "$OUT") 2>&1
T0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - T0 )) s] $*"; }
fail() { echo "compose-check FAILED: $*"; exit 1; }

if docker compose version >/dev/null 2>&1; then DC=(docker compose); else DC=(docker-compose); fi
command -v "${DC[0]}" >/dev/null || fail "no docker compose: apt-get install docker-compose"
docker info >/dev/null 2>&1 || fail "no Docker engine: start dockerd (as root)"
[ -x "$BIN/fedpers" ] && [ -x "$BIN/flwr" ] || fail "$BIN/fedpers or $BIN/flwr missing: make venv (or FEDPERS_BIN=...)"
command -v curl >/dev/null || fail "curl missing: apt-get install curl"
COMPOSE=("${DC[@]}" -p "$PROJECT" -f docker-compose.yml -f deploy/compose/local-base.yml)

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" != 0 ]; then
    echo; echo "== logs (last 40 lines per service) after the failure"
    "${COMPOSE[@]}" logs --no-color --tail=40 2>&1 | tail -400
  fi
  step "teardown: ${COMPOSE[*]} down -v --remove-orphans"
  "${COMPOSE[@]}" down -v --remove-orphans --timeout 10 2>&1 | tail -30
  # Whatever compose did not remove (e.g. after an interrupted up), by the project's label.
  local left
  left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
  [ -n "$left" ] && docker rm -f $left >/dev/null
  left=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT")
  [ -n "$left" ] && docker network rm $left >/dev/null
  left=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
  [ -n "$left" ] && docker volume rm $left >/dev/null
  echo "left over: containers=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" | wc -l)" \
       "networks=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)" \
       "volumes=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)"
  [ "${KEEP_CHECK_DIR:-0}" = 1 ] || rm -rf "$WORK"
  echo "compose-check: $([ "$rc" = 0 ] && echo PASSED || echo "FAILED (rc $rc)") in $(( $(date +%s) - T0 )) s"
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
CERTS="$WORK/certs"
"$BIN/fedpers" deploy certs --out "$CERTS" --nodes 3 --host fleet-proxy --host superlink --host localhost \
  --host 127.0.0.1 || fail "fedpers deploy certs"
[ -s "$CERTS/superexec.secret" ] || fail "fedpers deploy certs wrote no superexec.secret"
ls -l "$CERTS" | sed 's/^/  /'
export FEDPERS_CERTS="$CERTS"

step "3. ${COMPOSE[*]} up -d --build"
t=$(date +%s)
"${COMPOSE[@]}" build 2>&1 | grep -E '^(Step|Successfully|Building)|ERROR|error' | grep -vE '^Step [0-9]+/[0-9]+ : (ENV|ARG|LABEL)' \
  | tail -80
[ "${PIPESTATUS[0]}" = 0 ] || fail "docker compose build"
T_BUILD=$(( $(date +%s) - t )); echo "build: $T_BUILD s"
t=$(date +%s)
"${COMPOSE[@]}" up -d || fail "docker compose up"
# up returns once every dependency condition held; the SuperNodes still have to reach the proxy.
FLWR_HOME="$WORK/flwr_home"; mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "fedpers-docker"

[superlink.fedpers-docker]
address = "127.0.0.1:9095"
root-certificates = "$CERTS/ca.crt"
TOML
export FLWR_HOME
online=0
for _ in $(seq 1 90); do
  online=$("$BIN/flwr" supernode ls fedpers-docker --format json 2>/dev/null | "$BIN/python" -c '
import json, sys
text = sys.stdin.read(); text = text[text.find("{"):] if "{" in text else "{}"
print(sum(n.get("status") == "online" for n in json.loads(text).get("nodes", [])))' 2>/dev/null || echo 0)
  [ "$online" = 3 ] && break
  sleep 2
done
"${COMPOSE[@]}" ps
[ "$online" = 3 ] || fail "only $online of 3 SuperNodes online through fleet-proxy"
T_UP=$(( $(date +%s) - t )); echo "stack up: $T_UP s (3 SuperNodes online, seen via the Control listener 127.0.0.1:9095)"

step "4. a short run from the operator side: flwr run <app> fedpers-docker --stream (127.0.0.1:9095)"
APP="$WORK/app"; mkdir -p "$APP"; cp pyproject.toml "$APP/"   # the FAB: run config only; code is in the image
# rounds' seconds are in metrics.jsonl (round_seconds) below.
RUN_CONFIG="dataset='digits' num_clients=3 fraction_fit=1.0 rounds=2 local_epochs=1 batch_size=32 aux_size=100
 alpha=1.0 feature_dim=64 ea_steps=3 device='cpu' out_dir='/results/check' client_state_dir='/state'
 checkpoint_dir='/checkpoint/check'"
t=$(date +%s)
timeout 900 "$BIN/flwr" run "$APP" fedpers-docker --stream --run-config "$(echo $RUN_CONFIG)" >"$WORK/run.log" 2>&1
rc=$?
tail -25 "$WORK/run.log"
[ "$rc" = 0 ] || fail "flwr run exited $rc"
T_RUN=$(( $(date +%s) - t )); echo "run: $T_RUN s"

step "5. the run finished and wrote its metrics (results volume, via the serverapp container)"
"$BIN/flwr" ls fedpers-docker --format json >"$WORK/ls.json" 2>&1
"$BIN/python" - "$WORK/ls.json" <<'PY' || fail "the run did not finish as completed"
import json, sys
text = open(sys.argv[1]).read(); runs = json.loads(text[text.find("{"):]).get("runs", [])
print("runs:", [(r.get("run-id"), r.get("status"), r.get("elapsed")) for r in runs])
assert runs and all(r.get("status") == "finished:completed" for r in runs), "run not finished:completed"
PY
"${COMPOSE[@]}" exec -T serverapp cat /results/check/metrics.jsonl >"$WORK/metrics.jsonl" || fail "no metrics.jsonl"
"${COMPOSE[@]}" exec -T serverapp test -s /results/check/summary.json || fail "no summary.json"
"$BIN/python" - "$WORK/metrics.jsonl" <<'PY' || fail "metrics.jsonl"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert [r["round"] for r in rows] == [1, 2], [r.get("round") for r in rows]
for r in rows:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})
PY

step "6. refusals"
code() { curl -s -o /dev/null -w '%{http_code}' --cacert "$CERTS/ca.crt" "$@"; }
expect() {  # expect WANT DESCRIPTION curl-args...
  local want="$1" what="$2"; shift 2
  local got; got=$(code "$@")
  echo "  $what -> HTTP $got (want $want)"
  [[ "$got" =~ ^($want)$ ]] || fail "$what answered $got, not $want"
}
expect 403 "Control API on the published Fleet port: POST https://127.0.0.1:9093/v1/control/list-runs" \
  -X POST -H 'Content-Type: application/x-protobuf' https://127.0.0.1:9093/v1/control/list-runs
expect 403 "Runtime API on the published Fleet port: POST https://127.0.0.1:9093/v1/runtime/acquire-task" \
  -X POST https://127.0.0.1:9093/v1/runtime/acquire-task
expect 403 "health/other paths on the Fleet port: GET https://127.0.0.1:9093/health" https://127.0.0.1:9093/health
expect 403 "a Fleet path with GET: GET https://127.0.0.1:9093/v1/fleet/pull-messages" \
  https://127.0.0.1:9093/v1/fleet/pull-messages
expect 403 "Fleet API on the Control listener: POST https://127.0.0.1:9095/v1/fleet/pull-messages" \
  -X POST https://127.0.0.1:9095/v1/fleet/pull-messages
# Inside the backend network, the SuperLink's Runtime API refuses a caller without the superexec secret.
got=$("${COMPOSE[@]}" exec -T serverapp python -c "
import ssl, urllib.request, urllib.error
req = urllib.request.Request('https://superlink:9093/v1/runtime/acquire-task', data=b'', method='POST',
                             headers={'Content-Type': 'application/protobuf'})
try:
    print(urllib.request.urlopen(req, context=ssl.create_default_context(cafile='/run/secrets/ca.crt'), timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)" 2>&1 | tail -1)
echo "  Runtime API without the superexec secret, from the serverapp container -> HTTP $got (want 401|403)"
[[ "$got" =~ ^(401|403)$ ]] || fail "unsigned Runtime API request answered $got"
# Published ports: the proxy's only, Control on loopback; none for the SuperLink.
for svc in superlink fleet-proxy; do
  echo "  published by $svc: $("${COMPOSE[@]}" port "$svc" 9093 2>/dev/null || true) $("${COMPOSE[@]}" port "$svc" 9095 2>/dev/null || true)"
done
[ -z "$(docker ps --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=superlink" --format '{{.Ports}}' | grep -- '->')" ] \
  || fail "the SuperLink publishes a port"
"${COMPOSE[@]}" port fleet-proxy 9095 | grep -q '^127.0.0.1:9095$' || fail "Control listener not bound to 127.0.0.1"
# Secrets as the services see them: the copy owned by app, no ca.key anywhere.
"${COMPOSE[@]}" exec -T superlink sh -c 'ls -ln /run/fedpers-secrets; id app; ls -ln /superlink' | sed 's/^/  superlink: /'
for svc in superlink serverapp supernode-0 clientapp-0; do  # fleet-proxy: nginx master is root by design
  uid=$("${COMPOSE[@]}" exec -T "$svc" sh -c 'grep "^Uid:" /proc/1/status' | awk '{print $2}')
  echo "  $svc: main process uid $uid"
  [ "$uid" = 49999 ] || fail "$svc runs as uid $uid, not app (49999)"
done
for svc in superlink fleet-proxy register-supernodes serverapp supernode-0 clientapp-0; do
  cid=$("${COMPOSE[@]}" ps -q "$svc" 2>/dev/null | head -1)
  [ -n "$cid" ] || cid=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$svc" | head -1)
  mounts=$(docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' "$cid")
  echo "  $svc mounts: $(for m in $mounts; do case "$m" in "$CERTS"/*) basename "$m";; esac; done | tr '\n' ' ')"
  case " $mounts " in *"/ca.key "*|*" $CERTS "*) fail "$svc mounts ca.key or the whole certs directory";; esac
done
echo
echo "all checks passed; timings: base image ${T_BASE} s, compose build ${T_BUILD} s, up until 3 SuperNodes online" \
     "${T_UP} s, 2-round run ${T_RUN} s"
