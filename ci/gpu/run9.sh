#!/usr/bin/env bash
# Session 4 GPU run: storage kernels as GPU threads (issue 9): backend suite (sim + cuda),
# the guest end to end on cuda, the figures; conformance after the module-table change.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
command -v fio && fio --version
timeout 150 $D/storage --nocapture --test-threads 1 2>&1 | grep -E "^test |test result|panicked|cuda|sim:|SKIPPED|rror|assert|left|right" | head -60
VGPU_TEST_BACKEND=cuda timeout 150 $D/storage_e2e a_guest_runs --nocapture 2>&1 | grep -E "^test |test result|panicked|STORAGE|namespace|bad_input|assert|FAIL|rror" | tail -30
timeout 150 $D/storage --ignored --nocapture storage_figures 2>&1 | grep -E "^\||fio|test result|panicked"
timeout 120 $D/conformance 2>&1 | grep -E "test result|panicked|FAILED"
echo done
