#!/usr/bin/env bash
# The requires-gpu suite with one command per machine. NOT YET RUN on a GPU (written on a
# machine without one).
#
#   tools/gpu_suite.sh build [DIR]   # here (Bazel): builds every requires-gpu test and the D2H
#                                    # staging benchmark, and bundles them with the daemons they
#                                    # start (as runfiles) and the shared libraries `ldd` lists
#                                    # that a bare machine lacks (gRPC, abseil, gloo, protobuf,
#                                    # re2, ssl, cudart...) into DIR (default gpu-bundle, ignored
#                                    # by git)
#   tools/gpu_suite.sh run [DIR]     # on the GPU machine (no Bazel there): runs every test with
#                                    # LD_LIBRARY_PATH=DIR/lib, then the benchmark; writes
#                                    # device.txt, suite.log, benchmark.txt, summary.txt to $OUT
#                                    # (default DIR/logs) and exits non-zero on any failure
#   tools/gpu_suite.sh bench [DIR]   # on the GPU machine: the benchmarks only: D2H staging vs
#                                    # the pinned cudaMemcpy peak (benchmark.txt), then ckpt vs
#                                    # DCP on BENCH_GB (default 8) GB of CUDA state
#                                    # (tools/bench/device_dcp_bench.py with the machine's own
#                                    # python that imports torch, or BENCH_PYTHON; e2e.txt)
#
# With this project's device tool: `tools/gpu_suite.sh build`, then
#   run(command="tools/gpu_suite.sh run gpu-bundle", carry=["gpu-bundle"], timeout_s=600)
#   run(command="tools/gpu_suite.sh bench gpu-bundle", carry=["gpu-bundle"], timeout_s=600)
# libnccl.so.2 (218 MB) is not bundled: `run` finds the GPU machine's own (CUDA toolkit, the
# library path, or PyTorch's nvidia-nccl wheel). BENCH_BYTES sets the benchmark's state size.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-build}
dir=${2:-gpu-bundle}

