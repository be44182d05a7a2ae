#!/bin/sh
# Start-up of the compose stack's two nginx proxies (fleet-proxy, runtime-proxy), the same in the official
# nginx image and the local base image: render TEMPLATE with envsubst (only the ${VARIABLES} the template
# names, so nginx's own $variables survive) and run nginx in the foreground.
# LISTEN_HOST_OF=<name>: a listener given as ${LISTEN_HOST}:port binds to the address <name> resolves to,
# not to every interface (runtime-proxy: its alias on the serverappio network only, so the ServerAppIo
# listener is not on the fleet network that shares this network namespace).
#   render-and-run.sh /etc/nginx/fedpers/runtime-proxy.conf.template
set -eu
TEMPLATE="$1"
if [ -n "${LISTEN_HOST_OF:-}" ]; then
  LISTEN_HOST=""
  for _ in $(seq 1 60); do  # Docker's DNS may answer a moment after the container started
    LISTEN_HOST="$(getent hosts "$LISTEN_HOST_OF" 2>/dev/null | awk '{print $1; exit}')" || true
    [ -n "$LISTEN_HOST" ] && break
    sleep 0.5
  done
  [ -n "$LISTEN_HOST" ] || { echo "render-and-run.sh: $LISTEN_HOST_OF does not resolve" >&2; exit 1; }
  export LISTEN_HOST
fi
VARS="$(grep -o '\${[A-Z_]*}' "$TEMPLATE" | sort -u | tr '\n' ' ')"
mkdir -p /etc/nginx/conf.d
rm -f /etc/nginx/conf.d/default.conf /etc/nginx/sites-enabled/default  # only our listeners
envsubst "$VARS" <"$TEMPLATE" >"/etc/nginx/conf.d/$(basename "$TEMPLATE" .template)"
exec nginx -g 'daemon off;'
