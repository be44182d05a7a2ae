#!/bin/bash
# Builds the local stand-in for Flower's images that `make compose-check` uses where Docker Hub cannot be
# reached: a Debian bookworm rootfs (debootstrap, minbase) with Debian's python3 and nginx, a venv at
# /python/venv holding the project's pinned dependencies (installed from this machine's pip indexes, never
# the network), and a user `app` with uid 49999 as in Flower's images; then `docker import`. It stands in for
# flwr/superlink, flwr/supernode, flwr/superexec and nginx at once (deploy/compose/local-base.yml).
# Cached: an existing image is reused unless REBUILD_BASE=1.
#   deploy/compose/build-base.sh [IMAGE]      (root; needs debootstrap and a running dockerd)
set -euo pipefail
IMAGE="${1:-${FEDPERS_LOCAL_BASE:-fedpers/local-base:bookworm}}"
ROOT_DIR="$(cd "$(dirname "$0")/../.." && pwd)"
# torch: the version requirements.lock pins (the CPU wheel of it where /opt/wheels has one). BASE_TORCH=<a
# requirement or wheel path> builds on another one instead, said in the output and in the image's label.
LOCKED_TORCH="$(sed -n 's/^torch==//p' "$ROOT_DIR/requirements.lock" | head -1)"
[ -n "$LOCKED_TORCH" ] || { echo "build-base.sh: requirements.lock pins no torch" >&2; exit 1; }
if [ -n "${BASE_TORCH:-}" ]; then
  TORCH_WHEEL="$BASE_TORCH"
  echo "build-base.sh: BASE_TORCH=$BASE_TORCH: the images get this torch, not the locked $LOCKED_TORCH"
else
  TORCH_WHEEL="$(ls /opt/wheels/torch-"$LOCKED_TORCH"+cpu-cp311-*.whl 2>/dev/null | tail -1 || true)"
  TORCH_WHEEL="${TORCH_WHEEL:-torch==$LOCKED_TORCH}"
fi
# A cached image is reused only if it was built on the same torch (its label says which).
if docker image inspect "$IMAGE" >/dev/null 2>&1 && [ "${REBUILD_BASE:-0}" != 1 ]; then
  BUILT_ON="$(docker image inspect -f '{{index .Config.Labels "fedpers.torch"}}' "$IMAGE" 2>/dev/null || true)"
  if [ "$BUILT_ON" = "$TORCH_WHEEL" ]; then
    echo "base image $IMAGE exists (cached, torch $TORCH_WHEEL; REBUILD_BASE=1 rebuilds it)"; exit 0
  fi
  echo "base image $IMAGE was built on torch '${BUILT_ON:-unknown}', not $TORCH_WHEEL: rebuilding it"
fi
[ "$(id -u)" = 0 ] || { echo "build-base.sh: debootstrap and chroot need root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build-base.sh: debootstrap missing: apt-get install debootstrap" >&2; exit 1; }
# The mirror apt already uses (deb822 sources or a classic sources.list), else Debian's default.
MIRROR="$(grep -hoE '^URIs: *http[^ ]*/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | sed 's/^URIs: *//')"
[ -n "$MIRROR" ] || MIRROR="$(grep -hoE '^deb +http[^ ]*/debian ' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

