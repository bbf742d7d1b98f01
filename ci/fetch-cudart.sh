#!/usr/bin/env bash
# Fetches NVIDIA's CUDA runtime (libcudart shared and static, with its headers) for CUDA 12
# and CUDA 13 from PyPI into target/cudart/, where cuda-shim's `cudart` test finds it
# (docs/cuda-api.md). Skips, saying so, where pip or the network is missing. Idempotent.
#   target/cudart/13/{include,lib}   nvidia-cuda-runtime + nvidia-cuda-crt
#   target/cudart/12/{include,lib}   nvidia-cuda-runtime-cu12 (its crt/ headers come with
#                                    CUDA 12's nvcc wheel; CUDA 13's, macros only, stand in)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${VGPU_CUDART_DIR:-$root/target/cudart}
CU13=13.5.37
CU12=12.9.79

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch-cudart: no python3 pip here; the cudart test will be skipped" >&2
  exit 0
fi
if [ -f "$dest/.fetched-$CU12-$CU13" ]; then
  exit 0
fi
wheels="$dest/wheels"
mkdir -p "$wheels"
for spec in "nvidia-cuda-runtime==$CU13" "nvidia-cuda-crt==$CU13" "nvidia-cuda-runtime-cu12==$CU12"; do
  if ! python3 -m pip download --quiet --timeout 30 --retries 1 --no-deps --only-binary=:all: \
      -d "$wheels" "$spec"; then
    echo "fetch-cudart: cannot download $spec (no network?); the cudart test will be skipped" >&2
    exit 0
  fi
done
unpack() { # wheel-glob directory
  local tmp
  tmp=$(mktemp -d)
  python3 -m zipfile -e "$(ls "$wheels"/$1 | head -n 1)" "$tmp"
  mkdir -p "$2"
  cp -r "$tmp"/nvidia/*/. "$2"/
  rm -rf "$tmp"
}
rm -rf "$dest/12" "$dest/13"
unpack "nvidia_cuda_runtime-$CU13-*.whl" "$dest/13"
unpack "nvidia_cuda_crt-$CU13-*.whl" "$dest/13"
unpack "nvidia_cuda_runtime_cu12-$CU12-*.whl" "$dest/12"
if [ ! -d "$dest/12/include/crt" ]; then
  cp -r "$dest/13/include/crt" "$dest/12/include/crt"
fi
touch "$dest/.fetched-$CU12-$CU13"
echo "fetch-cudart: CUDA runtime $CU12 and $CU13 in $dest"
