#!/usr/bin/env bash
# The whole GPU check in one command, on a host with Python 3.12 (PyTorch, numpy, pytest, pytest-xdist,
# hypothesis, httpx, grpcio, protobuf), no network and no Vulkan loader: the device tool's machine.
# Run from the repo root with .gpu/ (scripts/gpu-bundle.sh) beside it; everything it writes goes to $OUT
# (run.log, RESULTS.md, and logs.tgz: every step's log, the junit files, the GPU's clocks sampled every
# 200 ms through the benches).
#   v. bench/native/vk_submit (.gpu/bin): one submission and its wait, call by call, in C without kp or Python
#   g. python -m bench.gpu_diag: one dispatch's wall time against ten in a command buffer and the GPU's timestamps
#   h. the same with KP_FENCE_SPIN_US=0 (the fence not polled before the blocking wait: kp patch 9, which the
#      engine turns on for NVIDIA's driver, service/device_tuning.py)
#   a. python -m bench --only gpu at 2^VKACT_GPU_LOG2 FLOAT32 elements (default 26): kernels against the copy
#      shader and PyTorch CUDA; its section of bench/RESULTS.md
#   b. tests/engine, glsl, descriptors, conformance in device memory under the Khronos validation layer
#   c. the same in host memory
#   e. python -m bench --only graphs at 2^24 (issue 18's chains), IREE from the modules compiled ahead of time
#      (.gpu/iree, scripts/iree-aot.sh), run with iree-base-runtime alone
#   f. python -m bench.gpu_tuning: workgroup size x units per invocation, host against device memory
#   d. tests/service, no validation
#   i. python -m bench.direct_replay: a large job's replay with its kernel on the request's slot (host memory
#      imported, VK_EXT_external_memory_host) against the copying replay: what VKACT_SLOT_IMPORT=on would do there
#   k. the direct-run tests and tests/service with VKACT_SLOT_IMPORT=on (the GPU's kernels on imported host memory)
# Each step under its own `timeout` (SIGINT first: pytest then prints its summary and writes its junit xml),
# within VKACT_GPU_BUDGET_S seconds in all (default 450), in that order; a step with too little time left
# is skipped and says so. The last lines are one summary line per step.
# env: OUT (default /tmp/gpuout), PYTHON (default python3), VKACT_GPU_LOG2, VKACT_GPU_REPEAT (bench rounds,
#      default 20), VKACT_GPU_JOBS (pytest-xdist workers, default 8), VKACT_GPU_BUDGET_S, VKACT_GPU_STEPS (default
#      v,g,h,a,b,c,e,f,d,i,k: steps run in this order; a rerun of some steps only); extra pytest arguments for the test steps in VKACT_GPU_PYTEST_ARGS
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpuout}
mkdir -p "$OUT"
# everything this script prints also goes to $OUT/run.log (a pipeline, so that it is whole when the script ends)
if [[ -z ${VKACT_GPU_LOGGED:-} ]]; then
  VKACT_GPU_LOGGED=1 OUT=$OUT bash "${BASH_SOURCE[0]}" "$@" 2>&1 | tee "$OUT/run.log"
  exit "${PIPESTATUS[0]}"
fi
PY=${PYTHON:-python3}
LOG2=${VKACT_GPU_LOG2:-26}
REPEAT=${VKACT_GPU_REPEAT:-20}
JOBS=${VKACT_GPU_JOBS:-8}
BUDGET=${VKACT_GPU_BUDGET_S:-450}
WIND_DOWN=15                  # seconds an interrupted step may take to stop (pytest's summary); then SIGKILL
STEPS=${VKACT_GPU_STEPS:-v,g,h,a,b,c,e,f,d,i,k}
START=$SECONDS
SITE=/tmp/vkact-site          # the bundle's wheels
DEBROOT=/tmp/vkact-root       # the bundle's packages other than the loader (into / only the loader goes)
step() { printf '\n==> [%3d s] %s\n' $((SECONDS - START)) "$*"; }

