#!/usr/bin/env bash
# Fetches NVIDIA's NVML Python bindings (nvidia-ml-py: one file, pynvml.py, which loads
# libnvidia-ml.so.1 with ctypes as PyTorch's NVML calls do) from PyPI into target/pynvml/,
# where vgpu-nvml's `pynvml` test finds it (docs/nvml.md). Skips, saying so, where pip or
# the network is missing. Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${VGPU_PYNVML_DIR:-$root/target/pynvml}
VERSION=13.615.71

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch-pynvml: no python3 pip here; the pynvml test will be skipped" >&2
  exit 0
fi
if [ -f "$dest/.fetched-$VERSION" ]; then
  exit 0
fi
wheels="$dest/wheels"
mkdir -p "$wheels"
if ! python3 -m pip download --quiet --timeout 30 --retries 1 --no-deps --only-binary=:all: \
    -d "$wheels" "nvidia-ml-py==$VERSION"; then
  echo "fetch-pynvml: cannot download nvidia-ml-py==$VERSION (no network?); the pynvml test will be skipped" >&2
  exit 0
fi
tmp=$(mktemp -d)
python3 -m zipfile -e "$(ls "$wheels"/nvidia_ml_py-"$VERSION"-*.whl | head -n 1)" "$tmp"
cp "$tmp/pynvml.py" "$dest/pynvml.py"
rm -rf "$tmp"
touch "$dest/.fetched-$VERSION"
echo "fetch-pynvml: nvidia-ml-py $VERSION in $dest"
