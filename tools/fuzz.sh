#!/usr/bin/env bash
# Builds every parser fuzz target (tag "fuzz", made by //tools:fuzz.bzl) with clang, libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for a bounded time starting
# from its committed seed corpus. Used by tools/test.sh; also by hand:
#   tools/fuzz.sh                     # every target, CKPT_FUZZ_SECONDS (default 30) each
#   CKPT_FUZZ_SECONDS=600 tools/fuzz.sh //storage:safetensors_header_fuzz_libfuzzer
# The clang build lives in its own Bazel output base (~/.cache/ckpt-bazel-fuzz), so switching
# compilers never invalidates the main gcc build. New inputs libFuzzer finds go to a scratch
# corpus, never into the repository; a crashing input is saved under bazel-fuzz-artifacts/ and
# should be committed to the target's corpus as `regression-<what>` once fixed.
# Writes one JUnit test.xml per target under bazel-fuzz-testlogs/ for tools/count_tests.py and
# exits non-zero when a target did not build or found a crash.
set -uo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${CKPT_FUZZ_SECONDS:-30}
OUTPUT_BASE=${CKPT_FUZZ_OUTPUT_BASE:-$HOME/.cache/ckpt-bazel-fuzz}
BAZEL=(${BAZEL:-bazel} --output_base="$OUTPUT_BASE")
JOBS_FLAGS=()
[[ -n "${CKPT_BAZEL_JOBS:-}" ]] && JOBS_FLAGS=(--jobs="$CKPT_BAZEL_JOBS")
LOGS=bazel-fuzz-testlogs
ARTIFACTS=bazel-fuzz-artifacts
rm -rf "$LOGS" && mkdir -p "$LOGS" "$ARTIFACTS"

if ! command -v clang >/dev/null; then
  echo "fuzz: clang not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi

# The project's top-level packages: `//...` would also walk the bazel-* symlinks of the main
# output base, which this output base does not know as its own.
UNIVERSE=$(git ls-files '*/BUILD.bazel' | cut -d/ -f1 | sort -u | grep -v '^third_party$' |
  sed 's|.*|//&/...|' | paste -sd+ | sed 's/+/ + /g')
# label<TAB>corpus_dir for every fuzz target (or the ones named on the command line).
QUERY="attr(tags, \"fuzz\", $UNIVERSE)"
[[ $# -gt 0 ]] && QUERY="attr(tags, \"fuzz\", set($*))"
mapfile -t ROWS < <("${BAZEL[@]}" query "$QUERY" --output=build 2>/dev/null | python3 -c '
import re, sys
text = sys.stdin.read()
for block in text.split("\n\n"):
    name = re.search(r"^\s*name = \"([^\"]+)\"", block, re.M)
    loc = re.search(r"^# (\S+):\d+:\d+", block, re.M)
    corpus = re.search(r"\"corpus_dir=([^\"]+)\"", block)
    if name and corpus and loc:
        pkg = corpus.group(1).split("/")
        label_pkg = loc.group(1)
        print("%s\t%s" % (name.group(1), corpus.group(1)))
')
if [[ ${#ROWS[@]} -eq 0 ]]; then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi

# Package of a target = the corpus dir's package prefix (the macro records package/corpus_dir).
LABELS=()
declare -A CORPUS PKG
for row in "${ROWS[@]}"; do
  name=${row%%$'\t'*}
  corpus=${row#*$'\t'}
  label=$("${BAZEL[@]}" query "attr(name, '^${name}\$', $UNIVERSE)" 2>/dev/null | head -1)
  LABELS+=("$label")
  CORPUS[$label]=$corpus
  PKG[$label]=${label#//}
  PKG[$label]=${PKG[$label]%%:*}
done

echo "== fuzz: building ${#LABELS[@]} targets with clang (libFuzzer + ASan + UBSan) =="
build_ok=1
build_log=$(mktemp)
# Quiet unless it fails (gold prints a warning per ASan helper symbol).
"${BAZEL[@]}" build --config=fuzz --symlink_prefix=bazel-fuzz- "${JOBS_FLAGS[@]}" \
  "${LABELS[@]}" >"$build_log" 2>&1 || { build_ok=0; grep -v 'Cannot export local symbol' "$build_log" | tail -60; }
rm -f "$build_log"
# The execroot link of the clang output base (bazel-fuzz-<this directory>) holds external/
# packages that the main output base does not own: left here, it breaks `bazel build //...`.
rm -f "bazel-fuzz-$(basename "$PWD")"

write_xml() {  # label, failure message or empty, log file
  local label=$1 message=$2 log=$3 pkg=${PKG[$1]} name=${1##*:}
  mkdir -p "$LOGS/$pkg/$name"
  python3 - "$LOGS/$pkg/$name/test.xml" "$label" "$message" "$log" <<'PY'
import sys
from xml.sax.saxutils import escape, quoteattr
path, label, message, log = sys.argv[1:]
try:
    tail = open(log, errors="replace").read()[-4000:]
except OSError:
    tail = ""
body = ""
if message:
    body = "<failure message=%s>%s</failure>" % (quoteattr(message), escape(tail))
open(path, "w").write(
    '<?xml version="1.0"?>\n<testsuites><testsuite name="fuzz"><testcase classname="fuzz" '
    'name=%s>%s</testcase></testsuite></testsuites>\n' % (quoteattr(label), body))
PY
}

status=0
for label in "${LABELS[@]}"; do
  name=${label##*:}
  bin=bazel-fuzz-bin/${PKG[$label]}/$name
  log=$(mktemp)
  if [[ $build_ok -eq 0 || ! -x $bin ]]; then
    echo "fuzz: $label did not build"
    write_xml "$label" "did not build" /dev/null
    status=1
    continue
  fi
  scratch=$(mktemp -d)
  mkdir -p "$ARTIFACTS/$name"
  # -timeout: one input taking longer is a finding (a hang); -rss_limit_mb: so is a blow-up.
  timeout $((SECONDS_PER_TARGET + 120)) "$bin" -max_total_time="$SECONDS_PER_TARGET" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$ARTIFACTS/$name/" "$scratch" "${CORPUS[$label]}" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  if [[ $rc -eq 0 ]]; then
    echo "fuzz: $label ok (${runs:-?} inputs in ${SECONDS_PER_TARGET}s)"
    write_xml "$label" "" "$log"
  else
    echo "fuzz: $label FAILED (exit $rc); input saved under $ARTIFACTS/$name/"
    tail -30 "$log"
    write_xml "$label" "libFuzzer exit $rc" "$log"
    status=1
  fi
  rm -rf "$scratch" "$log"
done
exit $status
