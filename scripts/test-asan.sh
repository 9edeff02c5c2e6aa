#!/usr/bin/env bash
# The tests of service/native's C (gRPC: tests/service/test_grpc*.py and test_perf_analyzer.py, the real
# perf_analyzer's C++ client, streaming too; HTTP/1.1: test_h1http_parser.py, test_http_native.py, test_large_bodies.py and
# test_connections.py; or the pytest arguments given) against the AddressSanitizer +
# UBSan build of service/native (scripts/build-native.sh --sanitize): the ASan runtime preloaded into the
# test process and every service process it starts (not into other programs), Python's allocator
# off (PYTHONMALLOC=malloc) so ASan sees every object's memory. A sanitizer report aborts the process it
# happens in (exit code 86 for the pytest process), and the run fails on any report in its output.
# Leaks: LeakSanitizer is off here (third-party extensions' allocations kept until exit, orjson,
# pydantic-core, fill its report); the fuzz target (make fuzz) checks h2grpc for leaks per input.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${VKACT_VENV:-$PWD/.venv}/bin/python
command -v clang >/dev/null || { echo "test-asan.sh: clang is missing (scripts/setup.sh installs it)" >&2; exit 1; }
export VKACT_NATIVE_DIR=${VKACT_NATIVE_DIR:-$PWD/.cache/native-asan}
bash scripts/build-native.sh "$PY" --sanitize
RUNTIME=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
[[ -f $RUNTIME ]] || { echo "test-asan.sh: no ASan runtime at $RUNTIME (apt-get install libclang-rt-14-dev)" >&2; exit 1; }
LOG=$(mktemp -d)/asan
# log_path: each process's report in its own file (a service subprocess's stderr is a pipe the test reads)
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:exitcode=86:abort_on_error=0:log_path=$LOG:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$LOG"
export PYTHONMALLOC=malloc
(($#)) || set -- tests/service/test_grpc*.py tests/service/test_perf_analyzer.py tests/service/test_h1http_parser.py \
  tests/service/test_http_native.py tests/service/test_large_bodies.py tests/service/test_connections.py
status=0
# VKACT_ASAN_RUNTIME: tests/service/conftest.py hands the runtime on to the service processes only
VKACT_ASAN_RUNTIME=$RUNTIME LD_PRELOAD=$RUNTIME "$PY" -m pytest -q -p no:cacheprovider "$@" || status=$?
if compgen -G "$LOG*" >/dev/null; then
  cat "$LOG"* >&2
  echo "test-asan.sh: sanitizer reports above" >&2
  exit 1
fi
exit $status