# --- the bundle -------------------------------------------------------------------------------------------
step "installing .gpu/"
[[ -d .gpu/wheels ]] || { echo "gpu-run.sh: no .gpu/ (run scripts/gpu-bundle.sh where there is a network, carry .gpu)"; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/wheels/*.whl \
  || { echo "gpu-run.sh: pip could not install .gpu/wheels"; exit 2; }
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
source scripts/gpu-sources.sh
if [[ $(sources_hash) != "$(cat .gpu/SOURCES 2>/dev/null)" ]]; then
  echo "gpu-run.sh: WARNING: .gpu/ was built from other sources (rerun scripts/gpu-bundle.sh): bundle vs here:"
  diff <(cat .gpu/SOURCES 2>/dev/null) <(sources_hash)
fi
cp .gpu/native/*.so service/native/
mkdir -p .cache/spirv && cp .gpu/spirv/*.spv .cache/spirv/
# the loader and GLVND (NVIDIA's Vulkan ICD is libGLX_nvidia: it needs libGLdispatch and friends) go into /,
# as the device tool's README does it; their X11 dependencies and everything else into $DEBROOT
for deb in .gpu/debs/libvulkan1_*.deb .gpu/debs/gl/lib{egl1,glvnd0,opengl0,gl1,glx0,gles2}_*.deb; do
  [[ -f $deb ]] && dpkg -x "$deb" /
done
ldconfig
mkdir -p "$DEBROOT"
for deb in .gpu/debs/*.deb .gpu/debs/gl/*.deb; do dpkg -x "$deb" "$DEBROOT"; done
export LD_LIBRARY_PATH=$DEBROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$DEBROOT/usr/bin:$PATH
export VK_LAYER_PATH=$DEBROOT/usr/share/vulkan/explicit_layer.d
# a GPU must be seen before anything is measured: the loader's own search, then each NVIDIA ICD file named
# (VKACT_GPU_ANY_DEVICE=1, set by gpu-dry-run.sh: a CPU driver will do)
vk_gpu() { timeout 30 "$PY" -c 'import os; from service.vulkan_probe import physical_devices as p; d = p(); print(d); raise SystemExit(not any(x.type != "cpu" or os.environ.get("VKACT_GPU_ANY_DEVICE") == "1" for x in d))'; }
NV_DIR=/usr/local/nvidia/share
found=
for icd in "" $NV_DIR/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
  [[ -n $icd && ! -f $icd ]] && continue
  if [[ -n $icd ]]; then
    export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
    [[ -f $NV_DIR/glvnd/egl_vendor.d/10_nvidia.json ]] && export __EGL_VENDOR_LIBRARY_FILENAMES=$NV_DIR/glvnd/egl_vendor.d/10_nvidia.json
  fi
  echo "Vulkan with ICD ${icd:-(the loader search)}:"
  if vk_gpu; then found=1; break; fi
done
if [[ -z $found ]]; then
  echo "gpu-run.sh: no Vulkan GPU seen; the loader's account of the last try:"
  VK_LOADER_DEBUG=error,warn,driver vk_gpu 2>&1 | tail -n 40
  for f in $NV_DIR/vulkan/icd.d/*.json /usr/share/vulkan/icd.d/*.json; do [[ -f $f ]] && { echo "$f:"; cat "$f"; }; done
  ls -la /usr/local/nvidia/lib64 2>/dev/null | head -n 40
  exit 3
fi
echo "VK_LAYER_PATH=$VK_LAYER_PATH glslang: $(command -v glslangValidator)"

# --- facts ------------------------------------------------------------------------------------------------
step "facts"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
"$PY" --version; uname -r; nproc
timeout 60 "$PY" scripts/gpu_facts.py
echo "facts: rc=$?"

# --- the steps --------------------------------------------------------------------------------------------
SUMMARY=()
# run NAME SECONDS LOGFILE COMMAND...: COMMAND under timeout (at most what is left of the budget), its output
# in $OUT/LOGFILE and here; the summary line is pytest's last line, or the bench's rc.
run() {
  local name=$1 want=$2 log=$OUT/$3; shift 3
  if [[ ,$STEPS, != *,${name%% *},* ]]; then
    SUMMARY+=("$name: not asked for (VKACT_GPU_STEPS=$STEPS)")
    return
  fi
  local left=$((BUDGET - (SECONDS - START) - WIND_DOWN))
  local limit=$((want < left ? want : left))
  if ((limit < 20)); then
    SUMMARY+=("$name: skipped, ${left} s left of the budget")
    return
  fi
  step "$name (at most $limit s): $*"
  local t0=$SECONDS
  timeout -s INT -k "$WIND_DOWN" "$limit" "$@" >"$log" 2>&1
  local rc=$?
  tail -n 40 "$log"
  local last
  last=$(grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$log" | tail -n1)
  SUMMARY+=("$name: rc $rc$( ((rc == 124)) && echo ' (timed out)'), $((SECONDS - t0)) s${last:+: $last}")
}
# shellcheck disable=SC2206
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -n "$JOBS" ${VKACT_GPU_PYTEST_ARGS:-})
ENGINE_SUITE=(tests/engine tests/glsl tests/descriptors tests/conformance)
mkdir -p "$OUT/junit.d"

# the GPU's clocks and performance state while the benches run: whether a dispatch's time is a clock left low
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,utilization.gpu,power.draw --format=csv -lms 200 >"$OUT/clocks.log" 2>&1 &
  CLOCKS_PID=$!
fi
run "v one submission, call by call" 30 submit.log .gpu/bin/vk_submit 300
run "g dispatch diagnostics" 40 diag.log env PYTHONUNBUFFERED=1 "$PY" -m bench.gpu_diag
run "h dispatch diagnostics, the fence not polled" 40 diag-block.log env PYTHONUNBUFFERED=1 KP_FENCE_SPIN_US=0 "$PY" -m bench.gpu_diag
run "a bench gpu 2^$LOG2" 100 bench.log env PYTHONUNBUFFERED=1 "$PY" -m bench --only gpu --sizes "$LOG2" --repeat "$REPEAT"
if [[ -f bench/RESULTS.md ]]; then cp bench/RESULTS.md "$OUT/RESULTS.md"; fi
[[ -n ${CLOCKS_PID:-} ]] && kill "$CLOCKS_PID" 2>/dev/null
run "b engine, device memory, validation" 90 engine-device.log env VKACT_VALIDATION=1 VKACT_TEST_MEMORY=device VKACT_MEMORY=device \
  "${PYTEST[@]}" --junitxml="$OUT/junit.d/engine-device.xml" "${ENGINE_SUITE[@]}"
run "c engine, host memory, validation" 70 engine-host.log env VKACT_VALIDATION=1 VKACT_TEST_MEMORY=host VKACT_MEMORY=host \
  "${PYTEST[@]}" --junitxml="$OUT/junit.d/engine-host.xml" "${ENGINE_SUITE[@]}"
run "e bench graphs 2^24" 60 graphs.log env PYTHONUNBUFFERED=1 VKACT_IREE_AOT=.gpu/iree "$PY" -m bench --only graphs --sizes 24 --repeat 5
if [[ -f bench/RESULTS.md ]]; then cp bench/RESULTS.md "$OUT/RESULTS.md"; fi
run "f tuning sweep 2^$LOG2" 40 tuning.log env PYTHONUNBUFFERED=1 "$PY" -m bench.gpu_tuning --log2 "$LOG2" --repeat 10
run "d service" 300 service.log "${PYTEST[@]}" --junitxml="$OUT/junit.d/service.xml" tests/service
run "i slot import: replays on the slot against copies" 60 direct.log env PYTHONUNBUFFERED=1 "$PY" -m bench.direct_replay --log2 18,20,22,24
run "k slot import on: direct runs and service" 300 service-slot-import.log env VKACT_SLOT_IMPORT=on \
  "${PYTEST[@]}" --junitxml="$OUT/junit.d/service-slot-import.xml" tests/engine/test_direct_runs.py tests/service
# at most 8 files come back: every log but run.log travels in logs.tgz, with the junit files
(cd "$OUT" && logs=$(ls *.log | grep -v '^run.log$') && tar -czf logs.tgz junit.d $logs && rm -rf junit.d $logs)

step "summary ($((SECONDS - START)) s in all)"
printf '%s\n' "${SUMMARY[@]}"
