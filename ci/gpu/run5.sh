#!/usr/bin/env bash
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads VGPU_REQUIRE_CUDA=1
for i in 1 2; do
timeout 100 gpu-bin/release/deps/gpu --nocapture vecadd_passes_on_the_gpu 2>&1 | grep -E "null_launch|request_roundtrip"
VGPU_DIAG_BYPASS=1 timeout 100 gpu-bin/release/deps/gpu --nocapture vecadd_passes_on_the_gpu 2>&1 | grep -E "null_launch|request_roundtrip" | sed 's/^/bypass /'
done
