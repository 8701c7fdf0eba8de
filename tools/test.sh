#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything with Bazel, runs every
# test (plus the parser fuzz tests and the multi-process tests, daemons included, again under
# AddressSanitizer: the targets tagged "asan"), and prints one summary line
#   N passed, M failed, K skipped
# counted over individual test cases. Exits non-zero if anything failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/.."

./tools/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }

BAZEL=${BAZEL:-bazel}
JOBS_FLAGS=()
[[ -n "${CKPT_BAZEL_JOBS:-}" ]] && JOBS_FLAGS=(--jobs="$CKPT_BAZEL_JOBS")

status=0
echo "== bazel build //... =="
$BAZEL build --keep_going "${JOBS_FLAGS[@]}" //... || status=1

echo "== bazel test //... =="
$BAZEL test --keep_going "${JOBS_FLAGS[@]}" //... || status=1
mapfile -t TARGETS < <($BAZEL query 'tests(//...)' 2>/dev/null)

ASAN_TARGETS=$($BAZEL query 'attr(tags, "asan", tests(//...))' 2>/dev/null | tr '\n' ' ')
if [[ -n "${ASAN_TARGETS// /}" ]]; then
  echo "== bazel test --config=asan (fuzz and multi-process tests under AddressSanitizer) =="
  # Separate symlink prefix so the asan run's logs do not replace the main run's.
  $BAZEL test --config=asan --keep_going --symlink_prefix=bazel-asan- "${JOBS_FLAGS[@]}" \
    $ASAN_TARGETS || status=1
fi

python3 tools/count_tests.py --status "$status" --testlogs bazel-testlogs \
  --asan-testlogs bazel-asan-testlogs -- "${TARGETS[@]}" $ASAN_TARGETS
