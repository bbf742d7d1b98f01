#!/usr/bin/env bash
# GPU machine: PTX regeneration, conformance, isolation, full stack, benchmarks.
cd "$(dirname "$0")/../.."
B=gpu-bin/release/deps
export VGPU_REQUIRE_CUDA=1 VGPU_PAYLOAD_DIR=$PWD/gpu-bin/payloads RUST_BACKTRACE=1
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
ls -la /dev/kvm; nproc
step() { local name=$1; shift; echo "=== $name: $*"; local t=$(date +%s%N); timeout "${TMO:-240}" "$@" > "$OUT/$name.log" 2>&1; local rc=$?; echo "=== $name rc=$rc $(( ($(date +%s%N) - t) / 1000000 )) ms"; grep -E "^test |test result|SKIPPED|panicked|CHILD|context B read|: .* \| anchor|register_host|GUEST|BENCH|error" "$OUT/$name.log" | head -${LINES_MAX:-60}; }
mkdir -p "$OUT/ptx"
echo "=== ptx"; backend/kernels/build-ptx.sh "$OUT/ptx" 2>&1
for f in builtin probe; do echo "diff $f (body only):"; diff <(grep -v '^//' backend/kernels/$f.ptx | grep -v '^\s*$') <(grep -v '^//' "$OUT/ptx/$f.ptx" | grep -v '^\s*$') | head -8; done
step conformance $B/conformance-* --test-threads 8
step isolation $B/isolation-* --nocapture --test-threads 2
step gpu $B/gpu-* --nocapture --test-threads 1
VGPU_BENCH_JSON=$OUT/bench.json LINES_MAX=40 step bench $B/cuda_bench-* --ignored --nocapture
LINES_MAX=40 step sweep $B/gpu-* --ignored --nocapture gpu_copy_sweep
echo done
