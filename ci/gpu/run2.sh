#!/usr/bin/env bash
# Session 1, second GPU run: BAND through vgpud with the cuda backend, and the sim e2e
# device tests under this machine's KVM for comparison.
set -x
cd "$(dirname "$0")/../.."
export VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lsmod | grep -i kvm; ls -la /dev/kvm
for t in 1 2; do VGPU_TEST_BACKEND=cuda timeout 120 gpu-bin/release/deps/band --nocapture 2>&1 | tail -8; done
timeout 120 gpu-bin/release/deps/band --nocapture 2>&1 | tail -5
timeout 120 gpu-bin/release/deps/device --nocapture 2>&1 | tail -5
# The demo's core on the GPU: two VMs 70/30 on the H200 through vgpud + vgpuctl.
S=/tmp/vgpud-gpu/vgpud.sock
mkdir -p /tmp/vgpud-gpu
gpu-bin/release/vgpud --backend cuda --socket $S --payload-dir $VGPU_PAYLOAD_DIR > $OUT/vgpud.log 2>&1 &
sleep 2
gpu-bin/release/vgpuctl --socket $S gpus
kill %1; wait
echo done
