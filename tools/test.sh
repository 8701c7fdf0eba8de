#!/usr/bin/env bash
# The README's test command: installs dependencies, builds everything with Bazel, runs every
# test (plus the parser fuzz tests and the multi-process tests, daemons included, again under
# AddressSanitizer: the targets tagged "asan"; the in-process concurrency tests under
# ThreadSanitizer: those tagged "tsan"; and the libFuzzer targets for a bounded time under
# ASan + UBSan through tools/fuzz.sh; the layering checks of tools/layering.py; the names the
# design docs use, tools/doc_names.py; and the clang-format check of tools/format.sh), and
# prints one summary line
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

# ThreadSanitizer for the in-process concurrency tests (tagged "tsan"). Not the multi-process
# tests: their daemons hand data between threads inside the uninstrumented system gRPC, which
# TSan cannot see (docs/services.md, "Sanitizers"). The suppressions are library-internal only.
TSAN_TARGETS=$($BAZEL query 'attr(tags, "tsan", tests(//...))' 2>/dev/null | tr '\n' ' ')
if [[ -n "${TSAN_TARGETS// /}" ]]; then
  echo "== bazel test --config=tsan (in-process concurrency tests under ThreadSanitizer) =="
  TSAN_OPTIONS="suppressions=$PWD/tools/tsan.supp:second_deadlock_stack=1" \
    $BAZEL test --config=tsan --keep_going --symlink_prefix=bazel-tsan- "${JOBS_FLAGS[@]}" \
    $TSAN_TARGETS || status=1
fi

# The layers (tools/layering.py: no upward include or BUILD dependency, gRPC/spdlog only in
# the shells), docs/ARCHITECTURE.md's generated table and the generated Bazel package_groups:
# one JUnit test case each under bazel-lint-testlogs/, counted below.
echo "== tools/layering.py ci (layers, architecture table, visibility) =="
rm -rf bazel-lint-testlogs
python3 tools/layering.py ci --testlogs bazel-lint-testlogs || status=1

# Formatting (tools/format.sh, pinned to clang-format 14): one JUnit test case beside the
# layering ones, so an unformatted file is a failed test in the summary line.
echo "== tools/format.sh --check (clang-format 14) =="
./tools/format.sh --check --junit bazel-lint-testlogs/tools/clang_format/test.xml || status=1

# Function length (tools/function_length.py): no function over 80 lines outside tests and
# generated code unless its ALLOWED entry says why. One JUnit test case.
echo "== tools/function_length.py ci (no function over 80 lines) =="
mkdir -p bazel-lint-testlogs/tools/function_length
python3 tools/function_length.py ci --junit bazel-lint-testlogs/tools/function_length/test.xml \
  || status=1

# Docs that cannot drift (tools/doc_names.py): every backticked code name in
# docs/ARCHITECTURE.md, docs/paths/*.md and tests/README.md (functions, types, fields, files,
# flags, Bazel targets) must exist in the code. One JUnit test case.
echo "== tools/doc_names.py ci (the design docs name only code that exists) =="
python3 tools/doc_names.py ci --junit bazel-lint-testlogs/tools/doc_names/test.xml || status=1

echo "== tools/fuzz.sh (libFuzzer + ASan + UBSan, ${CKPT_FUZZ_SECONDS:-30}s per parser) =="
./tools/fuzz.sh || status=1

python3 tools/count_tests.py --status "$status" --testlogs bazel-testlogs \
  --asan-testlogs bazel-asan-testlogs --tsan-testlogs bazel-tsan-testlogs \
  --extra-testlogs bazel-fuzz-testlogs --extra-testlogs bazel-lint-testlogs --tsan-targets $TSAN_TARGETS -- "${TARGETS[@]}" $ASAN_TARGETS
