#!/bin/bash
# open_streams_benchmark: --help, refused arguments (exit 2), and a tiny run of both modes.
set -u
bin="$TEST_SRCDIR/$TEST_WORKSPACE/tools/bench/open_streams_benchmark"
fail() { echo "FAIL: $*"; exit 1; }
"$bin" --help | grep -q "^usage: open_streams_benchmark" || fail "--help"
for bad in "--bogus" "--calls" "--threads 0" "--calls -5" "--streams -1" "--streams 4 extra"; do
  # shellcheck disable=SC2086
  "$bin" $bad > /dev/null 2>&1
  [ $? -eq 2 ] || fail "'$bad' was not refused with exit 2"
done
for mode in "" "--async_streams"; do
  # shellcheck disable=SC2086
  out=$("$bin" --streams 8 --calls 40 --threads 2 $mode 2>/dev/null) || fail "run $mode: $out"
  echo "$out" | grep -q "calls 40 threads 2 failed 0" || fail "run $mode: $out"
done
echo PASS
