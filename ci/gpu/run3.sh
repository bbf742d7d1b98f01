#!/usr/bin/env bash
# Session 1, third GPU run: guest null-kernel launch round trip and launch rate through
# the full stack on the H200, beside native launch + sync from the backend bench; BAND
# (band vs fifo) through vgpud --backend cuda.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
timeout 200 gpu-bin/release/deps/gpu --nocapture vecadd_passes_on_the_gpu 2>&1 | grep -E "BENCH|OK|test result|panicked"
timeout 200 gpu-bin/release/deps/cuda_bench --ignored --nocapture 2>&1 | grep -iE "launch|test result|panicked" | head -20
VGPU_TEST_BACKEND=cuda timeout 200 gpu-bin/release/deps/band --nocapture 2>&1 | grep -E "utilization|test result|panicked"
echo done
