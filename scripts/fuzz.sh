#!/usr/bin/env bash
# Builds and runs the libFuzzer target of service/native (fuzz/h2grpc_fuzz.c: clang -fsanitize=fuzzer,
# address,undefined, CPython embedded) for SECONDS (default 60) on fuzz/corpus (the seeds, kept in the
# repo) and .cache/fuzz/corpus (what it finds, carried between runs). A crash, a sanitizer report or a
# leak stops it with the input under .cache/fuzz/ (a finding: add it to fuzz/corpus and a test).
# Usage: scripts/fuzz.sh [SECONDS] [libFuzzer flags...]   env: VKACT_VENV
#        scripts/fuzz.sh coverage   line coverage of service/native that the corpus reaches (llvm-cov-14)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_TO_RUN=${1:-60}
shift || true
PY=${VKACT_VENV:-$PWD/.venv}/bin/python
command -v clang >/dev/null || { echo "fuzz.sh: clang is missing (scripts/setup.sh installs it)" >&2; exit 1; }
WORK=$PWD/.cache/fuzz
mkdir -p "$WORK/corpus"
BIN=$WORK/h2grpc_fuzz
read -r INCLUDE LIBDIR VERSION < <("$PY" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("LIBDIR"), s.get_config_var("LDVERSION"))')
SOURCES=(fuzz/h2grpc_fuzz.c service/native/h2grpc*.c)
want=$(cat "${SOURCES[@]}" service/native/h2grpc.h "$0" | sha256sum | cut -d' ' -f1)
if [[ ! -x $BIN || $(cat "$BIN.stamp" 2>/dev/null) != "$want" ]]; then
  echo "==> building $BIN"
  clang -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Wno-unused-parameter -Werror -I"$INCLUDE" "${SOURCES[@]}" \
    -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lpython"$VERSION" -lnghttp2 -o "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
  echo "$want" >"$BIN.stamp"
fi
if [[ $SECONDS_TO_RUN == coverage ]]; then
  command -v llvm-cov-14 >/dev/null || { echo "fuzz.sh: llvm-cov-14 is missing (apt-get install llvm-14)" >&2; exit 1; }
  clang -g -O0 -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping -I"$INCLUDE" "${SOURCES[@]}" \
    -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lpython"$VERSION" -lnghttp2 -o "$WORK/h2grpc_cov"
  rm -f "$WORK"/cov.prof*
  LLVM_PROFILE_FILE=$WORK/cov.profraw "$WORK/h2grpc_cov" -runs=0 "$WORK/corpus" fuzz/corpus 2>&1 | tail -1
  llvm-profdata-14 merge -o "$WORK/cov.profdata" "$WORK/cov.profraw"
  exec llvm-cov-14 report "$WORK/h2grpc_cov" -instr-profile="$WORK/cov.profdata" service/native/h2grpc*.c
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
echo "==> fuzzing h2grpc for ${SECONDS_TO_RUN}s (corpus: $WORK/corpus + fuzz/corpus)"
cd "$WORK"
exec "$BIN" -max_total_time="$SECONDS_TO_RUN" -max_len=100000 -timeout=20 -rss_limit_mb=4096 \
  -dict="$OLDPWD/fuzz/h2grpc.dict" -print_final_stats=1 "$@" corpus "$OLDPWD/fuzz/corpus"