TESTS=(//exchange:nccl_communicator_test //exchange:nccl_conformance_test //exchange:nccl_exchange_test
       //worker:staging_pipeline_cuda_test //tests:device_e2e_test)
BENCHMARKS=(//tools/bench:device_staging_benchmark //tools/bench:device_bench_trainer)
# Python drivers copied into DIR/bench; they run with the GPU machine's own python and torch
# (the venv, the _ckpt extension and ckpt.torch are not bundled: the extension is built for this
# machine's CPython, so //tests/python:cuda_test, the Python package's requires-gpu test, runs
# only where the project's venv and a GPU are on one machine).
SCRIPTS=(tools/bench/device_dcp_bench.py tools/bench/disk_limits.py)
RUNFILES=(worker/ckpt_worker coordinator/ckpt_coordinator tools/ckptctl tests/device_trainer)
# Present on any Linux machine, or the GPU machine's own (driver, NCCL).
SYSTEM_LIBS='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libcuda|libnvidia|libnccl)\.'

path_of() { local label=${1#//}; echo "bazel-bin/${label/://}"; }

build() {
  # Every requires-gpu C++ test must be in TESTS, so the suite never silently shrinks.
  local tagged
  tagged=$(bazel query 'attr(tags, "requires-gpu", tests(//...)) except attr(tags, "python", tests(//...))' \
    2>/dev/null | sort)
  if [[ "$tagged" != "$(printf '%s\n' "${TESTS[@]}" | sort)" ]]; then
    echo "gpu_suite: TESTS differs from the requires-gpu targets:" >&2
    diff <(printf '%s\n' "${TESTS[@]}" | sort) <(echo "$tagged") >&2 || true
    exit 1
  fi
  local labels=() r
  for r in "${RUNFILES[@]}"; do labels+=("//$(dirname "$r"):$(basename "$r")"); done
  bazel build "${TESTS[@]}" "${BENCHMARKS[@]}" "${labels[@]}" 2>&1 | tail -2
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib" "$dir/runfiles/ckpt" "$dir/bench"
  for t in "${TESTS[@]}" "${BENCHMARKS[@]}"; do cp "$(path_of "$t")" "$dir/bin/"; done
  for s in "${SCRIPTS[@]}"; do cp "$s" "$dir/bench/"; done
  for r in "${RUNFILES[@]}"; do
    mkdir -p "$dir/runfiles/ckpt/$(dirname "$r")"
    cp "bazel-bin/$r" "$dir/runfiles/ckpt/$r"
  done
  chmod -R u+w "$dir"
  find "$dir/bin" "$dir/runfiles" -type f -exec strip --strip-debug {} \;
  # ldd on the built files (their rpaths find Bazel's per-target libraries), not the copies.
  local built=() t
  for t in "${TESTS[@]}" "${BENCHMARKS[@]}"; do built+=("$(path_of "$t")"); done
  for r in "${RUNFILES[@]}"; do built+=("bazel-bin/$r"); done
  for t in "${built[@]}"; do ldd "$t"; done | awk '/=> \// {print $1, $3}' | sort -u |
    while read -r name path; do
      [[ "$name" =~ $SYSTEM_LIBS ]] && continue
      cp -L "$path" "$dir/lib/$name"
      chmod u+w "$dir/lib/$name"
      strip --strip-unneeded "$dir/lib/$name" 2>/dev/null || true
    done
  echo "gpu_suite: bundled $(ls "$dir/bin" | wc -l) binaries, $(ls "$dir/lib" | wc -l) libraries," \
    "$(du -sh "$dir" | cut -f1) in $dir"
  echo "gpu_suite: on the GPU machine: tools/gpu_suite.sh run $dir"
}

find_nccl() {
  local candidate
  for candidate in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
      $(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); do
    [[ -e "$candidate/libnccl.so.2" ]] && { echo "$candidate"; return; }
  done
  local found
  found=$(ldconfig -p | awk '/libnccl.so.2/ {print $NF; exit}')
  [[ -n "$found" ]] || found=$(find / -xdev -name libnccl.so.2 2>/dev/null | head -1)
  [[ -n "$found" ]] && dirname "$found"
}

# The bundle's libraries, then NCCL from the machine (its directory in $nccl).
nccl=
use_bundle_libs() {
  nccl=$(find_nccl || true)
  export LD_LIBRARY_PATH="$PWD/$dir/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# A python that imports torch (the GPU machine's own): BENCH_PYTHON, else the first that does.
find_torch_python() {
  local candidate
  for candidate in ${BENCH_PYTHON:-} python3 python /opt/conda/bin/python /usr/local/bin/python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    "$candidate" -c 'import torch, torch.distributed.checkpoint' >/dev/null 2>&1 &&
      { echo "$candidate"; return; }
  done
  return 1
}

bench() {
  local out=${OUT:-$dir/logs}
  mkdir -p "$out"
  local machine_libs=${LD_LIBRARY_PATH:-}
  use_bundle_libs
  local failed=0 python
  set +e
  timeout 300 "$dir/bin/device_staging_benchmark" --bytes "${BENCH_BYTES:-4294967296}" \
    >"$out/benchmark.txt" 2>&1 || failed=1
  set -e
  if python=$(LD_LIBRARY_PATH="$machine_libs" find_torch_python); then
    set +e
    # torch keeps the machine's libraries; the daemons and the trainer get the bundle's.
    timeout 560 env LD_LIBRARY_PATH="$machine_libs" CKPT_BUNDLE_LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
      "$python" "$dir/bench/device_dcp_bench.py" --bin "$dir/runfiles/ckpt" \
      --trainer "$dir/bin/device_bench_trainer" --dir "${BENCH_DIR:-/var/tmp/device_dcp_bench}" \
      --gb "${BENCH_GB:-8}" --reps "${BENCH_REPS:-2}" >"$out/e2e.txt" 2>&1 || failed=1
    set -e
  else
    echo "gpu_suite: no python here imports torch (set BENCH_PYTHON)" >"$out/e2e.txt"
    failed=1
  fi
  { echo "--- staging"; cat "$out/benchmark.txt"; echo "--- ckpt vs DCP"; cat "$out/e2e.txt"; } |
    tee "$out/bench_summary.txt"
  exit $failed
}

run() {
  local out=${OUT:-$dir/logs}
  mkdir -p "$out"
  use_bundle_libs
  export TEST_SRCDIR="$PWD/$dir/runfiles" TEST_WORKSPACE=ckpt
  export TEST_TMPDIR
  TEST_TMPDIR=$(mktemp -d)
  { nvidia-smi -L || echo "nvidia-smi failed"; echo "nccl from: ${nccl:-not found}"; uname -a; } \
    >"$out/device.txt" 2>&1
  : >"$out/suite.log"
  local failed=0 t name rc
  for t in "$dir"/bin/*_test; do
    name=$(basename "$t")
    echo "=== $name" >>"$out/suite.log"
    set +e
    timeout 540 "$t" >>"$out/suite.log" 2>&1
    rc=$?
    set -e
    echo "=== $name exit=$rc" >>"$out/suite.log"
    [[ $rc -eq 0 ]] || failed=1
  done
  set +e
  timeout 300 "$dir/bin/device_staging_benchmark" --bytes "${BENCH_BYTES:-4294967296}" \
    >"$out/benchmark.txt" 2>&1 || failed=1
  set -e
  # On a GPU machine a GPU test that skips means the bundle could not use the GPU (e.g. a
  # driver older than the bundled CUDA 13 runtime): a failure, not a pass.
  if nvidia-smi -L >/dev/null 2>&1 && grep -q "requires a CUDA device" "$out/suite.log"; then
    echo "gpu_suite: a GPU is present but tests skipped for want of one" >>"$out/suite.log"
    failed=1
  fi
  {
    grep -E '^=== .* exit=|^\[  (PASSED|FAILED|SKIPPED) \]|^gpu_suite:' "$out/suite.log"
    echo "--- benchmark"
    cat "$out/benchmark.txt"
  } | tee "$out/summary.txt"
  exit $failed
}

case "$mode" in
  build) build ;;
  run) run ;;
  bench) bench ;;
  *) echo "usage: tools/gpu_suite.sh build|run|bench [DIR]" >&2; exit 2 ;;
esac
