#!/usr/bin/env bash
# Every GPU check and benchmark in one call, on the GPU machine (one or two H200s, nvcc,
# KVM, no cargo), from the repository root with the bundle of ci/gpu/bundle.sh carried in
# gpu-bundle/ (`run` tool: `carry: ["gpu-bundle"]`; ci/gpu/README.md).
#
#   ci/gpu/suite.sh                  every step but fuzz
#   ci/gpu/suite.sh --quick          the checks only (no benchmarks)
#   ci/gpu/suite.sh storage band     the named steps (or groups: checks, benches)
#   ci/gpu/suite.sh --list           the steps, what each checks, its time limit
#
# Each step's whole output goes to $OUT/logs/<step>.log when OUT is set (else a temporary
# folder); its key lines are echoed. At the end: a summary table (step, result, seconds),
# written to $OUT/summary.txt too, and the logs packed into $OUT/suite-logs.tar.gz (the
# `run` tool brings back at most 8 files; SUITE_KEEP_LOGS=1 keeps the folder instead).
# The exit status is non-zero when any step failed or timed out.
#
# Environment: BUNDLE (default gpu-bundle), TIMEOUT_SCALE (multiplies every limit, default
# 1), PTX_STRICT=1 (the ptx step fails when the regenerated PTX differs from the committed
# one), MAXMIB (largest size of the migration bench, default 16384).
# The step_* functions run through `bash -c`, which shellcheck cannot follow.
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2

