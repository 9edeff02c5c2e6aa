#!/usr/bin/env bash
# Builds vkact's C extensions for the given interpreter: h2grpc (service/native/h2grpc*.c ->
# service/native/_h2grpc<EXT_SUFFIX>, against Debian's libnghttp2-dev) and h1http (service/native/h1http.c:
# HTTP/1.1 inference requests, no library). Rebuilds only when the sources, the interpreter,
# the compiler or the flags changed (a stamp beside the library holds their hashes).
# Usage: build-native.sh PYTHON [--sanitize]
#   --sanitize (or VKACT_NATIVE_SANITIZE=1): AddressSanitizer + UBSan (clang, -shared-libasan) into
#       VKACT_NATIVE_DIR (default .cache/native-asan), never over the normal build; service/native loads
#       the extension from VKACT_NATIVE_DIR when it is set (scripts/test-asan.sh runs the gRPC tests so).
#   CC=clang: the normal build with clang (gcc's cc by default); both build it clean under -Werror.
set -euo pipefail
PY=${1:?usage: build-native.sh PYTHON [--sanitize]}
SANITIZE=${VKACT_NATIVE_SANITIZE:-0}
[[ ${2:-} == --sanitize ]] && SANITIZE=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$ROOT/service/native
read -r INCLUDE SUFFIX < <("$PY" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
WARN=(-Wall -Wextra -Wno-unused-parameter -Werror)
if [[ $SANITIZE == 1 ]]; then
  CC=${CC:-clang}
  OUTDIR=${VKACT_NATIVE_DIR:-$ROOT/.cache/native-asan}
  # the runtime comes from LD_PRELOAD (the interpreter is not instrumented); any UBSan report aborts
  FLAGS=(-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -shared-libasan)
else
  CC=${CC:-cc}
  OUTDIR=$DIR
  FLAGS=(-O2 -g)
fi
mkdir -p "$OUTDIR"
# build NAME LIBS...: service/native/NAME*.c (and NAME.h when there is one) -> _NAME<EXT_SUFFIX>
build() {
  local name=$1
  shift
  local out=$OUTDIR/_$name$SUFFIX sources=("$DIR/$name"*.c) headers=()
  [[ -f $DIR/$name.h ]] && headers=("$DIR/$name.h")
  local want
  want="$(cat "${sources[@]}" "${headers[@]}" | sha256sum | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version)' | sha256sum | cut -d' ' -f1) $(echo "$CC ${FLAGS[*]}" | sha256sum | cut -d' ' -f1)"
  if [[ -f $out && $(cat "$out.stamp" 2>/dev/null) == "$want" ]]; then
    echo "==> $name up to date ($out)"
    return
  fi
  echo "==> building $out ($CC ${FLAGS[*]})"
  # -fvisibility=hidden: the files share functions; only PyInit__NAME is the module's to export
  $CC "${FLAGS[@]}" "${WARN[@]}" -fPIC -fvisibility=hidden -shared -I"$INCLUDE" "${sources[@]}" "$@" -o "$out.tmp"
  mv "$out.tmp" "$out"
  echo "$want" >"$out.stamp"
}
[[ -f /usr/include/nghttp2/nghttp2.h ]] || { echo "build-native.sh: libnghttp2's headers are missing: apt-get install -y libnghttp2-dev" >&2; exit 1; }
build h2grpc -lnghttp2
build h1http
