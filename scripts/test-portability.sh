#!/usr/bin/env bash
# The portability suite: the tests on two conformant Vulkan drivers, lavapipe (Mesa) and SwiftShader
# (Google's, in Debian's chromium-common), each under the Khronos validation layer with synchronization
# validation on (tests/vulkan_validation.py: a validation error fails the test), engine and conformance
# tests in both memory modes (host, device: the `memory` fixture), the service tests once per driver.
# Each run writes a JSON report into $OUT; scripts/tested_on.py makes README's "Tested on" table of them.
#
# usage: scripts/test-portability.sh [extra pytest args]
# env:   VKACT_VENV (default .venv), VKACT_PORTABILITY_OUT (default .cache/portability)
#        VKACT_PORTABILITY_ONLY=NAME[,NAME]  rerun these runs only (e.g. swiftshader-service), keeping
#                                            the other reports of the previous run for the table
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${VKACT_VENV:-$PWD/.venv}/bin/python
OUT=${VKACT_PORTABILITY_OUT:-.cache/portability}
SWIFTSHADER=/usr/lib/chromium/vk_swiftshader_icd.json
LAVAPIPE=$(ls /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null | head -n1)
# A run that goes wrong on a CPU driver must not take the machine with it (others share it):
# a wall-clock limit per run and an address-space limit per process.
RUN_TIMEOUT_S=1500
ADDRESS_SPACE_KB=16000000

die() { printf 'test-portability.sh: error: %s\n' "$*" >&2; exit 2; }
[[ -f $SWIFTSHADER ]] || die "no SwiftShader at $SWIFTSHADER (apt-get install chromium-common; make setup does)"
[[ -n $LAVAPIPE ]] || die "no lavapipe ICD in /usr/share/vulkan/icd.d (apt-get install mesa-vulkan-drivers)"
[[ -f /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json ]] \
  || die "no Khronos validation layer (apt-get install vulkan-validationlayers; make setup does)"

ONLY=${VKACT_PORTABILITY_ONLY:-}
[[ -n $ONLY ]] || rm -rf "$OUT"
mkdir -p "$OUT"
failed=()

# run NAME ICD SERVICE_MEMORY SUITE... : one pytest run under validation, its report in $OUT/NAME.json
run() {
  local name=$1 icd=$2 memory=$3; shift 3
  [[ -z $ONLY || ,$ONLY, == *,$name,* ]] || return 0
  local suite=() args=("$@") i status=0
  for ((i = 0; i < ${#args[@]}; i++)); do  # the report's "suite": the paths, and a -m selection as given
    [[ ${args[i]} == tests/* && ${args[i]} != *::* ]] && suite+=("${args[i]}")
    [[ ${args[i]} == -m ]] && suite+=("-m '${args[i + 1]}'")
  done
  printf '==> %s: %s (service memory %s)\n' "$name" "$*" "$memory"
  local started=$SECONDS
  ( ulimit -v "$ADDRESS_SPACE_KB"
    VK_ICD_FILENAMES=$icd VK_DRIVER_FILES=$icd VKACT_VALIDATION=1 VKACT_TEST_MEMORY=host,device \
    VKACT_MEMORY=$memory VKACT_RUN_REPORT=$OUT/$name.json VKACT_RUN_SUITE="${suite[*]}" \
    timeout -k 30 "$RUN_TIMEOUT_S" "$PY" -m pytest -q -p no:cacheprovider "$@" "${EXTRA[@]}" ) \
    || status=$?  # the run is a background job: only its status reaches the script (await_runs)
  printf '    %s: %d s\n' "$name" $((SECONDS - started))
  return "$status"
}

# Every run goes in the background and the script waits for it (`await_runs`): a signal to the script (CI's
# time limit, ^C) then reaches `stop_runs` at once, where bash would defer its trap while a foreground run
# lasted, and no run outlives the script.
running=()  # pid:name:logged of each run started and not yet awaited
# beside NAME ICD SERVICE_MEMORY SUITE... : `run` with its output kept in $OUT/NAME.log, printed whole by
# `await_runs`, so that runs side by side each print their report in one piece
beside() {
  [[ -z $ONLY || ,$ONLY, == *,$1,* ]] || return 0  # a rerun of others keeps this one's log
  run "$@" >"$OUT/$1.log" 2>&1 &
  running+=("$!:$1:1")
}
# alone NAME ICD SERVICE_MEMORY SUITE... : `run` with its output as it comes, awaited before the next
alone() {
  run "$@" &
  running+=("$!:$1:0")
  await_runs
}
await_runs() {
  local entry pid name logged
  for entry in ${running[@]+"${running[@]}"}; do
    IFS=: read -r pid name logged <<<"$entry"
    wait "$pid" || failed+=("$name")
    ((logged)) && cat "$OUT/$name.log"
  done
  running=()
}
kill_tree() {  # children first: a pytest and the servers its tests started, then `timeout`, then the subshells
  local child
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do kill_tree "$child"; done  # no procps needed
  kill -TERM "$1" 2>/dev/null
}
# The script's own children, not `running`: a run that ended stays listed (its pid free for another process)
# until every run is awaited, and one started just before the signal may not be listed yet.
stop_runs() {
  local child
  trap - TERM INT HUP
  for child in $(cat /proc/$$/task/*/children 2>/dev/null); do kill_tree "$child"; done
  wait  # each pytest's `timeout` passes TERM on to its run and kills what is left 30 s later (-k 30)
  printf 'test-portability.sh: stopped by a signal; the runs under way were ended\n' >&2
  exit "$1"
}
trap 'stop_runs 143' TERM
trap 'stop_runs 130' INT
trap 'stop_runs 129' HUP

EXTRA=("$@")
# Engine + conformance (every kernel, both memory modes) on both drivers: the core. The service, client
# and descriptor tests once per driver: the service's device worker in device memory on lavapipe (where
# `make test` covers host memory), in host memory on SwiftShader; less the tests marked driver_independent
# (tests/conftest.py: refused or cut before a kernel runs, or no device at all), which `make test` runs and
# which would assert the same here again.
# The two engine runs go side by side: each is one pytest process that keeps about one CPU busy (lavapipe's:
# 85% of one, 2026-11-27), so on CI's two CPUs one after the other left one idle. The service runs stay one
# at a time: their servers spread over both CPUs, and their liveness and load tests need them.
SERVICE=(tests/service tests/client tests/descriptors -m "not driver_independent")
ENGINE=(tests/engine tests/conformance tests/glsl)
beside lavapipe-engine "$LAVAPIPE" auto "${ENGINE[@]}"
beside swiftshader-engine "$SWIFTSHADER" auto "${ENGINE[@]}"
await_runs
alone lavapipe-service "$LAVAPIPE" device "${SERVICE[@]}"
alone swiftshader-service "$SWIFTSHADER" host "${SERVICE[@]}"

"$PY" scripts/tested_on.py "$OUT"/*.json
if ((${#failed[@]})); then
  printf 'test-portability.sh: failed: %s\n' "${failed[*]}" >&2
  exit 1
fi