# name | kind (check/bench/extra) | time limit, s | what it checks
STEP_TABLE="
ptx|check|120|nvcc regenerates the committed PTX of the cuda kernels (diff of the bodies)
conformance|check|180|the Backend conformance suite on sim and cuda, pager swapping on cuda
isolation|check|120|a CUDA context is no isolation, a process is: a foreign address faults alone
gpu-guests|check|300|payload guests (vecadd, streams, hostile) under KVM through vgpu-worker --backend cuda
storage|check|180|the storage kernels as GPU threads, backend level, sim and cuda
storage-e2e|check|180|a guest runs storage kernels on an attached namespace, cuda backend
band|check|240|BAND 70/30 through vgpud on the cuda backend, beside FIFO
migration|check|300|live migration through vgpud on cuda, 20 moves while a guest computes, checksums equal
host-migration|check|420|whole-VM migration between two vgpud daemons sharing the GPU: a computing VM moves back and forth (checksum equal to an unmoved VM's), a full destination refuses, a killed destination leaves the VM at its source, a wrong token is refused
shm|check|120|shared device memory on cuda: an exported object mapped read-write and read-only, writes to the read-only mapping refused
hard-limit|check|120|a PTX kernel that never ends: answered KERNEL_FAULT past the hard limit, the worker exits 75 and frees the GPU
cuda-migration|check|180|in-process migration tour across GPUs (onto the same GPU with one), every byte checked
device|check|180|the sim device end to end under this machine's KVM (comparison with the CPU machine)
daemon|check|60|vgpud --backend cuda starts and vgpuctl lists the GPUs
cuda-programs|check|300|module memory, layouts and raw-bytes arguments on cuda; unmodified CUDA programs (C: PTX and an sm_90 cubin; cuda-python with NVRTC; cudarc) on the vGPU library over a cuda worker, and natively
cuda-bench|bench|300|backend copies and null-kernel launch beside native CUDA in the same process
copy-sweep|bench|300|guest copies 4 KiB to 512 MiB through the full stack
round-trips|bench|300|guest request and launch round trips with queue polling off and on
storage-figures|bench|480|GPU-initiated reads, 512 B and 4 KiB lines, 8 and 16 blocks, beside io_uring
storage-ceiling|bench|300|the emulated controller fed by 8 and 14 host threads (its ceiling)
migration-bench|bench|480|cuda live migration downtime and total time, 64 MiB to MAXMIB, beside native peer copies
memory-bench|bench|300|oversubscription, swap throughput and shm dataflow (sim, on this machine's cores)
timeline|bench|300|the band step's two VMs with per-request timelines: where the time between kernels goes (BAND, then FIFO)
start|bench|300|VMs with a cuda vGPU: REST call to the payload's main (median of 20) and 64 launched at once, beside vgpu-worker + vmm by hand
fuzz|extra|560|every fuzz target for SECS (default 120) on this machine's cores (needs gpu-bundle/fuzz; only when named)
"

BUNDLE=${BUNDLE:-gpu-bundle}
B=$PWD/$BUNDLE
export B
export VGPU_REQUIRE_CUDA=1 VGPU_PAYLOAD_DIR=$B/payloads RUST_BACKTRACE=1

field() { # step field-number
    awk -F'|' -v s="$1" -v f="$2" '$1 == s { print $f }' <<<"$STEP_TABLE"
}
all_steps() { # kind...
    local k
    for k in "$@"; do awk -F'|' -v k="$k" 'NF == 4 && $2 == k { print $1 }' <<<"$STEP_TABLE"; done
}

# The test binary of cargo target $1; $2 is the package, for names two packages share.
tb() {
    if [[ -n "${2:-}" && -x "$B/tests/$1.$2" ]]; then
        echo "$B/tests/$1.$2"
    else
        echo "$B/tests/$1"
    fi
}
export -f tb

step_ptx() {
    local d=$LOGS/ptx f rc=0
    mkdir -p "$d"
    "$B/kernels/build-ptx.sh" "$d" || return 1
    for f in builtin probe storage; do
        if ! diff <(grep -v '^//' "$B/kernels/$f.ptx" | grep -v '^\s*$') \
            <(grep -v '^//' "$d/$f.ptx" | grep -v '^\s*$') >"$d/$f.diff"; then
            echo "PTX_DIFF $f.ptx: $(wc -l <"$d/$f.diff") diff lines (committed vs regenerated)"
            head -8 "$d/$f.diff"
            [[ "${PTX_STRICT:-0}" == 1 ]] && rc=1
        else
            echo "PTX_SAME $f.ptx"
        fi
    done
    return "$rc"
}
step_conformance() { "$(tb conformance)" --test-threads 8; }
step_isolation() { "$(tb isolation)" --nocapture --test-threads 2; }
step_gpu-guests() { "$(tb gpu)" --nocapture --test-threads 1; }
step_storage() { "$(tb storage vgpu-backend)" --nocapture --test-threads 1; }
step_storage-e2e() { VGPU_TEST_BACKEND=cuda "$(tb storage vgpu-tests)" a_guest_runs --nocapture; }
step_band() { VGPU_TEST_BACKEND=cuda "$(tb band)" --nocapture; }
step_migration() { VGPU_TEST_BACKEND=cuda "$(tb migration)" back_and_forth --nocapture; }
step_host-migration() { VGPU_TEST_BACKEND=cuda "$(tb host_migration)" --nocapture --test-threads 1; }
step_shm() { "$(tb conformance)" shared_objects --nocapture; }
step_hard-limit() { "$(tb vgpu_backend)" cuda::hard_limit_tests --nocapture; }
step_cuda-migration() { "$(tb cuda)" --nocapture; }
step_device() { env -u VGPU_REQUIRE_CUDA "$(tb device)" --nocapture; }
step_daemon() {
    local dir sock pid rc
    dir=$(mktemp -d) sock=$dir/vgpud.sock
    "$B/bin/vgpud" --backend cuda --socket "$sock" --state-dir "$dir" \
        --payload-dir "$VGPU_PAYLOAD_DIR" >"$LOGS/daemon-vgpud.log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do [[ -S "$sock" ]] && break; sleep 0.2; done
    "$B/bin/vgpuctl" --socket "$sock" gpus
    rc=$?
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    echo "vgpud log:"; tail -20 "$LOGS/daemon-vgpud.log"
    return "$rc"
}
# Runs `$@` on a vGPU: a fresh cuda vgpu-worker (it serves one frontend), the vGPU
# library as libcuda.so.1 first on the library path, the process transport to the worker.
on_vgpu() {
    local d=$LOGS/cuda-programs tag=$1 sock wpid rc
    shift
    sock=$d/$tag.sock
    rm -f "$sock"
    "$B/bin/vgpu-worker" --backend cuda --socket "$sock" --vgpu-id 0 --memory 8G \
        --queues 4 >"$d/worker-$tag.log" 2>&1 &
    wpid=$!
    for _ in $(seq 150); do [[ -S "$sock" ]] && break; sleep 0.2; done
    if [[ ! -S "$sock" ]]; then
        echo "== $tag: the cuda worker did not start:"; tail -5 "$d/worker-$tag.log"
        kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null
        return 1
    fi
    LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} VGPU_SOCKET=$sock "$@"
    rc=$?
    kill "$wpid" 2>/dev/null
    wait "$wpid" 2>/dev/null
    return "$rc"
}
export -f on_vgpu
step_cuda-programs() {
    local d=$LOGS/cuda-programs src=$B/cuda-programs nvcc home stubs prog where t0 rc=0
    mkdir -p "$d/lib"
    echo "== backend: module memory, parameter layouts, raw-bytes arguments"
    "$(tb module_memory)" --test-threads 1 || rc=1
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    [[ -x "$nvcc" ]] || { echo "== no nvcc on this machine"; return 1; }
    home=$(cd "$(dirname "$nvcc")/.." && pwd)
    stubs=$(find -L "$home" -path '*stubs*' -name libcuda.so 2>/dev/null | head -1)
    # No stub in this toolkit: link against the driver's own library.
    [[ -n "$stubs" ]] || stubs=$(ldconfig -p | awk '/libcuda\.so(\.1)? / { print $NF; exit }')
    [[ -n "$stubs" ]] || { echo "== no libcuda to link against"; return 1; }
    stubs=$(dirname "$stubs")
    cp "$B/lib/libvgpu_cuda.so" "$d/lib/libcuda.so.1"
    ln -sfn libcuda.so.1 "$d/lib/libcuda.so"
    "$nvcc" -ptx -o "$d/vecadd.ptx" "$src/vecadd.cu" || return 1
    "$nvcc" -cubin -arch=sm_90 -o "$d/vecadd.cubin" "$src/vecadd.cu" || return 1
    # Linked against the toolkit's stub (soname libcuda.so.1): the loader then picks the
    # driver's libcuda natively and the vGPU library when it comes first on the path.
    gcc -std=c11 -Wall -O2 -I "$home/include" "$src/vecadd.c" -o "$d/vecadd" \
        -L "$stubs" -lcuda || return 1
    for prog in c-ptx c-cubin python cudarc; do
        for where in native vgpu; do
            local cmd=()
            case $prog in
                c-ptx) cmd=("$d/vecadd" "$d/vecadd.ptx") ;;
                c-cubin) cmd=("$d/vecadd" "$d/vecadd.cubin") ;;
                python) cmd=(python3 "$src/vecadd.py") ;;
                cudarc) cmd=("$(tb cuda_programs)" --ignored --exact cudarc_vecadd_from_ptx --nocapture) ;;
            esac
            t0=$(date +%s.%N)
            if [[ $where == native ]]; then
                "${cmd[@]}" >"$d/$prog-$where.log" 2>&1
            else
                on_vgpu "$prog" "${cmd[@]}" >"$d/$prog-$where.log" 2>&1
            fi
            local r=$? secs
            secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
            if [[ $r == 0 ]] && grep -q 'VECADD OK' "$d/$prog-$where.log"; then
                echo "== $prog $where: pass in ${secs}s"
            else
                echo "== $prog $where: FAIL ($r) in ${secs}s"; tail -5 "$d/$prog-$where.log"
                rc=1
            fi
        done
    done
    return "$rc"
}
step_cuda-bench() { VGPU_BENCH_JSON=$LOGS/bench-cuda.json "$(tb cuda_bench)" --ignored --nocapture; }
step_copy-sweep() { "$(tb gpu)" --ignored --nocapture gpu_copy_sweep; }
step_round-trips() { "$(tb gpu)" --ignored --nocapture gpu_round_trips; }
step_storage-figures() {
    local l b rc=0
    for l in 512 4096; do
        for b in 8 16; do
            echo "== line $l B, $b blocks"
            VGPU_STORAGE_LINE_BYTES=$l VGPU_STORAGE_BLOCKS=$b \
                "$(tb storage vgpu-backend)" --ignored --nocapture storage_figures || rc=1
        done
    done
    return "$rc"
}
step_storage-ceiling() {
    local t rc=0
    for t in 8 14; do
        echo "== $t host submitters"
        VGPU_BENCH_SIM_THREADS=$t VGPU_STORAGE_BLOCKS=8 \
            "$(tb storage vgpu-backend)" --ignored --nocapture storage_figures || rc=1
    done
    return "$rc"
}
step_migration-bench() {
    VGPU_BENCH_MAX_MIB=${MAXMIB:-16384} "$(tb gpu_migration)" --ignored --nocapture
}
step_memory-bench() {
    local dir
    dir=$(mktemp -d)
    (cd "$dir" && "$B/bin/vgpu-bench" memory) || return 1
    cp "$dir"/out/bench-memory.* "$LOGS/" 2>/dev/null
    return 0
}
step_timeline() {
    local dir files rc=0
    dir=$(mktemp -d) && chmod 1777 "$dir"
    VGPU_TIMELINE=$dir VGPU_TEST_BACKEND=cuda "$(tb band)" --nocapture || rc=1
    # One worker per VM, BAND's two first, then FIFO's (worker pids rise).
    mapfile -t files < <(find "$dir" -name 'timeline-*.csv' -printf '%f\n' | sort -t- -k2 -n | sed "s|^|$dir/|")
    [[ ${#files[@]} -ge 4 ]] || { echo "BENCH timeline: ${#files[@]} timeline files, wanted 4"; return 1; }
    echo "BENCH timeline BAND"; "$B/bin/vgpu-bench" timeline "${files[@]:0:2}" || rc=1
    echo "BENCH timeline FIFO"; "$B/bin/vgpu-bench" timeline "${files[@]:2:2}" || rc=1
    tar -czf "$LOGS/timeline-csv.tar.gz" -C "$dir" . 2>/dev/null
    return "$rc"
}

step_start() {
    local dir
    dir=$(mktemp -d)
    (cd "$dir" && "$B/bin/vgpu-bench" start --backend cuda --runs 20 --concurrent 64) || return 1
    cp "$dir"/out/bench-start.* "$LOGS/" 2>/dev/null
    return 0
}
step_fuzz() {
    [[ -d "$B/fuzz" ]] || { echo "no fuzz targets in the bundle (ci/gpu/bundle.sh says how)"; return 1; }
    FUZZ_BIN=$B/fuzz FUZZ_WORK=$LOGS/fuzz ci/fuzz-campaign.sh "$(nproc)" "" "${SECS:-120}"
}

# The lines of a step's log worth echoing.
KEY='^test |test result|median|kernel time|SKIPPED|panicked|FAILED|PTX_|: .* \| anchor|^\||^== |GUEST|BENCH|STORAGE OK|utilization|downtimes|HOSTMIG|POLL|FUZZ|rror'

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

quick=0 list=0 wanted=()
for a in "$@"; do
    case "$a" in
        --quick) quick=1 ;;
        --list) list=1 ;;
        -h|--help) usage; exit 0 ;;
        checks) mapfile -t -O "${#wanted[@]}" wanted < <(all_steps check) ;;
        benches) mapfile -t -O "${#wanted[@]}" wanted < <(all_steps bench) ;;
        -*) echo "suite: unknown option $a" >&2; usage >&2; exit 2 ;;
        *)
            if [[ -z "$(field "$a" 1)" ]]; then
                echo "suite: no step $a (ci/gpu/suite.sh --list)" >&2
                exit 2
            fi
            wanted+=("$a") ;;
    esac
