#!/usr/bin/env bash
# Builds the vgpu Debian package from the workspace (docs/install.md says what it installs
# and where). The package's metadata and files are in packaging/: the control file and the
# maintainer scripts (packaging/deb/), the systemd unit and the default configuration.
#
#   /usr/bin/{vgpud,vgpu-worker,vmm,vgpuctl,vgpu-cuda}
#   /usr/lib/vgpu/payloads/          the payload guests (the config's payload-dir)
#   /usr/lib/vgpu/cuda/              libcuda.so.1 and libcuda.so (the vGPU CUDA library),
#                                    libnvidia-ml.so.1 and libnvidia-ml.so (the vGPU NVML
#                                    library; both never on the host's default library
#                                    path), cuda.h and nvml.h
#   /usr/lib/systemd/system/vgpud.service
#   /etc/vgpud/vgpud.json            the configuration (a conffile)
#   /usr/share/doc/vgpu/             README, install, tenants, troubleshooting, API docs
#   /var/lib/vgpud                   created by the package and the unit (StateDirectory=)
#
# Usage: ci/package-deb.sh [--profile release|debug] [--out DIR] [--no-build]
#   --profile   which build to package (default release; CI packages its debug build)
#   --out       where the .deb goes (default target/debian); its path is printed last
#   --no-build  package what target/<profile> already holds (fails if something is missing)
# Needs dpkg-deb (apt-get install dpkg-dev is not needed: dpkg provides it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
profile=release
out="$root/target/debian"
build=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --profile) profile="${2:?--profile needs release or debug}"; shift 2 ;;
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "package-deb: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
case "$profile" in
    release) cargo_profile=(--release) ;;
    debug) cargo_profile=() ;;
    *) echo "package-deb: --profile $profile: give release or debug" >&2; exit 2 ;;
esac
command -v dpkg-deb >/dev/null || { echo "package-deb: dpkg-deb is missing (install dpkg)" >&2; exit 1; }
log() { echo "package-deb: $*" >&2; }

target="${CARGO_TARGET_DIR:-$root/target}/$profile"
programs=(vgpud vgpu-worker vmm vgpuctl vgpu-cuda)
if [[ $build == 1 ]]; then
    log "building the programs and the CUDA and NVML libraries ($profile)"
    cargo build --locked "${cargo_profile[@]}" -p vgpud -p vgpu-worker -p vmm -p vgpuctl \
        -p vgpu-cuda -p payload-build --bins
    cargo build --locked "${cargo_profile[@]}" -p vgpu-cuda -p vgpu-nvml --lib
fi
for p in "${programs[@]}" payload-build libvgpu_cuda.so libvgpu_nvml.so; do
    [[ -f "$target/$p" ]] || { log "$target/$p is missing: build it (drop --no-build)"; exit 1; }
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[[ -n "$version" ]] || { log "no version in Cargo.toml's [workspace.package]"; exit 1; }
arch=$(dpkg --print-architecture)

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
pkg="$stage/vgpu"
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/lib/vgpu/payloads" "$pkg/usr/lib/vgpu/cuda/include" \
    "$pkg/usr/lib/systemd/system" "$pkg/etc/vgpud" "$pkg/usr/share/doc/vgpu"

for p in "${programs[@]}"; do
    install -m 0755 "$target/$p" "$pkg/usr/bin/$p"
done
log "building the payloads"
"$target/payload-build" --out "$pkg/usr/lib/vgpu/payloads" >/dev/null
chmod 0644 "$pkg"/usr/lib/vgpu/payloads/*
"$target/vgpu-cuda" install --dir "$pkg/usr/lib/vgpu/cuda" --lib "$target/libvgpu_cuda.so" \
    --nvml "$target/libvgpu_nvml.so" >/dev/null
chmod 0644 "$pkg/usr/lib/vgpu/cuda/libcuda.so.1" "$pkg/usr/lib/vgpu/cuda/libnvidia-ml.so.1"
install -m 0644 cuda-shim/include/cuda.h "$pkg/usr/lib/vgpu/cuda/include/cuda.h"
install -m 0644 nvml-shim/include/nvml.h "$pkg/usr/lib/vgpu/cuda/include/nvml.h"
install -m 0644 packaging/vgpud.service "$pkg/usr/lib/systemd/system/vgpud.service"
install -m 0644 packaging/vgpud.json "$pkg/etc/vgpud/vgpud.json"
install -m 0644 README.md "$pkg/usr/share/doc/vgpu/README.md"
for d in install tenants troubleshooting api cuda-api nvml; do
    install -m 0644 "docs/$d.md" "$pkg/usr/share/doc/vgpu/$d.md"
done
license=$(sed -n '/^\[workspace.package\]/,/^\[/s/^license *= *"\(.*\)"/\1/p' Cargo.toml)
printf 'vgpu\nLicense: %s\n' "${license:-see the source}" >"$pkg/usr/share/doc/vgpu/copyright"

# Debug information makes no sense in a package and slows building it: strip it.
strip --strip-debug "$pkg"/usr/bin/* "$pkg/usr/lib/vgpu/cuda/libcuda.so.1" \
    "$pkg/usr/lib/vgpu/cuda/libnvidia-ml.so.1"

size_kib=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size_kib/" \
    packaging/deb/control >"$pkg/DEBIAN/control"
install -m 0644 packaging/deb/conffiles "$pkg/DEBIAN/conffiles"
for s in postinst prerm postrm; do
    install -m 0755 "packaging/deb/$s" "$pkg/DEBIAN/$s"
done

mkdir -p "$out"
deb="$out/vgpu_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip -z3 --build "$pkg" "$deb" >/dev/null
log "built $deb ($(du -h "$deb" | cut -f1))"
echo "$deb"
