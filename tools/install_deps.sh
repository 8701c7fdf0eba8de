#!/usr/bin/env bash
# Installs every Debian package ckpt's build, tests, demo and benchmarks need.
# Idempotent: when everything is present it installs nothing and touches no package list.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev libxxhash-dev liburing-dev nlohmann-json3-dev
  libssl-dev openssl pkg-config python3
)
# Optional peers for benchmarks only (large): CKPT_INSTALL_BENCH_PEERS=1 adds python3-torch.
if [[ "${CKPT_INSTALL_BENCH_PEERS:-0}" == "1" ]]; then
  PACKAGES+=(python3-torch python3-numpy)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"

if ! command -v nvcc >/dev/null 2>&1 && [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
  echo "install_deps: warning: CUDA toolkit with NCCL not found under /usr/local/cuda" >&2
fi
