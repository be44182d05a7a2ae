#!/bin/sh
# Register the SuperNodes' public keys ($CERTS_DIR/supernode-<i>.key.pub) with the SuperLink; used by the
# register-supernodes service of docker-compose.yml (CERTS_DIR=/run/fedpers-secrets: its compose secrets,
# the public keys and ca.crt only, copied there by deploy/compose/entrypoint.py). Idempotent enough for
# restarts: an already registered key is reported and skipped.
set -eu
: "${SUPERLINK_ADDRESS:=superlink:9093}" "${NUM_SUPERNODES:=3}" "${CERTS_DIR:=/certs}"
export FLWR_HOME="${FLWR_HOME:-/tmp/flwr-home}"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "fedpers"

[superlink.fedpers]
address = "$SUPERLINK_ADDRESS"
root-certificates = "$CERTS_DIR/ca.crt"
TOML
i=0
while [ "$i" -lt "$NUM_SUPERNODES" ]; do
  tries=0
  until out=$(flwr supernode register "$CERTS_DIR/supernode-$i.key.pub" fedpers 2>&1) \
        && echo "$out" | grep -q "registered successfully"; do
    echo "$out" | grep -qi "already" && break
    tries=$((tries + 1)); [ "$tries" -ge 30 ] && { echo "$out"; exit 1; }
    sleep 2
  done
  echo "$out"
  i=$((i + 1))
done
