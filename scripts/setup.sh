#!/usr/bin/env bash
# One-command set-up: system packages, Python venv, the project, Kompute's `kp` module, and (for the
# tests) Triton's perf_analyzer.
# Idempotent: a second run only checks and takes a few seconds.
#
# usage: scripts/setup.sh [--runtime-only]
#   --runtime-only   install '.[service]' only (no test extras), e.g. in a service image
# env:
#   VKACT_SKIP_APT=1   do not check/install apt packages (e.g. the image already has them)
#   VKACT_VENV=DIR     where the venv lives (default: .venv in the repo root)
#   PYTHON=python3     interpreter that creates the venv
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=${VKACT_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
EXTRAS=service,test

step() { printf '==> %s\n' "$*"; }
die() { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
  case $arg in
    --runtime-only) EXTRAS=service ;;
    -h|--help) sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $arg (try --help)" ;;
  esac
done

command -v "$PY" >/dev/null || die "$PY not found: install Python >= 3.10 (Debian: apt-get install python3 python3-venv python3-dev)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than 3.10"

# --- 1. system packages --------------------------------------------------------------------
# Vulkan loader + lavapipe (CPU Vulkan driver, so everything runs without a GPU), glslang for
# GLSL -> SPIR-V, the toolchain/headers that build kp (cmake, make, g++, Vulkan headers, fmt), and
# libnghttp2's headers for vkact's gRPC transport (service/native/h2grpc.c).
PKGS=(libvulkan1 libvulkan-dev mesa-vulkan-drivers glslang-tools cmake make g++ libfmt-dev libnghttp2-dev)
# For the tests (not --runtime-only): the portability suite's second driver (SwiftShader, in Chromium's
# common files: 3 packages, about 30 MB with --no-install-recommends) and the Khronos validation layer;
# clang and its runtimes (ASan, UBSan, libFuzzer) for `make test-asan` and `make fuzz`.
if [[ $EXTRAS == *test* ]]; then
  PKGS+=(chromium-common vulkan-validationlayers clang libclang-rt-14-dev)
fi
# Debian's own python3 splits out venv/ensurepip and the C headers kp is compiled against.
if [[ $("$PY" -c 'import sys; print(sys.base_prefix)') == /usr ]]; then
  PKGS+=(python3-venv python3-dev)
fi
# h2load: the gRPC bench's C load generator (bench/h2load_grpc.py; skipped with a message without it).
PKGS+=(nghttp2-client)

if [[ ${VKACT_SKIP_APT:-0} != 1 ]]; then
  step "checking system packages"
  command -v dpkg-query >/dev/null \
    || die "not a Debian/Ubuntu system: install the equivalents of: ${PKGS[*]}, then rerun with VKACT_SKIP_APT=1"
  missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    if ((EUID == 0)); then SUDO=()
    elif command -v sudo >/dev/null; then SUDO=(sudo)
    else die "missing packages, install them as root: apt-get install -y ${missing[*]}"
    fi
    step "installing ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
      || die "apt-get update failed; install these yourself: apt-get install -y ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
      || die "apt-get failed; install them yourself: apt-get install -y ${missing[*]}"
  fi
fi

# --- 2. virtual environment ----------------------------------------------------------------
if [[ ! -x $VENV/bin/python ]]; then
  step "creating venv $VENV"
  existed=0; [[ -e $VENV ]] && existed=1
  if ! "$PY" -m venv "$VENV"; then
    ((existed)) || rm -rf "$VENV"   # do not leave a half-made venv that a rerun would trust
    die "'$PY -m venv' failed (Debian: apt-get install python3-venv)"
  fi
fi
VPY=$VENV/bin/python

# --- 3. the project and its pinned dependencies --------------------------------------------
# Reinstall only when pyproject.toml (or the extras wanted) changed.  A full install also
# satisfies --runtime-only.
STAMP=$VENV/.vkact-stamp
hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ -f $STAMP ]] && grep -qxE "$hash ($EXTRAS|service,test)" "$STAMP"; then
  step "project up to date (.[$(cut -d' ' -f2 "$STAMP")])"
else
  step "installing project .[$EXTRAS]"
  "$VPY" -m pip install -q -e ".[$EXTRAS]" || die "pip install -e '.[$EXTRAS]' failed (see above)"
  echo "$hash $EXTRAS" >"$STAMP"
fi

# --- 4. kp (Kompute), built from its sdist once and cached ---------------------------------
# The installed build must be build-kp.sh's current KP_PATCH_LEVEL, else it is rebuilt/reinstalled.
kp_patch=$(sed -n 's/^KP_PATCH_LEVEL=//p' "$ROOT/scripts/build-kp.sh")
if "$VPY" -c 'import kp' 2>/dev/null && [[ $(cat "$VENV/.vkact-kp-patch" 2>/dev/null) == "$kp_patch" ]]; then
  step "kp already installed ($kp_patch)"
else
  bash "$ROOT/scripts/build-kp.sh" "$VPY"
fi

# --- 5. vkact's C extensions: gRPC's HTTP/2 on libnghttp2, the HTTP/1.1 inference parser (rebuilt when their source changes)
bash "$ROOT/scripts/build-native.sh" "$VPY" || die "building service/native (h2grpc, h1http) failed (see above)"

# --- 6. Triton's perf_analyzer for its tests (tests/service/test_perf_analyzer.py), cached ---------
# A download of its wheel and Debian 13's libc (scripts/perf-analyzer.sh; nothing installed on the
# system). A failure here (no network) is not set-up's: the tests that need it skip, saying why.
if [[ $EXTRAS == *test* ]]; then
  step "preparing perf_analyzer (scripts/perf-analyzer.sh)"
  PYTHON=$VPY bash "$ROOT/scripts/perf-analyzer.sh" --prepare \
    || printf 'setup.sh: warning: perf_analyzer could not be prepared; tests/service/test_perf_analyzer.py will skip\n' >&2
fi

# --- 7. smoke test: a Vulkan device must be visible through kp -----------------------------
step "checking Vulkan device"
"$VPY" -c 'import kp, numpy
p = kp.Manager().get_device_properties()
print("    device:", p.get("device_name"), "| numpy", numpy.__version__)' \
  || die "kp cannot open a Vulkan device; without a GPU install lavapipe: apt-get install -y mesa-vulkan-drivers libvulkan1"
step "done: $VENV"
