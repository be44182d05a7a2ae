#!/bin/bash
# What `make compose-check` needs on the host, installed where this script may (root with apt-get, as
# `make test` does for nginx), else one line naming what is missing (exit 1):
#   a compose tool (`docker compose` or Debian's `docker-compose`), a running Docker engine, debootstrap
#   (only while the local base image is not built yet), curl, ip (iproute2) and nsenter (util-linux; the
#   probes from a second network namespace).
# The Docker engine: Debian's docker.io; a dockerd that is installed but not running is started here (its
# log: /var/log/fedpers-dockerd.log) and recorded in the file FEDPERS_DOCKERD_STARTED names ("pid N", or
# "systemd"), so that check.sh stops it again when it ends; a dockerd that was running is left alone.
# Nothing else on the machine is changed.
#   deploy/compose/prereqs.sh [BASE_IMAGE]
set -uo pipefail
BASE_IMAGE="${1:-fedpers/local-base:bookworm}"
ROOT=0; [ "$(id -u)" = 0 ] && ROOT=1
APT=0; [ "$ROOT" = 1 ] && command -v apt-get >/dev/null 2>&1 && APT=1
UPDATED=0

install() {  # install PACKAGE... with apt where we may; returns 1 otherwise
  [ "$APT" = 1 ] || return 1
  if [ "$UPDATED" = 0 ]; then apt-get update -qq >/dev/null 2>&1; UPDATED=1; fi
  echo "compose-check: installing $* (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1
}
missing() { echo "compose-check: $1 missing: $2"; exit 1; }
how() { [ "$APT" = 1 ] && echo "apt-get install $1 failed" || echo "install $1 (as root: apt-get install $1)"; }

has_compose() { docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; }
command -v curl >/dev/null 2>&1 || install curl || missing curl "$(how curl)"
command -v ip >/dev/null 2>&1 || install iproute2 || missing "ip (iproute2)" "$(how iproute2)"
command -v nsenter >/dev/null 2>&1 || install util-linux || missing "nsenter (util-linux)" "$(how util-linux)"
command -v dockerd >/dev/null 2>&1 || install docker.io || missing "the Docker engine (dockerd)" "$(how docker.io)"
has_compose || install docker-compose || missing "a compose tool (docker compose or docker-compose)" "$(how docker-compose)"

if ! docker info >/dev/null 2>&1; then
  [ "$ROOT" = 1 ] || missing "a running Docker engine" "start dockerd as root (e.g. systemctl start docker)"
  echo "compose-check: starting dockerd (log /var/log/fedpers-dockerd.log)"
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl start docker >/dev/null 2>&1 && [ -n "${FEDPERS_DOCKERD_STARTED:-}" ] \
      && echo systemd >"$FEDPERS_DOCKERD_STARTED"
  else
    # No init system to own it (a container): dockerd runs detached, in its own session (setsid execs it:
    # $! is dockerd's PID), and stays up after this script until check.sh stops it.
    setsid dockerd >/var/log/fedpers-dockerd.log 2>&1 </dev/null &
    [ -n "${FEDPERS_DOCKERD_STARTED:-}" ] && echo "pid $!" >"$FEDPERS_DOCKERD_STARTED"
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || missing "a running Docker engine" "dockerd did not start (see /var/log/fedpers-dockerd.log)"
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null 2>&1 || install debootstrap || missing debootstrap "$(how debootstrap) (builds the local base image)"
fi
echo "compose-check: prerequisites present ($(docker version --format 'engine {{.Server.Version}}' 2>/dev/null)," \
     "$(docker compose version --short 2>/dev/null || docker-compose version --short 2>/dev/null))"
