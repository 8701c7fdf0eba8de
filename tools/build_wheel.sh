#!/usr/bin/env bash
# Builds the `ckpt` wheel: the Python package and its nanobind extension (//python:wheel), plus
# the daemons and ckptctl under ckpt/bin/ (so ckpt.LocalCluster works from an installed wheel),
# into dist/ (or $1):
#   tools/build_wheel.sh && .venv/bin/pip install dist/ckpt-*.whl   # into another environment
# The extension links this host's system libraries (tools/install_deps.sh installs them), so
# the wheel is for machines set up the same way (Debian 12, CPython 3.11).
# tests/python:wheel_test installs the same wheel (built by the same python/wheel.py --base).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
bazel build //python:wheel //coordinator:ckpt_coordinator //worker:ckpt_worker //tools:ckptctl
bin=$(bazel info bazel-bin 2>/dev/null)
name=ckpt-0.1.0-cp311-cp311-linux_x86_64.whl
mkdir -p "$out"
python3 python/wheel.py --base "$bin/python/$name" --out "$out/$name" \
  --exec ckpt/bin/ckpt_coordinator="$bin/coordinator/ckpt_coordinator" \
  --exec ckpt/bin/ckpt_worker="$bin/worker/ckpt_worker" \
  --exec ckpt/bin/ckptctl="$bin/tools/ckptctl"
echo "$out/$name"
