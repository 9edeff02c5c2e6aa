#!/usr/bin/env bash
# scripts/gpu-run.sh here, on lavapipe, as the GPU host would run it: in a copy of what the device tool sends
# (tracked and untracked-not-ignored files, and .gpu/), under a Python 3.12 venv that holds only packages
# the GPU image has (no torch: the bench's PyTorch columns must say why and the rest must run), at a small
# size. Run scripts/gpu-bundle.sh first.
# usage: scripts/gpu-dry-run.sh   env: OUT (default /tmp/gpuout), VKACT_GPU_* (scripts/gpu-run.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -d .gpu/wheels ]] || { echo "gpu-dry-run.sh: run scripts/gpu-bundle.sh first" >&2; exit 1; }
DRY=${VKACT_GPU_DRY:-/tmp/vkact-gpu-dry}
VENV=$DRY/venv
PY312=
for candidate in ${PYTHON312:-} "$HOME"/.pyenv/versions/3.12*/bin/python3.12 python3.12; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY312=$candidate; break; fi
done
[[ -n $PY312 ]] || { echo "gpu-dry-run.sh: no python3.12" >&2; exit 1; }
if [[ ! -x $VENV/bin/python ]]; then
  "$PY312" -m venv "$VENV"
  # what gpu-bundle.sh leaves to the image (KINDS.md's package list), and the image's test plugins
  "$VENV/bin/python" -m pip install -q numpy pytest pytest-xdist hypothesis httpx grpcio protobuf anyio h11 httpcore idna \
    certifi mpmath onnx onnxruntime uvloop ml-dtypes aiohttp packaging pyyaml sortedcontainers attrs urllib3 six setuptools click \
    markupsafe charset-normalizer pygments
fi
rm -rf "$DRY/repo" && mkdir -p "$DRY/repo"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$DRY/repo" -xf -
cp -r .gpu "$DRY/repo/.gpu"
rm -rf "${OUT:=/tmp/gpuout}" && mkdir -p "$OUT"
cd "$DRY/repo"
OUT=$OUT PYTHON=$VENV/bin/python VKACT_GPU_ANY_DEVICE=1 VKACT_GPU_LOG2=${VKACT_GPU_LOG2:-16} VKACT_GPU_JOBS=${VKACT_GPU_JOBS:-2} bash scripts/gpu-run.sh
