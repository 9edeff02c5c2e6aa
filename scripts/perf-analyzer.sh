#!/usr/bin/env bash
# Triton's perf_analyzer (PyPI perf-analyzer) on this machine, prepared once and cached.
#
# usage: scripts/perf-analyzer.sh [PERF_ANALYZER_ARGS...]   run it (preparing it first if needed)
#        scripts/perf-analyzer.sh --prepare                  only prepare it (exit 1 when it cannot be)
#
# The wheel's binary needs glibc 2.38 (and GCC 13's libstdc++); Debian 12 has 2.36, and `pip install
# perf-analyzer` there silently installs a 0.1.0 placeholder. Where the system's libc is too old, Debian
# 13's libc6, libstdc++6 and libgcc-s1 are downloaded with apt under a configuration of this script's own
# (its own sources list for trixie, state and cache, in the cache folder: nothing is installed on the
# system and the system's apt state is untouched), unpacked with dpkg-deb, and the binary is started
# through their dynamic loader. The Debian mirror is the one this system's apt uses for its own release.
#
# env: VKACT_PERF_ANALYZER_DIR  where it is prepared (default ${XDG_CACHE_HOME:-~/.cache}/vkact/perf_analyzer)
#      VKACT_DEBIAN_MIRROR      the Debian archive to take trixie's libraries from (default: apt's, as above)
#      PYTHON                   the interpreter whose pip downloads the wheel (default: .venv's, else python3)
set -euo pipefail

PA_VERSION=2.60.0
PA_PLATFORM=manylinux_2_38_x86_64   # the tag of the wheel that holds the binary
LIBS_SUITE=trixie                   # first Debian release with glibc >= 2.38
LIBS_PACKAGES=(libc6 libstdc++6 libgcc-s1)
KEY=$PA_VERSION-$LIBS_SUITE         # names a prepared tree: a new version prepares afresh

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${VKACT_PERF_ANALYZER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vkact/perf_analyzer}
PREPARED=$DIR/$KEY
RUN=$PREPARED/perf_analyzer   # the launcher written at the end of a preparation

step() { printf '==> %s\n' "$*" >&2; }
die() { printf 'perf-analyzer.sh: %s\n' "$*" >&2; exit 1; }

python_with_pip() {
  local py
  for py in "${PYTHON:-}" "${VKACT_VENV:-$ROOT/.venv}/bin/python" python3; do
    [[ -n $py ]] && command -v "$py" >/dev/null && "$py" -m pip --version >/dev/null 2>&1 && { echo "$py"; return; }
  done
  die "no Python with pip to download perf-analyzer (set PYTHON)"
}

# The archive apt uses for this system's own Debian release (e.g. bookworm, not bookworm-security),
# so trixie's packages come through the same mirror or proxy.
debian_mirror() {
  if [[ -n ${VKACT_DEBIAN_MIRROR:-} ]]; then echo "$VKACT_DEBIAN_MIRROR"; return; fi
  local codename uri
  codename=$(. /etc/os-release && [[ ${ID:-} == debian ]] && echo "${VERSION_CODENAME:-}") || true
  [[ -n $codename ]] || die "not Debian: no mirror to take $LIBS_SUITE's libraries from (set VKACT_DEBIAN_MIRROR)"
  uri=$(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 2>/dev/null \
        | awk -v c="$codename" '$2 == c && $3 == "main" { print $1; exit }')
  [[ -n $uri ]] || die "apt has no source for $codename main (set VKACT_DEBIAN_MIRROR)"
  echo "${uri%/}"
}

# Debian 13's libraries into $1/root, by apt-get download under a configuration of our own in $1/apt.
fetch_libraries() {
  local work=$1 mirror keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "apt-get and dpkg-deb are needed to fetch glibc 2.38"
  [[ $(dpkg --print-architecture) == amd64 ]] || die "perf_analyzer's wheel is x86_64 only"
  [[ -r $keyring ]] || die "$keyring missing (apt-get install debian-archive-keyring)"
  mirror=$(debian_mirror)
  mkdir -p "$work"/apt/{lists/partial,archives/partial} "$work/debs" "$work/root"
  echo "deb [signed-by=$keyring] $mirror $LIBS_SUITE main" >"$work/apt/sources.list"
  : >"$work/apt/status"
  local apt=(apt-get -q
    -o Dir::Etc::SourceList="$work/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o Dir::State::Lists="$work/apt/lists" -o Dir::State::Status="$work/apt/status"
    -o Dir::Cache="$work/apt" -o Dir::Cache::Archives="$work/apt/archives"
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
    -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
  step "fetching ${LIBS_PACKAGES[*]} from $LIBS_SUITE (own apt configuration; nothing installed)"
  "${apt[@]}" update --error-on=any >&2 || die "apt-get update of $LIBS_SUITE failed (no network?)"
  (cd "$work/debs" && "${apt[@]}" download "${LIBS_PACKAGES[@]}" >&2) || die "apt-get download ${LIBS_PACKAGES[*]} failed"
  local deb
  for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  rm -rf "$work/apt" "$work/debs"   # the lists are ~20 MB; only the unpacked libraries are used
  [[ -x $work/root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 ]] || die "no dynamic loader in $LIBS_SUITE's libc6"
}

prepare() {
  local work py bin
  mkdir -p "$DIR"
  rm -rf "$DIR"/.prepare.*   # a killed preparation's (this one holds the lock: no other is running)
  work=$(mktemp -d "$DIR/.prepare.XXXXXX")
  chmod 755 "$work"
  trap 'rm -rf "$work"' EXIT
  py=$(python_with_pip)
  step "downloading perf-analyzer $PA_VERSION ($PA_PLATFORM wheel)"
  "$py" -m pip download -q --no-deps --only-binary=:all: --platform "$PA_PLATFORM" \
    -d "$work/wheel" "perf-analyzer==$PA_VERSION" >&2 || die "pip download perf-analyzer==$PA_VERSION failed (no network?)"
  "$py" -m zipfile -e "$work"/wheel/perf_analyzer-*.whl "$work/wheel" || die "cannot unpack the wheel"
  bin=$work/wheel/perf_analyzer/bin/perf_analyzer
  [[ -f $bin ]] || die "the wheel has no perf_analyzer binary"
  chmod +x "$bin"
  if "$bin" --version >/dev/null 2>&1; then   # the system's libc is new enough: run it as it is
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$PREPARED/wheel/perf_analyzer/bin/perf_analyzer" >"$work/perf_analyzer"
  else
    fetch_libraries "$work"
    local lib=$PREPARED/root/usr/lib/x86_64-linux-gnu
    printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' \
      "$lib/ld-linux-x86-64.so.2" "$lib" "$PREPARED/wheel/perf_analyzer/bin/perf_analyzer" >"$work/perf_analyzer"
  fi
  chmod +x "$work/perf_analyzer"
  rm -rf "$PREPARED"
  mv "$work" "$PREPARED"   # whole or not at all: a failed preparation leaves no launcher behind
  trap - EXIT
  "$RUN" --version >/dev/null 2>&1 || { rm -rf "$PREPARED"; die "the prepared perf_analyzer does not start"; }
  step "perf_analyzer ready: $RUN"
}

if [[ ! -x $RUN ]]; then
  # One preparation at a time (parallel test runs share the cache); the second finds it done.
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock 9
  [[ -x $RUN ]] || prepare
  exec 9>&-
fi
[[ ${1:-} == --prepare ]] && exit 0
exec "$RUN" "$@"
