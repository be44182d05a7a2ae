#!/usr/bin/env bash
# Start a fedpers edge client: a Flower SuperNode that joins an existing SuperLink over the network with TLS
# through the federation's Fleet proxy (nginx; only the Fleet API's paths pass it; the federation's CA certificate) and SuperNode authentication (this node's private key, whose public key
# the SuperLink operator registered with `flwr supernode register`). The ClientApp runs in a subprocess
# of the SuperNode (one process to manage on the device). Ctrl-C / SIGTERM stops it; the client state stays
# in STATE_DIR and is restored on the next start.
#
#   SUPERLINK=fl.example.org:9093 CA_CERT=ca.crt NODE_KEY=supernode-3.key PARTITION_ID=3 NUM_PARTITIONS=4 \
#       deploy/edge/start-edge-client.sh
set -euo pipefail
: "${SUPERLINK:?host:port of the Fleet proxy of the federation (HTTPS), e.g. fl.example.org:9093}"
: "${CA_CERT:?path of the federation CA certificate (ca.crt)}"
: "${NODE_KEY:?path of this SuperNode private key (supernode-<i>.key)}"
: "${PARTITION_ID:?partition id of this client (0..NUM_PARTITIONS-1)}"
: "${NUM_PARTITIONS:?number of clients of the experiment (= num_clients)}"
STATE_DIR="${STATE_DIR:-$HOME/.fedpers/state}"
RUNTIME_PORT="${RUNTIME_PORT:-9094}"   # SuperNode's local Runtime API (ClientApp <-> SuperNode), loopback only
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# The SuperNode's own SuperExec checks for ClientApp work every second by default; 0.1 s starts every
# message sooner at a negligible cost on the device.
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL="${FLWR_SUPEREXEC_TASK_POLL_INTERVAL:-0.1}"
export FLWR_HOME="${FLWR_HOME:-$HOME/.fedpers/flwr}"
mkdir -p "$STATE_DIR" "$FLWR_HOME"
for f in "$CA_CERT" "$NODE_KEY"; do [ -r "$f" ] || { echo "edge: cannot read $f" >&2; exit 2; }; done
exec flower-supernode \
  --superlink "$SUPERLINK" \
  --root-certificates "$CA_CERT" \
  --auth-supernode-private-key "$NODE_KEY" \
  --node-config "partition-id=$PARTITION_ID num-partitions=$NUM_PARTITIONS state-dir=\"$STATE_DIR\"" \
  --isolation subprocess \
  --host 127.0.0.1 --port "$RUNTIME_PORT" \
  --max-wait-time "${MAX_WAIT_TIME:-3600}"
