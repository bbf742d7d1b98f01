#!/usr/bin/env bash
# Compares the launch figures of builds of vgpu on the GPU machine: the null launch +
# cuCtxSynchronize round trip and async null launches per second (cuda-shim's apibench.c,
# `apibench 0`), for each build's vgpu-worker (by hand, `--poll-us 50`) and its CUDA
# library, in turns with native libcuda, round after round. The native rate moves from one
# minute to the next on that machine, so builds are only compared within one call, and the
# medians are what to read.
#
# Here (cargo):   ci/gpu/launch-ab.sh build OUT REV...
#                   builds vgpu-worker and libvgpu_cuda.so of each git revision REV
#                   (a commit, a branch, or `.` for the working tree) into OUT/<name>/
#                   (<name>: REV with / as _, `working-tree` for `.`), stripped, with
#                   apibench.c beside: 8 MiB or so per build, so several fit in one carry
#                   (OUT inside the repository, e.g. launch-ab, which git ignores).
# GPU machine:    ci/gpu/launch-ab.sh run OUT     (carry: ["launch-ab"])
#                   ROUNDS (default 6) rounds of native and each build in OUT, in order;
#                   prints each figure per round, then a table of medians with the ratio
#                   to native (the figures are kept in OUT/figures-<time>.txt).
#                 ci/gpu/launch-ab.sh table FIGURES
#                   that table again, from a figures file.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
}

build() {
    [[ $# -ge 2 ]] || usage
    local out=$1
    shift
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    cp cuda-shim/tests/gpu/apibench.c "$out/"
    local target=${CARGO_TARGET_DIR:-$root/target}/launch-ab rev name src tree
    for rev in "$@"; do
        name=${rev//\//_}
        [[ $rev == . ]] && name=working-tree
        if [[ $rev == . ]]; then
            src=$root
        else
            tree=$(mktemp -d)
            # A revision that does not resolve, or a build that fails, leaves nothing behind.
            # shellcheck disable=SC2064 # the path now: `tree` is gone when the trap runs
            trap "git worktree remove --force '$tree' 2>/dev/null || rm -rf '$tree'" EXIT
            git -c advice.detachedHead=false worktree add --quiet --detach "$tree" "$rev"
            src=$tree
        fi
        echo "launch-ab: building $rev"
        (cd "$src" && CARGO_TARGET_DIR=$target cargo build --release --locked --quiet \
            -p vgpu-worker -p vgpu-cuda)
        mkdir -p "$out/$name"
        strip -o "$out/$name/vgpu-worker" "$target/release/vgpu-worker"
        strip -o "$out/$name/libvgpu_cuda.so" "$target/release/libvgpu_cuda.so"
        git -C "$src" rev-parse HEAD >"$out/$name/REV"
        if [[ $rev != . ]]; then
            git worktree remove --force "$tree"
            trap - EXIT
        fi
    done
    du -sh "$out"
}

run() {
    [[ $# -eq 1 ]] || usage
    local out
    out=$(cd "$1" && pwd)
    local home=${CUDA_HOME:-/usr/local/cuda} d stubs name rounds=${ROUNDS:-6} wpid
    d=$(mktemp -d)
    stubs=$(dirname "$(find -L "$home" -path '*stubs*' -name libcuda.so | head -1)")
    gcc -std=c11 -O2 -I "$home/include" "$out/apibench.c" -o "$d/apibench" -L "$stubs" -lcuda
    local builds=()
    for name in "$out"/*/; do
        name=$(basename "$name")
        [[ -x $out/$name/vgpu-worker ]] || continue
        builds+=("$name")
        mkdir -p "$d/$name"
        cp "$out/$name/libvgpu_cuda.so" "$d/$name/libcuda.so.1"
        ln -sfn libcuda.so.1 "$d/$name/libcuda.so"
    done
    [[ ${#builds[@]} -gt 0 ]] || { echo "launch-ab: no build in $out"; exit 1; }
    for r in $(seq "$rounds"); do
        "$d/apibench" 0 2>&1 | sed -n 's/^FIG \(launch_sync_rtt\|async_launches\) /native \1 /p' ||
            echo "launch-ab: native apibench failed in round $r" >&2
        for name in "${builds[@]}"; do
            rm -f "$d/w.sock"
            "$out/$name/vgpu-worker" --backend cuda --socket "$d/w.sock" --vgpu-id 0 \
                --memory 8G --queues 4 --poll-us 50 >"$d/worker-$name-$r.log" 2>&1 &
            wpid=$!
            for _ in $(seq 150); do [[ -S $d/w.sock ]] && break; sleep 0.1; done
            LD_LIBRARY_PATH=$d/$name VGPU_SOCKET=$d/w.sock VGPU_DMA_POOL_MB=256 \
                "$d/apibench" 0 2>&1 |
                sed -n "s/^FIG \(launch_sync_rtt\|async_launches\) /$name \1 /p" ||
                echo "launch-ab: $name failed in round $r (its worker: $d/worker-$name-$r.log)" >&2
            kill "$wpid" 2>/dev/null || true
            wait "$wpid" 2>/dev/null || true
        done
    done | tee "$d/figures"
    cp "$d/figures" "$out/figures-$(date +%Y%m%d-%H%M%S).txt" 2>/dev/null || true
    echo
    table "$d/figures"
}

# The medians of a figures file (lines `WHO FIGURE VALUE ...`, each round starting with
# native's round trip): each build's medians, and the median over the rounds of its ratio
# to native in the same round, which the minute-to-minute drift of the native rate moves
# less than a ratio of medians; the middle half of those ratios beside it.
table() {
    awk '
        $1 == "native" && $2 == "launch_sync_rtt" { round++ }
        { v[$1, $2] = v[$1, $2] " " $3; who[$1] = 1; at[round, $1, $2] = $3 }
        function sorted(s, a,    k, i, j, t) {
            k = split(s, a, " ")
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
            return k
        }
        function median(s,    a, k) {
            k = sorted(s, a)
            return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        function quartile(s, q,    a, k) {
            k = sorted(s, a)
            return a[int((k - 1) * q + 1.5)]
        }
        function ratios(w, f,    r, s) {
            s = ""
            for (r = 1; r <= round; r++)
                if ((r, w, f) in at && (r, "native", f) in at && at[r, "native", f] > 0)
                    s = s " " at[r, w, f] / at[r, "native", f]
            return s
        }
        END {
            printf "| %-20s | %-34s | %-36s |\n", "medians", "null launch + sync (ratio, middle half)", "async launches (ratio, middle half)"
            printf "| %-20s | %-34s | %-36s |\n", "---", "---", "---"
            for (w in who) {
                rr = ratios(w, "launch_sync_rtt"); ra = ratios(w, "async_launches")
                printf "| %-20s | %6.2f us (%5.3fx, %5.3f-%5.3f) | %8.0f /s (%5.3fx, %5.3f-%5.3f) |\n", w,
                    median(v[w, "launch_sync_rtt"]), median(rr), quartile(rr, 0.25), quartile(rr, 0.75),
                    median(v[w, "async_launches"]), median(ra), quartile(ra, 0.25), quartile(ra, 0.75)
            }
        }' "$1"
}

case "${1:-}" in
build) shift; build "$@" ;;
run) shift; run "$@" ;;
table) shift; [[ $# -eq 1 ]] || usage; table "$1" ;;
*) usage ;;
esac
