#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of service/native (fuzz/NAME_fuzz.c: clang -fsanitize=fuzzer,
# address,undefined, CPython embedded), each for SECONDS (default 60) on its seeds in the repo and what it
# found before (.cache/fuzz/NAME/corpus, carried between runs): h2grpc (fuzz/corpus, fuzz/h2grpc.dict) and
# h1http (fuzz/corpus-h1http, fuzz/h1http.dict), side by side. A crash, a sanitizer report or a leak stops it with the
# input under .cache/fuzz/NAME/ (a finding: add it to the seeds and a test).
# Usage: scripts/fuzz.sh [SECONDS] [libFuzzer flags...]   env: VKACT_VENV, FUZZ_TARGETS (default "h2grpc h1http")
#        scripts/fuzz.sh coverage   line coverage of service/native that the seeds reach (llvm-cov-14)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_TO_RUN=${1:-60}
shift || true
PY=${VKACT_VENV:-$PWD/.venv}/bin/python
command -v clang >/dev/null || { echo "fuzz.sh: clang is missing (scripts/setup.sh installs it)" >&2; exit 1; }
read -r INCLUDE LIBDIR VERSION < <("$PY" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("LIBDIR"), s.get_config_var("LDVERSION"))')
ROOT=$PWD
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

BUILT=()     # name:work:seeds of each fuzzer built
RUNNING=()   # pid:name:log of each fuzzer started
for NAME in ${FUZZ_TARGETS:-h2grpc h1http}; do
  WORK=$ROOT/.cache/fuzz/$NAME
  [[ $NAME == h2grpc ]] && { WORK=$ROOT/.cache/fuzz; SEEDS=fuzz/corpus; LIBS=(-lnghttp2); } || { SEEDS=fuzz/corpus-$NAME; LIBS=(); }
  mkdir -p "$WORK/corpus"
  BIN=$WORK/${NAME}_fuzz
  SOURCES=(fuzz/${NAME}_fuzz.c service/native/${NAME}*.c)
  HEADERS=($(compgen -G "service/native/$NAME*.h" || true))
  want=$(cat "${SOURCES[@]}" "${HEADERS[@]}" fuzz/*.h "$0" | sha256sum | cut -d' ' -f1)
  if [[ ! -x $BIN || $(cat "$BIN.stamp" 2>/dev/null) != "$want" ]]; then
    echo "==> building $BIN"
    clang -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
      -Wall -Wextra -Wno-unused-parameter -Werror -I"$INCLUDE" "${SOURCES[@]}" \
      -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lpython"$VERSION" "${LIBS[@]}" -o "$BIN.tmp"
    mv "$BIN.tmp" "$BIN"
    echo "$want" >"$BIN.stamp"
  fi
  if [[ $SECONDS_TO_RUN == coverage ]]; then
    command -v llvm-cov-14 >/dev/null || { echo "fuzz.sh: llvm-cov-14 is missing (apt-get install llvm-14)" >&2; exit 1; }
    clang -g -O0 -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping -I"$INCLUDE" "${SOURCES[@]}" \
      -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lpython"$VERSION" "${LIBS[@]}" -o "$WORK/${NAME}_cov"
    rm -f "$WORK"/cov.prof*
    LLVM_PROFILE_FILE=$WORK/cov.profraw "$WORK/${NAME}_cov" -runs=0 "$WORK/corpus" "$SEEDS" 2>&1 | tail -1
    llvm-profdata-14 merge -o "$WORK/cov.profdata" "$WORK/cov.profraw"
    llvm-cov-14 report "$WORK/${NAME}_cov" -instr-profile="$WORK/cov.profdata" service/native/${NAME}*.c
    continue
  fi
  BUILT+=("$NAME:$WORK:$SEEDS")
done
# libFuzzer runs on one thread: the targets run side by side (one CPU each on CI's two), once all are built,
# not one after the other, so the run takes SECONDS and not SECONDS per target. Each one's output is printed
# whole when it ends.
for entry in ${BUILT[@]+"${BUILT[@]}"}; do
  IFS=: read -r NAME WORK SEEDS <<<"$entry"
  echo "==> fuzzing $NAME for ${SECONDS_TO_RUN}s (corpus: $WORK/corpus + $SEEDS; its output follows when it ends)"
  (cd "$WORK" && exec "$WORK/${NAME}_fuzz" -max_total_time="$SECONDS_TO_RUN" -max_len=100000 -timeout=20 -rss_limit_mb=4096 \
    -dict="$ROOT/fuzz/$NAME.dict" -print_final_stats=1 "$@" corpus "$ROOT/$SEEDS") >"$WORK/fuzz.log" 2>&1 &
  RUNNING+=("$!:$NAME:$WORK/fuzz.log")
done
failed=0
for entry in ${RUNNING[@]+"${RUNNING[@]}"}; do
  IFS=: read -r pid name log <<<"$entry"
  if wait "$pid"; then status=passed; else status=FAILED; failed=1; fi
  cat "$log"
  echo "==> fuzzing $name: $status (log $log)"
done
exit "$failed"
