#!/usr/bin/env bash
# Installs everything ckpt's build, tests, demo and benchmarks need, idempotently:
#  1. Debian packages (nothing is installed, and no package list touched, when all are present);
#  2. the project's Python environment: Debian's python3 with exactly python/requirements.lock
#     (torch, numpy, safetensors, megatron-core, nanobind, pytest, pinned), created once per lock
#     under ~/.cache/ckpt-venvs/<hash> (CKPT_VENV_HOME overrides) and linked as .venv, so a fresh
#     clone on the same machine reuses it. A lock change makes a new environment;
#  3. Debian's gRPC source built with NDEBUG for `-c opt` builds (tools/install_grpc_release.sh:
#     into /usr/local/lib/ckpt-grpc, once per installed gRPC version).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libxxhash-dev liburing-dev libzstd-dev nlohmann-json3-dev libre2-dev libjemalloc-dev
  libssl-dev openssl pkg-config python3 python3-dev python3-venv
  clang libclang-rt-14-dev clang-format
  iproute2
  dpkg-dev cmake libc-ares-dev zlib1g-dev libprotoc-dev
  # The S3 store: libcurl (SigV4 signing built in), and the real S3-compatible server its tests
  # start (storage/s3/testing/swift_server.py): a one-node OpenStack Swift with s3api. No
  # memcached: tempauth's S3 path signs every request and works without one.
  libcurl4-openssl-dev
  swift swift-proxy swift-account swift-container swift-object
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  # Packages with daemons (Swift's servers) must not start them on install: a policy-rc.d that
  # refuses every start, for this install only, unless the machine already has one of its own.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  if [[ -n "$(trap -p EXIT)" ]]; then
    $SUDO rm -f /usr/sbin/policy-rc.d
    trap - EXIT
  fi
  echo "install_deps: packages done"
fi

# Not fatal: without it `-c opt` builds link Debian's gRPC (the same sonames; slower at scale,
# and ckpt_loadgen's report names the library it ran), and nothing else needs it.
"$(dirname "$0")"/install_grpc_release.sh ||
  echo "install_deps: warning: gRPC was not built with NDEBUG (above); -c opt builds link" \
    "Debian's gRPC until tools/install_grpc_release.sh succeeds" >&2

# --- Python environment -------------------------------------------------------------------
cd "$(dirname "$0")/.."
LOCK=python/requirements.lock
PYTHON=/usr/bin/python3
key=$( (cat "$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
VENV_HOME=${CKPT_VENV_HOME:-$HOME/.cache/ckpt-venvs}
venv=$VENV_HOME/$key
# The marker is written last: an interrupted install is redone from scratch.
if [[ ! -e "$venv/.ckpt-complete" ]]; then
  echo "install_deps: creating the Python environment $venv (torch and its CUDA wheels: ~5 GB)"
  rm -rf "$venv"
  mkdir -p "$VENV_HOME"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$LOCK"
  "$venv/bin/python" -m pip check -q --disable-pip-version-check >/dev/null || {
    echo "install_deps: $LOCK is not a complete set: pip check says" >&2
    "$venv/bin/python" -m pip check >&2
    exit 1
  }
  touch "$venv/.ckpt-complete"
fi
if [[ "$(readlink .venv 2>/dev/null)" != "$venv" ]]; then
  if [[ -e .venv && ! -L .venv ]]; then
    echo "install_deps: .venv exists and is not the link this script makes; remove it" >&2
    exit 1
  fi
  ln -sfn "$venv" .venv
fi
echo "install_deps: Python environment .venv -> $venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

if ! command -v nvcc >/dev/null 2>&1 && [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
  echo "install_deps: warning: CUDA toolkit with NCCL not found under /usr/local/cuda" >&2
fi
