#!/usr/bin/env bash
# Regenerates the committed PTX of the cuda backend's kernels from their CUDA C sources:
#   builtin.cu -> builtin.ptx   (module "builtin", embedded by backend/src/cuda/modules.rs)
#   probe.cu   -> probe.ptx     (the isolation test's pointer probe)
#   storage.cu -> storage.ptx   (the storage kernels, embedded by backend/src/cuda/storage.rs)
#
# Needs nvcc (the GPU machine has it; the development machines do not, which is why the
# PTX is committed). compute_90 PTX is JIT-compiled by the driver for the GPU it runs on
# (Hopper and later). --fmad=false keeps every multiply and add rounded on its own, as the
# protocol documents; the sources also spell the roundings out with __fmul_rn/__fadd_rn.
# When ptxas is there too, each file is assembled for sm_90 as a check.
#
# Usage: backend/kernels/build-ptx.sh [OUT_DIR]   (default: next to this script)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here}"
mkdir -p "$out"
NVCC="${NVCC:-nvcc}"
if ! command -v "$NVCC" >/dev/null; then
    echo "build-ptx.sh: nvcc not found; run this on the GPU machine or set NVCC=/path/to/nvcc" >&2
    exit 1
fi
"$NVCC" --version | tail -n 2
for name in builtin probe storage; do
    "$NVCC" -ptx -arch=compute_90 --fmad=false -O3 -o "$out/$name.ptx" "$here/$name.cu"
    if command -v ptxas >/dev/null; then
        ptxas -arch=sm_90 -o /dev/null "$out/$name.ptx"
    fi
    echo "build-ptx.sh: wrote $out/$name.ptx ($(wc -c <"$out/$name.ptx") bytes)"
done
