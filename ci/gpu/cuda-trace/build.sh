#!/usr/bin/env bash
# Builds the tracing libcuda.so.1 into OUT_DIR, forwarding the functions REAL_LIBCUDA
# exports (default: the driver's libcuda.so.1 from ldconfig). README.md says how to run it.
# Usage: ci/gpu/cuda-trace/build.sh OUT_DIR [REAL_LIBCUDA]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: build.sh OUT_DIR [REAL_LIBCUDA]}"
real="${2:-$(ldconfig -p | awk '/libcuda\.so\.1 /{ print $NF; exit }')}"
[[ -n "$real" && -f "$real" ]] || { echo "build.sh: no libcuda.so.1 to forward to; name one" >&2; exit 2; }
mkdir -p "$out"
python3 "$here/gen.py" "$real" "$here/trace.c" "$out"
gcc -shared -fPIC -O1 -Wall -Wno-discarded-qualifiers -I "$out" -Wl,-soname,libcuda.so.1 \
    -o "$out/libcuda.so.1" "$here/trace.c" "$out/fwd.c" -ldl -lpthread
echo "built $out/libcuda.so.1 (forwarding to $real's functions)"
