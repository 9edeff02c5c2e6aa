#!/usr/bin/env bash
# IREE for a machine without its compiler (the GPU machine: iree-base-compiler is 393 MB and cannot
# travel): the graphs bench's chains compiled here for vulkan-spirv into DEST/iree (bench/iree_aot.py:
# .vmfb files and manifest.json), and the iree-base-runtime wheel for CPython 3.12 x86_64 into DEST.
# There (numpy and ml-dtypes, its only needs, are in the GPU image):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/iree DEST/iree_base_runtime-*.whl
#   PYTHONPATH=/tmp/iree VKACT_IREE_AOT=DEST/iree python3 -m bench --only graphs
#
# usage: scripts/iree-aot.sh [DEST]   (default .gpu, ignored by git)
# env:   PY=python with the bench extra (default .venv/bin/python; installs '.[bench]' where the compiler is missing)
#        LOG2="24 26"    sizes, as powers of two: the modules have static shapes, one size each (2^24 as on
#                        lavapipe; 2^26, scripts/gpu-run.sh's default size)
#        TARGET=ampere   --iree-vulkan-target (IREE's Vulkan targets stop at Ampere; Hopper has all its features)
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=${1:-.gpu}
PY=${PY:-.venv/bin/python}
LOG2=${LOG2:-24 26}
TARGET=${TARGET:-ampere}

"$PY" -c 'import iree.compiler' 2>/dev/null || "$PY" -m pip install -q -e '.[service,test,bench]'
# shellcheck disable=SC2086 # LOG2 is a list
"$PY" -m bench.iree_aot "$DEST/iree" --log2 $LOG2 --target "$TARGET"
runtime=$("$PY" -c 'from importlib.metadata import version; print(version("iree-base-runtime"))')
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$DEST" "iree-base-runtime==$runtime"
ls -l "$DEST"/iree_base_runtime-"$runtime"-*.whl
