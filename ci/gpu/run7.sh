#!/usr/bin/env bash
# Session 3 GPU run 2: the migration benchmark with warm-up, guest round trips with and
# without queue polling, the full-stack migration test again.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
VGPU_BENCH_MAX_MIB=16384 timeout 240 $D/gpu_migration --ignored --nocapture 2>&1 | grep -E "^\||x[0-9]|test result|panicked"
timeout 200 $D/gpu --ignored --nocapture gpu_round_trips 2>&1 | grep -E "POLL|test result|panicked|SKIPPED"
timeout 200 $D/gpu --ignored --nocapture gpu_round_trips 2>&1 | grep -E "POLL|test result|panicked|SKIPPED"
VGPU_TEST_BACKEND=cuda timeout 240 $D/migration back_and_forth --nocapture 2>&1 | grep -E "downtimes|^test |test result|panicked" | tail -5
timeout 200 $D/gpu --nocapture 2>&1 | grep -E "^test |test result|panicked"
echo done
