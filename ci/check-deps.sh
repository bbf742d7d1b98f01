#!/usr/bin/env bash
# Fails when Cargo.lock holds more than one version of a rust-vmm crate: virtio-queue,
# vhost, vhost-user-backend and linux-loader must all agree on one vm-memory (and so on),
# or guest memory types stop lining up across crates.
set -euo pipefail
cd "$(dirname "$0")/.."
crates="kvm-ioctls kvm-bindings vm-memory virtio-queue virtio-bindings vhost vhost-user-backend event-manager vmm-sys-util linux-loader vm-superio"
fail=0
for c in $crates; do
  n=$(awk -v c="$c" '$0=="[[package]]"{p=0} $0=="name = \""c"\""{p=1} p&&/^version = /{print; p=0}' Cargo.lock | sort -u | wc -l)
  if [ "$n" -gt 1 ]; then
    echo "check-deps: $c appears in $n versions in Cargo.lock:"
    awk -v c="$c" '$0=="[[package]]"{p=0} $0=="name = \""c"\""{p=1} p&&/^version = /{print "  " $0; p=0}' Cargo.lock
    fail=1
  elif [ "$n" -eq 0 ]; then
    echo "check-deps: $c is missing from Cargo.lock"
    fail=1
  fi
done
[ "$fail" -eq 0 ] && echo "check-deps: one version of each rust-vmm crate"
exit "$fail"
