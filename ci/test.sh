#!/usr/bin/env bash
# The project's test command (README.md; .ci/run calls exactly this). Builds everything it
# needs. Tests that need /dev/kvm or a GPU skip with a message when those are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/setup.sh
echo "== rust-vmm versions"
./ci/check-deps.sh
echo "== format"
cargo fmt --all -- --check
(cd guests && cargo fmt --all -- --check)
echo "== shell scripts parse (the GPU machine's scripts too, which CI cannot run)"
for f in $(git ls-files '*.sh'); do bash -n "$f"; done
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
(cd guests && cargo clippy --release --locked -- -D warnings)
echo "== tests"
# The e2e tests run the programs (vmm, vgpu-worker, vgpud...): cargo test alone builds
# other packages' binaries only as test harnesses.
cargo build --workspace --bins --locked
cargo test --workspace --locked
(cd guests && cargo test --locked --target x86_64-unknown-linux-gnu -p payload-rt)
echo "== fuzz targets (build only; docs/hostile.md says how to run them)"
if command -v cargo-fuzz >/dev/null && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    # Type-checks every target with the fuzzing cfg (a full sanitizer build takes long on
    # 2 cores; `cargo +nightly fuzz build -O` in fuzz/ is the full one).
    (cd fuzz && cargo +nightly fuzz check -O)
else
    echo "skipped: cargo-fuzz or the nightly toolchain is missing (cargo install cargo-fuzz; rustup toolchain install nightly)"
fi
echo "== the Debian package: build, dpkg -i, vgpud from the installed unit's command line, a VM, a C program, dpkg -P"
./ci/package-test.sh
echo "== all tests passed"
