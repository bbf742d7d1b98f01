#!/usr/bin/env bash
# Builds what a run on the GPU machine needs (it has no cargo) and lays it out in one
# git-ignored folder, stripped, with stable names:
#
#   gpu-bundle/bin/<program>        vmm, vgpud, vgpu-worker, vgpuctl, vgpu-cuda, vgpu-bench,
#                                   vgpu-storage-bench, vgpu-native-load (the sharing step's
#                                   native anchor)
#   gpu-bundle/tests.tar.gz         the release test binaries the suite runs (it unpacks them
#                                   into gpu-bundle/tests/ on the GPU machine), named by their
#                                   cargo target name; a name two packages share gets
#                                   `.<package>` appended (storage.vgpu-backend, storage.vgpu-tests);
#                                   packed, since unpacked they alone come near the carry limit
#   gpu-bundle/payloads/            the payload guests (VGPU_PAYLOAD_DIR)
#   gpu-bundle/kernels/             the CUDA C sources, committed PTX and build-ptx.sh
#   gpu-bundle/lib/libvgpu_cuda.so  the vGPU CUDA library (the steps install it with
#                                   `bin/vgpu-cuda install`, as libcuda.so.1 and libcuda.so)
#   gpu-bundle/lib/libvgpu_nvml.so  the vGPU NVML library (`bin/vgpu-cuda install` puts it
#                                   beside, as libnvidia-ml.so.1 and libnvidia-ml.so)
#   gpu-bundle/cuda-programs/       that step's C, CUDA and Python sources, and the
#                                   cuda-shares step's (vecloop) and the cudart step's (rt_*)
#   gpu-bundle/fuzz/                the fuzz targets, when they were built (see below)
#   gpu-bundle/MANIFEST             what is in it, from which commit, sizes
#
# Then carry it: the `run` tool with `carry: ["gpu-bundle"]` and the command
# `ci/gpu/suite.sh [--quick] [step...]` (ci/gpu/README.md).
#
# Usage: ci/gpu/bundle.sh [OUT_DIR]     (default: gpu-bundle in the repository root)
# Environment: CARGO_TARGET_DIR (default target/), BUNDLE_MAX_MIB (default 64).
# Fuzz targets are copied when `(cd fuzz && cargo +nightly fuzz build -O -a -s none)` has
# left them in fuzz/target/x86_64-unknown-linux-gnu/release (FUZZ_BIN overrides).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${1:-$root/gpu-bundle}"
target="${CARGO_TARGET_DIR:-$root/target}"
max_mib="${BUNDLE_MAX_MIB:-64}"

programs=(vmm vgpud vgpu-worker vgpuctl vgpu-cuda vgpu-bench vgpu-storage-bench vgpu-native-load)
# Test targets the suite runs (ci/gpu/suite.sh), by cargo target name, whatever package
# holds them.
tests=(conformance isolation cuda_bench storage gpu band device migration cuda gpu_migration
    cuda_programs module_memory vgpu_backend host_migration memory bounds batch tensor_map
    gpu_tensor_map virtual_memory gpu_vmm cluster_occupancy gpu_cluster_occupancy gpu_host_map)

log() { echo "bundle: $*" >&2; }

# Release builds without debug info: everything is stripped anyway, and it builds faster.
export CARGO_PROFILE_RELEASE_DEBUG=false

# The payload guests' bare-metal target, as the tests and the demo install it.
./ci/setup.sh

log "building the programs (release)"
cargo build --release --locked --workspace --bins

log "building the vGPU CUDA and NVML libraries (release)"
cargo build --release --locked -p vgpu-cuda -p vgpu-nvml --lib

log "building the test binaries (release)"
test_args=()
for t in "${tests[@]}"; do [[ "$t" == vgpu_backend ]] || test_args+=(--test "$t"); done
json="$(mktemp)"
trap 'rm -f "$json"' EXIT
cargo test --release --locked --workspace --no-run --message-format=json "${test_args[@]}" >"$json"
# The backend's unit tests too: the cuda hard-limit test lives beside its code.
cargo test --release --locked -p vgpu-backend --lib --no-run --message-format=json >>"$json"

rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/payloads" "$out/kernels" "$out/lib" "$out/cuda-programs"

