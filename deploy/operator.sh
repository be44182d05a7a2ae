#!/bin/sh
# The compose stack's `operator` service (its image: fedpers/superexec, which carries the `flwr` CLI and the
# app's pyproject.toml): writes a Flower CLI config whose default connection `fedpers` is the Control API
# at $SUPERLINK_ADDRESS (127.0.0.1:9095: fleet-proxy's loopback listener, in the network namespace this
# container shares with it) with $CERTS_DIR/ca.crt, puts the app's pyproject.toml in /app/fedpers-app (the
# FAB a run submits carries only the run config; the code is in the images), then waits. The operator runs
#   docker compose exec operator flwr ls
#   docker compose exec operator flwr run /app/fedpers-app --stream --run-config "..."
set -eu
: "${SUPERLINK_ADDRESS:=127.0.0.1:9095}" "${CERTS_DIR:=/run/fedpers-secrets}"
export FLWR_HOME="${FLWR_HOME:-$HOME/.flwr}"
mkdir -p "$FLWR_HOME" /app/fedpers-app
cp /opt/fedpers/pyproject.toml /app/fedpers-app/
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "fedpers"

[superlink.fedpers]
address = "$SUPERLINK_ADDRESS"
root-certificates = "$CERTS_DIR/ca.crt"
TOML
echo "operator: flwr connection 'fedpers' -> $SUPERLINK_ADDRESS (FLWR_HOME=$FLWR_HOME)"
# PID 1 of the container: exit on SIGTERM at once (docker compose stop/down) instead of waiting 10 s.
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
