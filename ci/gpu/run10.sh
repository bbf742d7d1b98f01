#!/usr/bin/env bash
# Storage kernel figures on the H200: blocks sweep beside io_uring randread, same file.
cd "$(dirname "$0")/../.."
export VGPU_REQUIRE_CUDA=1
D=gpu-bin/release/deps
timeout 100 $D/storage --nocapture --test-threads 1 2>&1 | grep -E "^test |test result|panicked|cuda:" | head -20
for b in 4 8 16 32; do
  VGPU_STORAGE_BLOCKS=$b timeout 100 $D/storage --ignored --nocapture storage_figures 2>&1 | grep -E "^\| (cuda|io_uring)|panicked"
done
echo done
