#!/usr/bin/env bash
# Fills .gpu/ (ignored) with what scripts/gpu-run.sh needs on a GPU host that has Python 3.12 with
# PyTorch, numpy, pytest, pytest-xdist, hypothesis, httpx, grpcio and protobuf, no network and no Vulkan
# loader (the device tool's 'cuda' image):
#   .gpu/wheels/   cp312 manylinux wheels of what pyproject's service and test extras install and that
#                  image lacks (or holds at another version where ours is pinned for a reason: grpcio/protobuf),
#                  and kp built for CPython 3.12 by scripts/build-kp.sh
#   .gpu/native/   service/native's C extensions built for CPython 3.12 (scripts/build-native.sh)
#   .gpu/debs/     Debian 12 packages to unpack there: libvulkan1 (the loader), libfmt9 (kp links it),
#                  libnghttp2-14 (h2grpc links it), glslang-tools + spirv-tools (shaders compile at run time),
#                  vulkan-validationlayers (the engine tests' oracle)
#   .gpu/spirv/    every kernel variant's SPIR-V (python -m service.shaders), so the run compiles none
#   .gpu/bin/      bench/native/vk_submit, built here (it links only the loader)
# Needs: pyenv's python3.12 (PYTHON312), pip's index, apt's lists (its own, under /tmp), the build tools of make setup.
# usage: scripts/gpu-bundle.sh        (re-running replaces .gpu/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
# the first Python 3.12 that runs (pyenv's shim answers only where 3.12 is the selected version)
PY312=
for candidate in ${PYTHON312:-} "$HOME"/.pyenv/versions/3.12*/bin/python3.12 python3.12; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY312=$candidate; break; fi
done
[[ -n $PY312 ]] || { echo "gpu-bundle.sh: no python3.12 (set PYTHON312)" >&2; exit 1; }
VPY=${VKACT_VENV:-$ROOT/.venv}/bin/python
[[ -x $VPY ]] || { echo "gpu-bundle.sh: run make setup first (needs $VPY to compile the SPIR-V)" >&2; exit 1; }
step() { printf '==> %s\n' "$*"; }
source scripts/gpu-sources.sh
GPU=$ROOT/.gpu
rm -rf "$GPU"
mkdir -p "$GPU"/{wheels,native,debs,spirv,iree}

# --- wheels: the extras' pins, resolved for cp312 manylinux x86_64 ---------------------------------------
# Left out: numpy (the image's 2.5 torch was built with), onnx/onnxruntime/mpmath/ml-dtypes/uvloop
# (there), the deploy tests' checkov and kubernetes-validate (not run there), the bench extra (its Vulkan peers).
step "wheels for CPython 3.12"
PINS=$(sed -n '/^service = \[/,/^\]/p; /^test = \[/,/^\]/p' pyproject.toml | grep -o '"[^"]*==[^"]*"' | tr -d '"' \
  | grep -viE '^(numpy|onnx|onnxruntime|mpmath|ml-dtypes|uvloop|kubernetes-validate|checkov|pytest|hypothesis|pyyaml)==')
PLAT=()
for p in manylinux_2_{5,17,24,27,28,31,34}_x86_64 manylinux2014_x86_64 manylinux1_x86_64 linux_x86_64 any; do PLAT+=(--platform "$p"); done
# shellcheck disable=SC2086
"$PY312" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  "${PLAT[@]}" -d "$GPU/wheels" $PINS 2>&1 | grep -v "^WARNING: Location" || true
# Dependencies the image already holds (KINDS.md's list): theirs are used, one version of each (fastapi's tiny
# annotated_doc and typing_extensions travel anyway: fastapi and pydantic need recent ones).
IMAGE_HAS='aiohappyeyeballs aiohttp aiosignal anyio attrs certifi charset_normalizer click frozenlist h11 httpcore httpx
idna iniconfig markupsafe ml_dtypes multidict numpy packaging pluggy propcache pygments pytest pyyaml setuptools six urllib3 yarl
uvloop mpmath hypothesis sortedcontainers'
for name in $IMAGE_HAS; do rm -f "$GPU/wheels/$name"-[0-9]*.whl; done

