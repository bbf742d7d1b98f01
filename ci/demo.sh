#!/usr/bin/env bash
# The README's first command: builds what it needs, then runs the demo on the embedded sim
# backend (no GPU needed): vgpud, two VMs with 70/30 vGPU shares running GPU work through
# the BAND scheduler, live utilization, a summary and a PNG plot, then a clean-up.
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/setup.sh
exec cargo run --release --locked -p vgpuctl --bin vgpu-demo -- "$@"