for p in "${programs[@]}"; do
    if [[ ! -x "$target/release/$p" ]]; then
        log "program $p was not built (is it still a workspace binary?)"
        exit 1
    fi
    cp "$target/release/$p" "$out/bin/$p"
done

# One line per test executable: "<target name> <package name> <path>".
python3 - "$json" "${tests[@]}" >"$out/tests/.list" <<'EOF'
import json, sys
path, wanted = sys.argv[1], set(sys.argv[2:])
for line in open(path):
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    t = msg["target"]
    is_test = "test" in t["kind"] or msg.get("profile", {}).get("test")
    if not is_test or t["name"] not in wanted:
        continue
    # package_id: "path+file:///.../backend#vgpu-backend@0.1.0" (or "...#0.1.0" when the
    # package is named after its folder).
    pid = msg["package_id"]
    frag = pid.split("#", 1)[-1]
    pkg = frag.split("@", 1)[0] if "@" in frag else pid.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    print(t["name"], pkg, msg["executable"])
EOF
mapfile -t built <"$out/tests/.list"
rm -f "$out/tests/.list"
for t in "${tests[@]}"; do
    if ! printf '%s\n' "${built[@]}" | grep -q "^$t "; then
        log "test target $t was not built"
        exit 1
    fi
done
for line in "${built[@]}"; do
    read -r name pkg exe <<<"$line"
    n=$(printf '%s\n' "${built[@]}" | grep -c "^$name ")
    if [[ "$n" -gt 1 ]]; then
        cp "$exe" "$out/tests/$name.$pkg"
    else
        cp "$exe" "$out/tests/$name"
    fi
done

log "building the payloads"
cargo run --release --locked -q -p payload-build -- --out "$out/payloads" >/dev/null

cp backend/kernels/*.cu backend/kernels/*.ptx backend/kernels/build-ptx.sh "$out/kernels/"
cp "$target/release/libvgpu_cuda.so" "$out/lib/libvgpu_cuda.so"
cp "$target/release/libvgpu_nvml.so" "$out/lib/libvgpu_nvml.so"
cp cuda-shim/tests/gpu/vecadd.c cuda-shim/tests/gpu/vecadd.cu cuda-shim/tests/gpu/vecadd.py \
    cuda-shim/tests/gpu/apibench.c cuda-shim/tests/gpu/globals.c \
    cuda-shim/tests/gpu/vecloop.c cuda-shim/tests/gpu/vecloop.cu \
    cuda-shim/tests/gpu/rt_vecadd.cu cuda-shim/tests/gpu/rt_cluster.cu cuda-shim/tests/gpu/rt_cupy.py cuda-shim/tests/gpu/rt_torch.py \
    cuda-shim/tests/gpu/rt_triton.py cuda-shim/tests/gpu/rt_jax.py \
    cuda-shim/tests/gpu/rt_bench.py cuda-shim/tests/gpu/rt_first.py cuda-shim/tests/gpu/rt_share.py cuda-shim/tests/gpu/rt_share_check.py \
    "$out/cuda-programs/"

fuzz_bin="${FUZZ_BIN:-$root/fuzz/target/x86_64-unknown-linux-gnu/release}"
for f in request_parser rest_bodies elf_loader bzimage_loader; do
    if [[ -x "$fuzz_bin/$f" ]]; then
        mkdir -p "$out/fuzz"
        cp "$fuzz_bin/$f" "$out/fuzz/$f"
    fi
done

log "stripping"
strip --strip-all "$out"/bin/* "$out"/tests/*
strip --strip-unneeded "$out"/lib/*.so
[[ -d "$out/fuzz" ]] && strip --strip-debug "$out"/fuzz/*

log "packing the test binaries"
tar -C "$out" -czf "$out/tests.tar.gz" tests
rm -rf "$out/tests"

{
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (modified)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    (cd "$out" && find . -type f ! -name MANIFEST -printf '%P %s\n' | sort)
} >"$out/MANIFEST"

bytes=$(du -sb "$out" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
limit=$((max_mib * 1048576))
echo "bundle: $out: $mib MiB ($bytes bytes) of at most $max_mib MiB"
du -sh "$out"/* | sed 's/^/bundle:   /'
if [[ "$bytes" -ge "$limit" ]]; then
    echo "bundle: too large to carry (limit $max_mib MiB)" >&2
    exit 1
fi
