#!/usr/bin/env bash
# Every data path of ckpt against the machine's limit measured in the same run (issue 40): builds
# the binaries it drives with -c opt, then runs tools/bench/bandwidth.py (see its --help), which
# drives the existing benchmarks (tools/demo.sh, reshard_benchmark, dcp_import_bench.py,
# transfer_bench.py, memory_tier_bench.sh, exchange_process_benchmark, ckpt_torch_bench.py,
# compression_bench.py) and prints one row per path, then a Markdown table.
#
#   tools/bench/bandwidth.sh [--size small|default] [--only save,load,reshard,export,import,
#       transfer,replication,exchange,torch,compression] [--repeat N] [--dir DIR]
#       [--no-drop-caches] [--keep] [--bin DIR (skips the build)]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
for a in "$@"; do
  case "$a" in
    --help | -h) exec python3 tools/bench/bandwidth.py --help ;;
    --bin | --bin=*) exec python3 tools/bench/bandwidth.py "$@" ;;
  esac
done
bazel build -c opt //coordinator:ckpt_coordinator //worker:ckpt_worker //tools:ckptctl \
  //examples:gpt_trainer //examples:gpt_tool //tools/bench:reshard_benchmark //tests:transfer_probe \
  //tests:trainer_probe //tools/bench:exchange_process_benchmark //tools/bench:compression_bench \
  //python:ckpt
exec python3 tools/bench/bandwidth.py --bin "$REPO/bazel-out/k8-opt/bin" "$@"
