#!/usr/bin/env bash
# Both service images, vkact:cpu and vkact:gpu, from docker/Dockerfile (`make images`).
#
# usage: scripts/build-images.sh [cpu] [gpu]      (default: both)
# env:
#   VKACT_IMAGE_TAG=name      image name (default vkact): builds NAME:cpu and NAME:gpu
#   CONTAINER_ENGINE=podman   force an engine (default: docker if its daemon answers, else podman)
#
# docker where a daemon answers, else podman (on Debian, installed here when missing).  podman builds
# with --isolation chroot (works inside an unprivileged container, where runc cannot make namespaces)
# and --pull=never: where no registry is reachable the base, debian:bookworm-slim, is made here by
# debootstrap from Debian's own archive and imported under that name (a registry's image is used
# when the engine already has it or can pull it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

NAME=${VKACT_IMAGE_TAG:-vkact}
BASE=debian:bookworm-slim
TARGETS=("$@"); ((${#TARGETS[@]})) || TARGETS=(cpu gpu)

step() { printf '==> %s\n' "$*"; }
die() { printf 'build-images.sh: error: %s\n' "$*" >&2; exit 1; }
for t in "${TARGETS[@]}"; do [[ $t == cpu || $t == gpu ]] || die "unknown target $t (cpu or gpu)"; done

apt_install() {
  command -v apt-get >/dev/null || die "no docker daemon and no podman: install one (or podman's equivalent of: $*)"
  ((EUID == 0)) || die "no docker daemon and no podman: as root, apt-get install -y $*"
  step "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

ENGINE=${CONTAINER_ENGINE:-}
if [[ -z $ENGINE ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
  else
    command -v podman >/dev/null || apt_install podman uidmap fuse-overlayfs
    ENGINE=podman
  fi
fi
step "engine: $ENGINE"

# The base: the engine's own copy, else a pull, else debootstrap (minbase = what -slim holds, plus
# the apt sources the Dockerfile's apt-get needs).
if ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1 && ! "$ENGINE" pull -q "$BASE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || apt_install debootstrap
  rootfs=$(mktemp -d /var/tmp/vkact-base.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  step "making $BASE with debootstrap (no registry answered)"
  debootstrap --variant=minbase bookworm "$rootfs" >/dev/null   # debootstrap's own default mirror
  # it lists bookworm alone: add its updates and security suites, as the registry's image has them
  sed -n 's|^deb \([^ ]*\) bookworm main$|deb \1 bookworm-updates main\ndeb \1-security bookworm-security main|p' \
    "$rootfs/etc/apt/sources.list" >>"$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$ENGINE" import --change 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$rootfs"; trap - EXIT
fi

# --format docker keeps the HEALTHCHECK (OCI images have none); BuildKit's docker keeps it anyway.
if [[ $ENGINE == podman ]]; then
  BUILD=(podman build --isolation chroot --pull=never --format docker)
else
  BUILD=(docker build)
fi
# Behind a TLS-intercepting proxy pip in the build needs the host's CA bundle (apt uses plain HTTP):
# where the host's pip has one configured, podman lends it to the build's RUN steps (not the image).
host_ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null | grep "^/" || true)}
if [[ $ENGINE == podman && -n $host_ca && -f $host_ca ]]; then
  pipconf=$(mktemp /var/tmp/vkact-pip.XXXXXX.conf)
  trap 'rm -f "$pipconf"' EXIT
  printf '[global]\ncert = /run/host-ca.crt\n' >"$pipconf"
  BUILD+=(-v "$host_ca:/run/host-ca.crt:ro" -v "$pipconf:/etc/pip.conf:ro")
fi
for t in "${TARGETS[@]}"; do
  step "building $NAME:$t"
  start=$SECONDS
  "${BUILD[@]}" -f docker/Dockerfile --target "$t" -t "$NAME:$t" .
  step "$NAME:$t built in $((SECONDS - start)) s: $("$ENGINE" image inspect --format '{{.Size}}' "$NAME:$t" | awk '{printf "%.0f MB", $1 / 1e6}')"
done
