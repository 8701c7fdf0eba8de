#!/usr/bin/env bash
# Formats (or with --check, verifies) every C++ file with the repo's .clang-format (Google style).
#   tools/format.sh                       rewrite every tracked .h/.cc in place
#   tools/format.sh --check               fail (listing the files) when any file is not formatted
#   tools/format.sh --check --junit FILE  the same, and record the result as one JUnit test case
#                                         in FILE (tools/test.sh counts it in its summary line)
# Pinned to clang-format 14 (the machine's, Debian bookworm): another major version formats
# some constructs differently, so it is refused rather than trusted. CLANG_FORMAT overrides the
# binary (it must still be version 14).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly PINNED_MAJOR=14
check=0
junit=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) check=1; shift ;;
    --junit)
      [[ $# -ge 2 ]] || { echo "format.sh: --junit needs a file" >&2; exit 2; }
      junit="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "format.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# Writes the JUnit file (when asked) for a check named "clang_format" with the given output.
write_junit() {
  local failed="$1" output="$2"
  [[ -n "$junit" ]] || return 0
  mkdir -p "$(dirname "$junit")"
  FAILED="$failed" OUTPUT="$output" python3 - "$junit" <<'EOF'
import os, sys
from xml.sax.saxutils import escape
body = ('<failure message="clang_format failed">%s</failure>' % escape(os.environ["OUTPUT"])
        if os.environ["FAILED"] == "1" else "")
with open(sys.argv[1], "w") as fh:
    fh.write('<?xml version="1.0"?>\n<testsuites><testsuite name="format"><testcase '
             'classname="format" name="clang_format">%s</testcase></testsuite></testsuites>\n'
             % body)
EOF
}

if [[ -z "${CLANG_FORMAT:-}" ]]; then
  CLANG_FORMAT=clang-format-$PINNED_MAJOR
  command -v "$CLANG_FORMAT" >/dev/null 2>&1 || CLANG_FORMAT=clang-format
fi
if ! version_line=$("$CLANG_FORMAT" --version 2>/dev/null); then
  msg="format.sh: clang-format $PINNED_MAJOR not found (install it with tools/install_deps.sh)"
  echo "$msg" >&2; write_junit 1 "$msg"; exit 1
fi
major=$(sed -n 's/.*clang-format version \([0-9]*\)\..*/\1/p' <<<"$version_line")
if [[ "$major" != "$PINNED_MAJOR" ]]; then
  msg="format.sh: found '$version_line' ($CLANG_FORMAT), but the tree is formatted with"
  msg+=" clang-format $PINNED_MAJOR; install clang-format-$PINNED_MAJOR or point CLANG_FORMAT at it"
  echo "$msg" >&2; write_junit 1 "$msg"; exit 1
fi

mapfile -t files < <(git ls-files '*.h' '*.cc')
if [[ $check == 0 ]]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
if output=$("$CLANG_FORMAT" --dry-run --Werror "${files[@]}" 2>&1); then
  echo "format: ${#files[@]} files clean ($version_line)"
  write_junit 0 ""
  exit 0
fi
mapfile -t bad < <(sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error:.*/\1/p' <<<"$output" | sort -u)
summary="format: ${#bad[@]} of ${#files[@]} files not formatted (run tools/format.sh): ${bad[*]}"
echo "$output" | head -60
echo "$summary"
write_junit 1 "$summary"$'\n'"$output"
exit 1
