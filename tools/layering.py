#!/usr/bin/env python3
"""The layering of ckpt's packages, checked and documented from the code itself.

    tools/layering.py check            # exit 1, naming file:line, on any forbidden edge
    tools/layering.py table            # the observed dependency table (markdown)
    tools/layering.py table --check docs/ARCHITECTURE.md   # exit 1 when the doc's table is stale
    tools/layering.py table --write docs/ARCHITECTURE.md   # refresh it

Edges come from two places: `#include "pkg/..."` lines in C++ files and `//pkg...` labels in
BUILD.bazel files. A package is a top-level folder. LAYERS below says which packages each
package may depend on; everything not listed is forbidden, so an upward include (a planner file
including a coordinator header, say) fails the check with the file and line that adds it.

Purity: files of a PURE package, and files of targets tagged "pure" in a BUILD file, may not
include gRPC, spdlog or threading headers (pure cores return absl::Status and leave I/O,
threads and logging to the shells around them).
"""

import argparse
import os
import re
import subprocess
import sys

# package -> packages it may depend on (itself always allowed). Inner layers first.
LAYERS = {
    "common": [],
    "sharding": ["common"],
    "proto": ["common", "sharding"],
    "device": ["common"],
    "planner": ["common", "sharding", "proto"],
    "storage": ["common", "sharding", "proto"],
    # Below exchange: every communicator joins its group through a rendezvous Store, and the
    # data plane's own tests use InMemoryStore (ISSUE12_PLAN had rendezvous above exchange).
    "rendezvous": ["common", "proto"],
    "exchange": ["common", "sharding", "device", "rendezvous"],
    "reshard": ["common", "sharding", "proto", "planner", "storage"],
    "coordinator": ["common", "sharding", "proto", "planner", "storage", "rendezvous",
                    "reshard"],
    "worker": ["common", "sharding", "proto", "device", "planner", "storage", "exchange",
               "rendezvous", "reshard"],
    "client": ["common", "sharding", "proto", "device"],
    "python": ["common", "sharding", "proto", "device", "client"],
    "examples": ["common", "sharding", "proto", "planner", "storage", "client", "reshard"],
    "tools": ["common", "sharding", "proto", "device", "planner", "storage", "exchange",
              "rendezvous", "reshard", "coordinator", "worker", "client", "examples"],
    "tests": ["common", "sharding", "proto", "device", "planner", "storage", "exchange",
              "rendezvous", "reshard", "coordinator", "worker", "client", "examples", "tools",
              "python"],
    "third_party": [],
}

# Packages whose every file is pure.
PURE = {"sharding", "planner"}
IMPURE_INCLUDE = re.compile(
    r'#\s*include\s*[<"](grpcpp/|grpc/|grpc\+\+/|spdlog/|thread>|mutex>|condition_variable>|'
    r'future>|absl/synchronization/)')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
LABEL = re.compile(r'"//([A-Za-z0-9_]+)[/:"]')


def repo_files(root):
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if os.path.exists(os.path.join(root, f))]


def package_of(path):
    return path.split("/", 1)[0] if "/" in path else None


def edges(root, files):
    """Yields (from_pkg, to_pkg, file, line_no, text) for every cross-package reference."""
    for f in files:
        pkg = package_of(f)
        if pkg is None:
            continue
        base = os.path.basename(f)
        is_cpp = f.endswith((".h", ".cc"))
        is_build = base in ("BUILD.bazel", "BUILD") or f.endswith(".bzl")
        if not (is_cpp or is_build):
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                targets = []
                if is_cpp:
                    m = INCLUDE.match(line)
                    if m:
                        targets = [package_of(m.group(1))]
                elif not line.lstrip().startswith("load("):  # Starlark macros are tooling
                    targets = LABEL.findall(line)
                for to in targets:
                    if to and to != pkg and to in LAYERS:
                        yield pkg, to, f, no, line.strip()


def pure_files(root, files):
    """Files that must be pure: everything in PURE packages, plus srcs/hdrs of targets tagged
    "pure" in a BUILD file (found by a light parse of the rule's text)."""
    result = {f for f in files if package_of(f) in PURE and f.endswith((".h", ".cc"))}
    for f in files:
        if os.path.basename(f) != "BUILD.bazel":
            continue
        pkg_dir = os.path.dirname(f)
        text = open(os.path.join(root, f)).read()
        for rule in re.split(r"\n(?=\w+\()", text):
            if not re.search(r'tags\s*=\s*\[[^\]]*"pure"', rule):
                continue
            for name in re.findall(r'"([^":/]+\.(?:h|cc))"', rule):
                result.add(os.path.join(pkg_dir, name))
    return result


def check(root):
    files = repo_files(root)
    problems = []
    for src, dst, f, no, text in edges(root, files):
        allowed = LAYERS.get(src)
        if allowed is None:
            problems.append(f"{f}:{no}: package '{src}' is not in tools/layering.py LAYERS")
        elif dst not in allowed:
            problems.append(f"{f}:{no}: {src} -> {dst} is not allowed ({src} may use: "
                            f"{', '.join(allowed) or 'nothing'}): {text}")
    for f in sorted(pure_files(root, files)):
        if not os.path.exists(os.path.join(root, f)):
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                if IMPURE_INCLUDE.search(line):
                    problems.append(f"{f}:{no}: a pure file includes {line.strip()} (pure cores "
                                    "have no gRPC, logging or threads)")
    for p in problems:
        print(p)
    print(f"layering: {len(problems)} problem(s) in {len(files)} files")
    return 1 if problems else 0


def table(root):
    files = repo_files(root)
    observed = {}
    for src, dst, *_ in edges(root, files):
        observed.setdefault(src, set()).add(dst)
    order = list(LAYERS)
    lines = ["| package | depends on (observed in includes and BUILD labels) | allowed, not used |",
             "| --- | --- | --- |"]
    for pkg in order:
        if not any(package_of(f) == pkg for f in files):
            continue
        used = sorted(observed.get(pkg, ()), key=order.index)
        unused = [p for p in LAYERS[pkg] if p not in observed.get(pkg, ())]
        lines.append(f"| `{pkg}/` | {', '.join(used) or '—'} | {', '.join(unused) or '—'} |")
    return "\n".join(lines) + "\n"


BEGIN = "<!-- layering-table:begin (generated by tools/layering.py table --write) -->\n"
END = "<!-- layering-table:end -->\n"


def replace_block(doc_text, block):
    if BEGIN not in doc_text or END not in doc_text:
        raise ValueError("the document has no layering-table markers")
    head, rest = doc_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + block + END + tail


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["check", "table"])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", metavar="DOC", help="fail when DOC's generated table is stale")
    group.add_argument("--write", metavar="DOC", help="rewrite DOC's generated table")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    if args.command == "check":
        return check(root)
    block = table(root)
    if not args.check and not args.write:
        sys.stdout.write(block)
        return 0
    path = os.path.join(root, args.check or args.write)
    text = open(path).read()
    updated = replace_block(text, block)
    if args.write:
        open(path, "w").write(updated)
        return 0
    if updated != text:
        print(f"{args.check}: the dependency table is stale; run tools/layering.py table "
              f"--write {args.check}")
        return 1
    print(f"{args.check}: dependency table up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
