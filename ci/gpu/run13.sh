#!/usr/bin/env bash
# GPU storage figures with 512-byte and 4 KiB lines, beside io_uring reads of the same size.
cd "$(dirname "$0")/../.."
export VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
timeout 60 $D/storage bad_input 2>&1 | grep -E "test result|panicked"
for l in 512 4096; do for b in 8 16; do
  VGPU_STORAGE_LINE_BYTES=$l VGPU_STORAGE_BLOCKS=$b timeout 100 $D/storage --ignored --nocapture storage_figures 2>&1 | grep -E "^\| (cuda|sim|io_uring)|panicked"
done; done
echo done
