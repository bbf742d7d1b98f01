#!/usr/bin/env bash
# What a fresh machine needs beyond the Rust toolchain: the bare-metal target the payload
# guests build for (docs/payload-abi.md says why it is soft-float). Idempotent and quick
# when everything is in place.
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is missing; install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-none; then
  echo "setup: installing the x86_64-unknown-none target for the payload guests"
  rustup target add x86_64-unknown-none
fi
# NVIDIA's CUDA runtime from PyPI for cuda-shim's cudart test (skipped without pip/network).
"$(dirname "$0")/fetch-cudart.sh"
# NVIDIA's NVML Python bindings from PyPI for vgpu-nvml's pynvml test (skipped without them).
"$(dirname "$0")/fetch-pynvml.sh"
