#!/usr/bin/env bash
# The README's main command runs in CI on a small size: tools/demo.sh --size small with the
# binaries Bazel built for this test (from its runfiles, so no bazel runs inside bazel). It
# starts a real coordinator, 4 workers and the trainer ranks on loopback and fails unless every
# step (save, both loads with every element verified, reshards, verify, inspect, export) passes.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
exec tools/demo.sh --size small --bin-dir "$PWD" --workdir "${TEST_TMPDIR}/demo"
