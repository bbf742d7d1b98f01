#!/usr/bin/env bash
# The README's first command: builds what it needs, then runs the demo on the embedded sim
# backend (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/setup.sh
if cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q '"name":"vgpu-demo"'; then
  exec cargo run --release --locked -p vgpud --bin vgpu-demo -- "$@"
fi
# Until the daemon's demo lands: boot a payload guest and drive a vhost-user device.
cargo build --release --locked -p vmm -p vgpu-tests
exec ./target/release/vgpu-bench-vmm --runs 3
