#!/bin/sh
# The compose stack's `operator` service (its image: fedpers/superexec, which carries the `flwr` CLI and the
# app's pyproject.toml): writes a Flower CLI config whose default connection `fedpers` is the Control API
# at $SUPERLINK_ADDRESS (127.0.0.1:9095: fleet-proxy's loopback listener, in the network namespace this
# container shares with it) with $CERTS_DIR/ca.crt, puts the app in /app/fedpers-app (pyproject.toml, whose
# fab-include names the packages, and the packages: the bundle `flwr run` sends is the one `flwr build` makes
# of a checkout, code included; fedpers/apps/bundle.py), then waits. The operator runs
#   docker compose exec operator flwr ls
#   docker compose exec operator flwr run /app/fedpers-app --stream --run-config "..."
set -eu
: "${SUPERLINK_ADDRESS:=127.0.0.1:9095}" "${CERTS_DIR:=/run/fedpers-secrets}"
export FLWR_HOME="${FLWR_HOME:-$HOME/.flwr}"
mkdir -p "$FLWR_HOME"
rm -rf /app/fedpers-app && mkdir -p /app/fedpers-app   # a restarted operator gets the image's app again
cp -r /opt/fedpers/pyproject.toml /opt/fedpers/fedpers /opt/fedpers/strategies /opt/fedpers/clients /app/fedpers-app/
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "fedpers"

[superlink.fedpers]
address = "$SUPERLINK_ADDRESS"
root-certificates = "$CERTS_DIR/ca.crt"
TOML
echo "operator: flwr connection 'fedpers' -> $SUPERLINK_ADDRESS (FLWR_HOME=$FLWR_HOME)"
echo "operator: /app/fedpers-app: $(python -m fedpers.apps.bundle /app/fedpers-app 2>&1)"
# PID 1 of the container: exit on SIGTERM at once (docker compose stop/down) instead of waiting 10 s.
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
