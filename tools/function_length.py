#!/usr/bin/env python3
"""Lists C++ functions longer than a limit (default 80 lines) outside tests and generated code.

The tree is clang-formatted (Google style, namespace bodies not indented), so a function defined
at namespace scope has its signature start at column 0 and its body end at the first later line
that is exactly "}". Lambdas and functions inside class bodies count towards their enclosing
function.
Usage:
  tools/function_length.py [--limit N]          list every long function
  tools/function_length.py ci [--junit FILE]    also fail on a long function not in ALLOWED
"""
import argparse
import os
import re
import subprocess
import sys
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# "path:Function" -> why it stays long. Keep this short; each entry is a note the issue asks for.
ALLOWED = {}

SKIP = re.compile(r"(_test|_fuzz|_benchmark|_bench)\.cc$|^tests/|^third_party/|testdata/")
NOT_A_FUNCTION = re.compile(
    r"^(namespace|class|struct|enum|union|extern|using|typedef|static_assert|#|//|/\*|\}|"
    r"template\s*<[^>]*>\s*(class|struct)\b)")
NAME = re.compile(r"([A-Za-z_~][A-Za-z_0-9:~<>,]*)\s*\(")


def tracked_sources(root=ROOT):
    out = subprocess.run(["git", "ls-files", "*.cc"], cwd=root, capture_output=True, text=True,
                         check=True).stdout.split()
    return [p for p in out if not SKIP.search(p)]


def long_functions(path, limit, root=ROOT):
    """(path, first line, name, length) of each function of `path` over `limit` lines."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    found = []
    start = None  # index of the column-0 line that may begin a signature
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace():
            start = None if NOT_A_FUNCTION.match(line) else i
        if start is not None and line.rstrip().endswith("{"):
            head = " ".join(l.strip() for l in lines[start:i + 1])
            before_paren = head.split("(")[0]
            if "(" in head and "=" not in before_paren:
                end = i + 1
                while end < len(lines) and lines[end] != "}":
                    end += 1
                length = end - start + 1
                if length > limit:
                    m = NAME.search(head)
                    found.append((path, start + 1, m.group(1) if m else before_paren, length))
                i = end
            start = None
        elif line.rstrip().endswith((";", "}")):
            start = None
        i += 1
    return found


def main(argv=None, allowed=None):
    allowed = ALLOWED if allowed is None else allowed
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="list", choices=["list", "ci"])
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--junit")
    parser.add_argument("--root", default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    found = [f for p in tracked_sources(args.root) for f in long_functions(p, args.limit, args.root)]
    bad = [f for f in found if f"{f[0]}:{f[2]}" not in allowed]
    report = []
    for path, line, name, length in found:
        key = f"{path}:{name}"
        note = f"  (kept: {allowed[key]})" if key in allowed else ""
        report.append(f"{path}:{line}: {name} is {length} lines{note}")
    report.append(f"function_length: {len(found)} function(s) over {args.limit} lines, "
                  f"{len(bad)} without a note")
    print("\n".join(report))
    failed = args.mode == "ci" and bool(bad)
    if args.junit:
        body = (f'<failure message="long functions">{escape(chr(10).join(report))}</failure>'
                if failed else "")
        with open(args.junit, "w") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite '
                    f'name="function_length" tests="1" failures="{int(failed)}">'
                    f'<testcase name="no_function_over_{args.limit}_lines">{body}</testcase>'
                    '</testsuite></testsuites>\n')
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
