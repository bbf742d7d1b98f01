#!/usr/bin/env bash
# Builds what a Linux guest of the vmm needs (docs/linux-guests.md):
#   OUT/vmlinuz         Debian's cloud kernel (bzImage), fetched through apt
#   OUT/vmlinux         the same kernel uncompressed (ELF), for the vmm's direct 64-bit entry
#   OUT/initramfs.cpio.gz  busybox-static, the static vgpu-guest CLI and a small /init
#
# Usage: ci/build-initramfs.sh [OUT]   (default OUT: target/linux-guest)
# Needs: apt-get (Debian/Ubuntu), dpkg-deb, cargo with the x86_64-unknown-linux-musl target
# (rustup target add x86_64-unknown-linux-musl); network for apt. Not part of `cargo test`.
#
# Environment:
#   KERNEL_PKG   apt package of the kernel (default: linux-image-cloud-amd64, resolved to the
#                versioned package it depends on)
#   GUEST_BIN    a prebuilt static vgpu-guest to use instead of building one
#   INIT_CMD     what /init runs after mounting (default: vgpu-guest selftest, then reboot)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/target/linux-guest}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { echo "build-initramfs: $*" >&2; }

# --- the kernel -------------------------------------------------------------------------
kpkg=${KERNEL_PKG:-linux-image-cloud-amd64}
# A metapackage (no vmlinuz of its own) depends on the versioned image: follow it once.
dep=$(apt-cache depends "$kpkg" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$dep" ] && kpkg=$dep
log "fetching $kpkg and busybox-static through apt"
(cd "$work" && apt-get download "$kpkg" busybox-static >/dev/null)
mkdir -p "$work/kernel" "$work/busybox"
dpkg-deb -x "$work"/"${kpkg}"_*.deb "$work/kernel"
dpkg-deb -x "$work"/busybox-static_*.deb "$work/busybox"
vmlinuz=$(ls "$work"/kernel/boot/vmlinuz-* | head -n1)
cp "$vmlinuz" "$out/vmlinuz"
log "kernel: $(basename "$vmlinuz")"

# extract-vmlinux (scripts/extract-vmlinux in the kernel tree): find each compressor's magic
# in the bzImage, decompress from there, keep the first result that is an ELF.
is_elf() { [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }
try_decompress() { # magic (printf escapes), tool...
  local magic=$1; shift
  local pos
  for pos in $(LC_ALL=C grep -obUaP "$magic" "$out/vmlinuz" | cut -d: -f1); do
    tail -c+$((pos + 1)) "$out/vmlinuz" | "$@" >"$work/vmlinux" 2>/dev/null || true
    if [ -s "$work/vmlinux" ] && is_elf "$work/vmlinux"; then
      return 0
    fi
  done
  return 1
}
if try_decompress '\x1f\x8b\x08' gunzip ||
  try_decompress '\xfd\x37\x7a\x58\x5a\x00' unxz ||
  try_decompress '\x28\xb5\x2f\xfd' zstd -dc ||
  try_decompress '\x02\x21\x4c\x18' lz4 -dc ||
  try_decompress 'BZh' bunzip2; then
  cp "$work/vmlinux" "$out/vmlinux"
  log "vmlinux: $(stat -c %s "$out/vmlinux") bytes"
else
  log "cannot extract vmlinux from $vmlinuz (no known compressor found); bzImage only"
fi

# --- the guest CLI ----------------------------------------------------------------------
if [ -n "${GUEST_BIN:-}" ]; then
  guest=$GUEST_BIN
else
  log "building vgpu-guest (static, musl)"
  (cd "$root" && cargo build --release -p guest-driver --features std \
    --bin vgpu-guest --target x86_64-unknown-linux-musl >&2)
  guest=${CARGO_TARGET_DIR:-$root/target}/x86_64-unknown-linux-musl/release/vgpu-guest
fi

# --- the initramfs ----------------------------------------------------------------------
rd=$work/rootfs
mkdir -p "$rd"/{bin,sbin,dev,proc,sys,tmp,mnt/huge,usr/bin}
cp "$work/busybox/bin/busybox" "$rd/bin/busybox"
for app in sh mount umount cat echo ls dmesg reboot poweroff sleep mkdir grep uname free; do
  ln -sf busybox "$rd/bin/$app"
done
cp "$guest" "$rd/bin/vgpu-guest"
strip "$rd/bin/vgpu-guest" 2>/dev/null || true
init_cmd=${INIT_CMD:-'/bin/vgpu-guest info && /bin/vgpu-guest memory && /bin/vgpu-guest selftest'}
cat >"$rd/init" <<EOF
#!/bin/sh
# /init of the vgpu test initramfs: mount the basics, reserve hugepages for DMA, run the
# vGPU self-test on the console, then reset the machine (reboot=k: the vmm exits).
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null || true
mount -t hugetlbfs none /mnt/huge 2>/dev/null || true
echo 8 > /proc/sys/vm/nr_hugepages 2>/dev/null || true
echo "init: userspace reached after \$(cut -d' ' -f1 /proc/uptime) s"
$init_cmd
echo "init: exit status \$?"
reboot -f
EOF
chmod +x "$rd/init"
# newc cpio without a cpio binary: busybox's applet builds it.
(cd "$rd" && find . | "$work/busybox/bin/busybox" cpio -o -H newc 2>/dev/null) | gzip -9 >"$out/initramfs.cpio.gz"
log "initramfs: $(stat -c %s "$out/initramfs.cpio.gz") bytes"
ls -l "$out" >&2
