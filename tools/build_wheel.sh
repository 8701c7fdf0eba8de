#!/usr/bin/env bash
# Builds the `ckpt` wheel (the Python package, its nanobind extension, and the daemons and
# ckptctl under ckpt/bin/) and copies it to dist/ (or $1):
#   tools/build_wheel.sh && .venv/bin/pip install dist/ckpt-*.whl   # into another environment
# The extension links this host's system libraries (tools/install_deps.sh installs them), so
# the wheel is for machines set up the same way (Debian 12, CPython 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
bazel build //python:wheel
mkdir -p "$out"
wheel=$(bazel info bazel-bin 2>/dev/null)/python/ckpt-0.1.0-cp311-cp311-linux_x86_64.whl
cp -f "$wheel" "$out/"
chmod 0644 "$out/$(basename "$wheel")"
echo "$out/$(basename "$wheel")"