# --- kp for CPython 3.12 (build-kp.sh caches it under ~/.cache/vkact) ------------------------------------
step "kp for CPython 3.12"
BUILD_VENV=$(mktemp -d)/venv
trap 'rm -rf "${BUILD_VENV%/venv}"' EXIT
"$PY312" -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/python" -m pip install -q --disable-pip-version-check "numpy==$(sed -n 's/^ *"numpy==\([^"]*\)".*/\1/p' pyproject.toml)"
bash scripts/build-kp.sh "$BUILD_VENV/bin/python"
kp_patch=$(sed -n 's/^KP_PATCH_LEVEL=//p' scripts/build-kp.sh)
cp "${XDG_CACHE_HOME:-$HOME/.cache}/vkact/wheels/$kp_patch"/kp-0.9.0-cp312-cp312-linux_x86_64.whl "$GPU/wheels/"

# --- service/native's extensions for CPython 3.12 -------------------------------------------------------
step "native extensions for CPython 3.12"
bash scripts/build-native.sh "$BUILD_VENV/bin/python"
cp service/native/_h2grpc.cpython-312-x86_64-linux-gnu.so service/native/_h1http.cpython-312-x86_64-linux-gnu.so "$GPU/native/"

# --- Debian packages (amd64), through apt's own lists under /tmp ------------------------------------------
step "Debian packages"
APT=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/vkact-apt-lists -oDir::Cache=/tmp/vkact-apt-cache)
mkdir -p /tmp/vkact-apt-lists/partial /tmp/vkact-apt-cache/archives/partial
apt-get "${APT[@]}" -q update >/dev/null 2>&1 || echo "gpu-bundle.sh: apt-get update failed; using the lists already there" >&2
(cd "$GPU/debs" && apt-get "${APT[@]}" -q download libvulkan1 libfmt9 libnghttp2-14 glslang-tools spirv-tools vulkan-validationlayers)
# GLVND and its X11 needs: NVIDIA's Vulkan ICD is libGLX_nvidia, which a bare image cannot load without them
# (the first GPU call: vkCreateInstance failed with the image's own ICD file)
mkdir -p "$GPU/debs/gl"
(cd "$GPU/debs/gl" && apt-get "${APT[@]}" -q download libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 \
  libx11-6 libx11-data libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 libxext6)

# --- IREE for the graphs bench: its chains compiled here, the runtime wheel (scripts/iree-aot.sh) --------
step "IREE modules and runtime"
PY=$VPY bash scripts/iree-aot.sh "$GPU"
mv "$GPU"/iree_base_runtime-*.whl "$GPU/wheels/"

# --- bench/native/vk_submit: a submission and its wait timed call by call, in C ----------------------------
step "vk_submit"
mkdir -p "$GPU/bin"
glslangValidator -V --target-env vulkan1.2 --vn vk_submit_spv -o "$GPU/bin/vk_submit_spv.h" bench/native/vk_submit.comp >/dev/null
cc -O2 -Wall -Wextra -Werror -I"$GPU/bin" -o "$GPU/bin/vk_submit" bench/native/vk_submit.c -lvulkan
rm "$GPU/bin/vk_submit_spv.h"

# --- every kernel's SPIR-V --------------------------------------------------------------------------------
step "SPIR-V"
VKACT_SPIRV_CACHE=$GPU/spirv "$VPY" -m service.shaders

# what the bundle was built from: gpu-run.sh warns when the checkout it runs in differs (stale extensions or SPIR-V)
sources_hash > "$GPU/SOURCES"

du -sh "$GPU" "$GPU"/* | sed 's/^/    /'
ls -la "$GPU/wheels" "$GPU/debs" | awk 'NF > 5 {print "    " $5, $NF}'
size=$(du -sm "$GPU" | cut -f1)
((size < 58)) || { echo "gpu-bundle.sh: .gpu/ is ${size} MiB (the budget is under 58: 64 MiB travel, the checkout's files included)" >&2; exit 1; }
step "done: .gpu/ ${size} MiB"
