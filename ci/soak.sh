#!/usr/bin/env bash
# The full soak (docs/hostile.md): 8 VMs with mixed workloads on 2 sim GPUs,
# a migration every 3 s, every result checksummed, vgpud's and its children's RSS and fds
# sampled each second. Not part of ci/test.sh, which runs a 20 s version (a migration
# every 5 s: soak_short_eight_vms_mixed_workloads).
#   ci/soak.sh [seconds]      (default 600; figures in target/soak.json)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
out="${CARGO_TARGET_DIR:-target}/soak.json"
cargo build --workspace --bins --release --locked
VGPU_SOAK_SECS="$secs" VGPU_SOAK_OUT="$(realpath -m "$out")" \
    cargo test --release --locked -p vgpu-tests --test soak soak_eight_vms_mixed_workloads_and_migrations -- --include-ignored --nocapture
echo "== soak figures: $out"
cat "$out"
