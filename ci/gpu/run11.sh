#!/usr/bin/env bash
# Where the GPU storage path's IOPS stop: the same controller with more host submitters.
cd "$(dirname "$0")/../.."
export VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
for t in 2 8 14; do
  VGPU_BENCH_SIM_THREADS=$t VGPU_STORAGE_BLOCKS=8 timeout 100 $D/storage --ignored --nocapture storage_figures 2>&1 | grep -E "^\| |panicked"
done
nproc
echo done