WORK="$(mktemp -d /var/tmp/fedpers-base.XXXXXX)"
RFS="$WORK/rootfs"
MOUNTS=()
cleanup() {
  local m
  for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount -l "${MOUNTS[i]}" 2>/dev/null || true; done
  if grep -q " $RFS" /proc/mounts; then echo "build-base.sh: $RFS still has mounts; not removing $WORK" >&2; return; fi
  rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT
bind() {  # bind-mount host path $1 read-only at the same path in the chroot
  mkdir -p "$RFS$1"; mount --bind "$1" "$RFS$1"; mount -o remount,bind,ro "$RFS$1"; MOUNTS+=("$RFS$1")
}

t0=$(date +%s)
# The debootstrap stage is cached as a tarball too: it is the slow, network-bound part.
DEBOOTSTRAP_CACHE="${DEBOOTSTRAP_CACHE:-/var/tmp/fedpers-debootstrap-bookworm.tar}"
if [ -s "$DEBOOTSTRAP_CACHE" ] && [ "${REBUILD_BASE:-0}" != 1 ]; then
  mkdir -p "$RFS"; tar -C "$RFS" -xf "$DEBOOTSTRAP_CACHE"
  echo "rootfs from $DEBOOTSTRAP_CACHE"
else
  echo "debootstrap bookworm (minbase) from $MIRROR"
  debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,nginx-light,gettext-base,curl \
    bookworm "$RFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; exit 1; }
  tar -C "$RFS" -cf "$DEBOOTSTRAP_CACHE.tmp" . && mv "$DEBOOTSTRAP_CACHE.tmp" "$DEBOOTSTRAP_CACHE"
  echo "debootstrap done in $(( $(date +%s) - t0 )) s"
fi

# pip inside the chroot uses this machine's pip setup as is: the same wheel dirs, local indexes, pip.conf,
# constraints and CA bundle (same paths, read-only), and its resolver.
mount -t proc proc "$RFS/proc"; MOUNTS+=("$RFS/proc")
for p in /opt/wheels /opt/pypi /opt/pypi-more /etc/xdg/pip; do [ -d "$p" ] && bind "$p"; done
[ -f /etc/pip.conf ] && { touch "$RFS/etc/pip.conf"; mount --bind /etc/pip.conf "$RFS/etc/pip.conf"; MOUNTS+=("$RFS/etc/pip.conf"); }
cp -L /etc/resolv.conf "$RFS/etc/resolv.conf"
# Debian's pip verifies against the system bundle whatever PIP_CERT says: during the install the chroot
# gets this machine's bundle (which may hold a local registry proxy's CA); Debian's own is put back after.
PIP_CERT_FILE="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
mkdir -p "$RFS/tmp/fedpers"
cp "$RFS/etc/ssl/certs/ca-certificates.crt" "$RFS/tmp/fedpers/debian-ca-certificates.crt"
cp -L "$PIP_CERT_FILE" "$RFS/etc/ssl/certs/ca-certificates.crt"
# The project's lock minus torch/CUDA: the image uses the CPU torch wheel found in /opt/wheels.
grep -vE '^(torch|torchvision|triton|nvidia-|cuda-)' "$ROOT_DIR/requirements.lock" >"$RFS/tmp/fedpers/constraints.txt"
# torch (TORCH_WHEEL, above): the locked version's CPU wheel if /opt/wheels has it (no CUDA libraries in
# the image), else the locked version from the pip indexes this machine is set up with.
case "$TORCH_WHEEL" in
  torch==*) echo "no CPU wheel torch-$LOCKED_TORCH+cpu-cp311-*.whl in /opt/wheels: installing $TORCH_WHEEL from the pip indexes";;
esac
cat >"$RFS/tmp/fedpers/install.sh" <<SH
set -eu
rm -f /etc/nginx/sites-enabled/default           # only the rendered fleet-proxy.conf listens
groupadd --gid 49999 app
useradd --uid 49999 --gid 49999 --home-dir /app --create-home --shell /bin/sh app
python3 -m venv /python/venv
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/opt/wheels \
       PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DEFAULT_TIMEOUT=180
/python/venv/bin/pip install -q "$TORCH_WHEEL" flwr==1.42.0 numpy scikit-learn pyyaml tomli-w cryptography \
    -c /tmp/fedpers/constraints.txt
/python/venv/bin/python -c "import flwr, torch, sklearn; print('flwr', flwr.__version__, 'torch', torch.__version__)"
chown -R app:app /python /app
cp /tmp/fedpers/debian-ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
apt-get clean; rm -rf /var/lib/apt/lists/* /root/.cache /tmp/fedpers
SH
t1=$(date +%s)
chroot "$RFS" /bin/sh /tmp/fedpers/install.sh
echo "python deps installed in $(( $(date +%s) - t1 )) s"
for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount "${MOUNTS[i]}"; done; MOUNTS=()
rmdir "$RFS/opt/wheels" "$RFS/opt/pypi" "$RFS/opt/pypi-more" "$RFS/etc/xdg/pip" 2>/dev/null || true
rm -f "$RFS/etc/pip.conf"; : >"$RFS/etc/resolv.conf"   # docker provides resolv.conf at run time

# PATH and user as in Flower's images (venv first, uid 49999, workdir /app).
tar -C "$RFS" -c . | docker import \
  -c 'ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'WORKDIR /app' -c 'USER app' -c "LABEL fedpers.torch=$TORCH_WHEEL" \
  -m "fedpers local base: debootstrap bookworm + python deps (build-base.sh)" - "$IMAGE" >/dev/null
echo "base image $IMAGE built in $(( $(date +%s) - t0 )) s"
