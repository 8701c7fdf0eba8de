#!/bin/bash
# repeat_save_wire_benchmark: --help, refused arguments (exit 2), and a tiny run whose every call
# is answered and every stream's item read, in each of its modes.
set -u
bin="$TEST_SRCDIR/$TEST_WORKSPACE/tools/bench/repeat_save_wire_benchmark"
fail() { echo "FAIL: $*"; exit 1; }
"$bin" --help | grep -q "^usage: repeat_save_wire_benchmark" || fail "--help"
for bad in "--bogus 1" "--workers" "--workers 0" "--window -5" "--channels x" "--workers 4 extra" \
  "--answer-joins" "--also-watch" "--pace-by-answers" "--joins-on-streams --pace-by-answers"; do
  # shellcheck disable=SC2086
  "$bin" $bad > /dev/null 2>&1
  [ $? -eq 2 ] || fail "'$bad' was not refused with exit 2"
done
out=$("$bin" --workers 24 --ranks-per-worker 3 --channels 4 --window 5 2>&1) || fail "run: $out"
echo "$out" | grep -q "failed_calls 0 dispatched 1" || fail "run: $out"
echo "$out" | grep -Eq "^gather seconds [0-9.]+ client_cpu_s" || fail "no gather line: $out"
echo "$out" | grep -Eq "^dispatch seconds [0-9.]+ client_cpu_s" || fail "no dispatch line: $out"
echo "$out" | grep -Eq "^grpc /.*/libgrpc\.so" || fail "no grpc library line: $out"
for mode in "--joins-on-streams" "--joins-on-streams --answer-joins --also-watch" \
  "--joins-on-streams --answer-joins --pace-by-answers"; do
  # shellcheck disable=SC2086
  out=$("$bin" --workers 24 --ranks-per-worker 3 --channels 4 --window 5 $mode 2>&1) ||
    fail "run $mode: $out"
  echo "$out" | grep -q " done 1$" || fail "run $mode: $out"
  echo "$out" | grep -Eq "^joins_and_dispatch seconds [0-9.]+ client_cpu_s" || fail "$mode: $out"
done
echo PASS
