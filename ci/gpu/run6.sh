#!/usr/bin/env bash
# Session 3 GPU run: CUDA live migration (issues 8, 11): in-process tour across GPUs, the
# full stack (vgpud + vmm + gpu-load guest under KVM) migrated 20 times, the benchmark
# beside native peer copies; conformance and isolation after the memory changes.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
nvidia-smi topo -m
timeout 150 $D/cuda --nocapture 2>&1 | grep -E "^test |test result|panicked|move |SKIPPED|cuda:|error"
timeout 150 $D/conformance 2>&1 | grep -E "^test |test result|panicked|SKIPPED" | tail -16
timeout 60 $D/isolation 2>&1 | grep -E "^test |test result|panicked"
VGPU_TEST_BACKEND=cuda timeout 240 $D/migration back_and_forth --nocapture 2>&1 | grep -E "downtimes|^test |test result|panicked|GPU-LOAD|assert" | tail -12
VGPU_BENCH_MAX_MIB=${MAXMIB:-16384} timeout 240 $D/gpu_migration --ignored --nocapture 2>&1 | grep -E "^\||x[0-9]|test result|panicked"
echo done
