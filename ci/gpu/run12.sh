#!/usr/bin/env bash
# Session 4 closing GPU run on the merged tree: conformance, isolation, storage (backend and
# guest end to end), the GPU guests, BAND and live migration on one H200.
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
echo "== conformance";  timeout 120 $D/conformance 2>&1 | grep -E "test result|panicked"
echo "== isolation";    timeout 90 $D/isolation 2>&1 | grep -E "test result|panicked"
echo "== storage";      timeout 120 $D/storage 2>&1 | grep -E "test result|panicked"
echo "== storage e2e";  VGPU_TEST_BACKEND=cuda timeout 120 $D/storage_e2e a_guest_runs --nocapture 2>&1 | grep -E "STORAGE OK|test result|panicked"
echo "== gpu guests";   timeout 200 $D/gpu 2>&1 | grep -E "^test |test result|panicked"
echo "== band";         VGPU_TEST_BACKEND=cuda timeout 200 $D/band --nocapture 2>&1 | grep -E "utilization|test result|panicked" | tail -8
echo "== migration";    VGPU_TEST_BACKEND=cuda timeout 240 $D/migration back_and_forth --nocapture 2>&1 | grep -E "downtimes|test result|panicked" | tail -4
echo done