done
if [[ $list == 1 ]]; then
    awk -F'|' 'NF == 4 { printf "%-16s %-6s %4ss  %s\n", $1, $2, $3, $4 }' <<<"$STEP_TABLE"
    exit 0
fi
if [[ ${#wanted[@]} -eq 0 ]]; then
    mapfile -t wanted < <(all_steps check bench)
fi
if [[ $quick == 1 ]]; then
    mapfile -t wanted < <(for s in "${wanted[@]}"; do [[ "$(field "$s" 2)" == bench ]] || echo "$s"; done)
fi

if [[ ! -d "$B/tests" || ! -d "$B/bin" ]]; then
    echo "suite: no bundle at $B: build it with ci/gpu/bundle.sh and carry gpu-bundle" >&2
    exit 2
fi
# The tests find vmm, vgpu-worker, vgpud next to their own executable.
for p in "$B"/bin/*; do ln -sfn "../bin/${p##*/}" "$B/tests/${p##*/}"; done

if [[ -n "${OUT:-}" ]]; then LOGS=$OUT/logs; else LOGS=$(mktemp -d); fi
mkdir -p "$LOGS"
export LOGS

nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader 2>&1
echo "cores: $(nproc); kvm: $(ls -l /dev/kvm 2>&1)"
head -1 "$B/MANIFEST" 2>/dev/null

results=()
failed=0
for s in "${wanted[@]}"; do
    limit=$(field "$s" 3)
    limit=$(awk -v l="$limit" -v f="${TIMEOUT_SCALE:-1}" 'BEGIN { printf "%d", l * f }')
    echo "=== $s: $(field "$s" 4) (limit ${limit}s)"
    start=$(date +%s.%N)
    export -f "step_$s"
    timeout --kill-after=10 "$limit" bash -c "step_$s" >"$LOGS/$s.log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    case $rc in
        0) res=pass ;;
        124|137) res=timeout; failed=1 ;;
        *) res="fail ($rc)"; failed=1 ;;
    esac
    grep -aE "$KEY" "$LOGS/$s.log" | head -"${LINES_MAX:-40}"
    [[ $res != pass ]] && { echo "--- last lines of $s.log:"; tail -15 "$LOGS/$s.log"; }
    echo "=== $s: $res in ${secs}s"
    results+=("$s|$res|$secs")
done

{
    echo
    printf '%-16s %-12s %8s\n' step result seconds
    for r in "${results[@]}"; do
        IFS='|' read -r s res secs <<<"$r"
        printf '%-16s %-12s %8s\n' "$s" "$res" "$secs"
    done
} | tee "$LOGS/summary.txt"

if [[ -n "${OUT:-}" ]]; then
    cp "$LOGS/summary.txt" "$OUT/summary.txt"
    if [[ "${SUITE_KEEP_LOGS:-0}" != 1 ]]; then
        tar -C "$OUT" -czf "$OUT/suite-logs.tar.gz" logs && rm -rf "$LOGS"
    fi
fi
exit $failed
