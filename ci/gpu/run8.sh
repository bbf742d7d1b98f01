#!/usr/bin/env bash
# Session 3 GPU run 3: BAND on the H200 after the scheduler's balance rules (issue 5),
# BAND vs FIFO, twice; the full-stack payloads.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
for i in 1 2; do
VGPU_TEST_BACKEND=cuda timeout 150 $D/band --nocapture 2>&1 | grep -E "utilization|test result|panicked"
done
echo done
