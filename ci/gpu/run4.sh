#!/usr/bin/env bash
# Session 2 GPU run: the conformance suite (now with the pager on cuda), the isolation
# test, the full-stack payload tests on the H200 (worker now serves through Migratable),
# the guest round-trip figures, BAND on the GPU.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
timeout 150 gpu-bin/release/deps/conformance 2>&1 | grep -E "^test |test result|panicked|pager|SKIPPED"
timeout 60 gpu-bin/release/deps/isolation --nocapture 2>&1 | grep -E "^test |test result|panicked"
timeout 240 gpu-bin/release/deps/gpu --nocapture 2>&1 | grep -E "BENCH|OK|^test |test result|panicked"
VGPU_TEST_BACKEND=cuda timeout 120 gpu-bin/release/deps/band --nocapture 2>&1 | grep -E "utilization|test result|panicked"
echo done
