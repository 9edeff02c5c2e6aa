#!/usr/bin/env bash
# Builds vkact's C extension (service/native/h2grpc*.c -> service/native/_h2grpc<EXT_SUFFIX>) for the
# given interpreter, against Debian's libnghttp2-dev. Rebuilds only when the sources or the interpreter
# changed (a stamp beside the library holds their hashes). Usage: build-native.sh PYTHON
set -euo pipefail
PY=${1:?usage: build-native.sh PYTHON}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$ROOT/service/native
read -r INCLUDE SUFFIX < <("$PY" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
OUT=$DIR/_h2grpc$SUFFIX
SOURCES=("$DIR"/h2grpc*.c)
want="$(cat "${SOURCES[@]}" "$DIR/h2grpc.h" | sha256sum | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version)' | sha256sum | cut -d' ' -f1)"
if [[ -f $OUT && $(cat "$OUT.stamp" 2>/dev/null) == "$want" ]]; then
  echo "==> h2grpc up to date"
  exit 0
fi
[[ -f /usr/include/nghttp2/nghttp2.h ]] || { echo "build-native.sh: libnghttp2's headers are missing: apt-get install -y libnghttp2-dev" >&2; exit 1; }
echo "==> building service/native/_h2grpc$SUFFIX (libnghttp2)"
# -fvisibility=hidden: the files share functions; only PyInit__h2grpc is the module's to export
${CC:-cc} -O2 -g -Wall -Wextra -Wno-unused-parameter -Werror -fPIC -fvisibility=hidden -shared -I"$INCLUDE" \
  "${SOURCES[@]}" -lnghttp2 -o "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$want" >"$OUT.stamp"
