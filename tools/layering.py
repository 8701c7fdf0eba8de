#!/usr/bin/env python3
"""The layering of ckpt's packages, checked and documented from the code itself.

    tools/layering.py check            # exit 1, naming file:line, on any forbidden edge or
                                       # include cycle inside a package
    tools/layering.py table            # the observed dependency table (markdown)
    tools/layering.py table --check docs/ARCHITECTURE.md   # exit 1 when the doc's table is stale
    tools/layering.py table --write docs/ARCHITECTURE.md   # refresh it
    tools/layering.py visibility [--check|--write BUILD.bazel]  # Bazel package_groups from LAYERS
    tools/layering.py ci --testlogs DIR  # all three checks, one JUnit test.xml each (tools/test.sh)

Edges come from two places: `#include "pkg/..."` lines in C++ files and `//pkg...` labels in
BUILD.bazel files. A package is a top-level folder. LAYERS below says which packages each
package may depend on; everything not listed is forbidden, so an upward include (a planner file
including a coordinator header, say) fails the check with the file and line that adds it.

System libraries: BUILD files of packages outside RESTRICTED_SYSTEM[label] may not name that
label (gRPC and spdlog belong to the shells); third_party/system.BUILD also makes Bazel enforce
it through the generated package_groups.

Visibility: `visibility` generates one package_group per package (`//:<pkg>_users`: the package
and every package LAYERS lets use it) and one per restricted system library into the root
BUILD.bazel; every top-level package's BUILD.bazel sets `default_visibility` to its own group,
so Bazel refuses an upward dependency too. `visibility --check` fails when the block is stale
or a package's default_visibility is not its group.

Benchmarks: a *bench* C++ file outside tools/ fails (BENCH_BASELINE lists those not moved yet).

Cycles: inside one package, modules (foo.h + foo.cc) may not include each other in a circle;
CYCLE_BASELINE lists the cycles that predate the rule (the list only shrinks).

Purity: files of a PURE package, and files of targets tagged "pure" in a BUILD file, may not
include gRPC, spdlog or threading headers (pure cores return absl::Status and leave I/O,
threads and logging to the shells around them).
"""

import argparse
import contextlib
import io
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
    # The bindings: the trainer client, and (python/ckpt/interop) the storage format and the
    # target-layout parser for DCP/Megatron conversion, so no format code is written twice.
    "python": ["common", "sharding", "proto", "device", "client", "planner", "storage"],
    "examples": ["common", "sharding", "proto", "planner", "storage", "client", "reshard"],
    # ckptctl runs python/ckpt/interop's DCP converter (a data dependency, exec'd).
    "tools": ["common", "sharding", "proto", "device", "planner", "storage", "exchange",
              "rendezvous", "reshard", "coordinator", "worker", "client", "python", "examples"],
    "tests": ["common", "sharding", "proto", "device", "planner", "storage", "exchange",
              "rendezvous", "reshard", "coordinator", "worker", "client", "examples", "tools",
              "python"],
    "third_party": [],
}

# External labels only some packages may name (gRPC and spdlog: service shells, daemons, tools).
GRPC_USERS = ["common", "proto", "rendezvous", "coordinator", "worker", "client", "python",
              "examples", "tools", "tests"]
RESTRICTED_SYSTEM = {
    "@system//:grpc": GRPC_USERS,
    "@system//:grpc_reflection": GRPC_USERS,
    "@system//:spdlog": ["common", "rendezvous", "coordinator", "worker", "tools", "tests"],
}
# Packages whose BUILD files keep their own visibility: third_party holds the external
# repositories' BUILD files.
UNGROUPED = {"third_party"}

# Include cycles inside one package are checked between modules: a module is foo.h with foo.cc
# (and foo_internal.{h,cc}, foo's private part), so foo.cc including bar.h while bar.cc includes
# foo.h is a cycle even though no file includes itself. The cycles below existed when the check
# came (issue 42) and are not trivial to cut; `check` allows exactly these modules to stay in a
# cycle, fails on any other cycle (and on a listed one that grew), and says when an entry is no
# longer a cycle so that it is removed: the list only shrinks.
CYCLE_BASELINE = [
    # Client::Publish and Client::Receive are declared in client.h (which includes transfer.h
    # for their option and handle types) and defined in transfer.cc (which includes client.h):
    # one class over two files. Cut by moving the live-transfer options into a header of
    # their own, or the two methods into a class of their own.
    ["client/client", "client/transfer"],
    # checkpoint_writer.cc compresses through piece_compression.h (WriteOptions.compression),
    # whose API takes checkpoint_writer.h's file plan and options types. Cut by moving those
    # types into a header both include.
    ["storage/checkpoint_writer", "storage/piece_compression"],
]

# Benchmarks and load generators live in tools/ (tools/bench, tools/loadgen), not beside the
# product code they measure: a C++ file named *_benchmark* or *bench* elsewhere fails `check`.
# Not moved yet (exchange/ was being changed by another session when the rest moved, issue 42):
BENCH_BASELINE = [
    "exchange/exchange_benchmark.cc",
    "exchange/reshard_bench_plan.cc",
    "exchange/reshard_bench_plan.h",
]
BENCH_FILE = re.compile(r"bench[^/]*\.(h|cc)$")

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


def system_label_problems(root, files):
    """BUILD/.bzl lines of packages naming a restricted system label they may not use."""
    for f in files:
        pkg = package_of(f)
        base = os.path.basename(f)
        if pkg is None or not (base in ("BUILD.bazel", "BUILD") or f.endswith(".bzl")):
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                for label, users in RESTRICTED_SYSTEM.items():
                    if f'"{label}"' in line and pkg not in users:
                        yield (f"{f}:{no}: {pkg} may not use {label} (only {', '.join(users)}): "
                               f"{line.strip()}")


def module_of(path):
    """foo.h, foo.cc, foo_internal.h and foo_internal.cc are one module, "pkg/foo"."""
    stem = re.sub(r"\.(h|cc)$", "", path)
    return stem[:-len("_internal")] if stem.endswith("_internal") else stem


def module_graph(root, files):
    """{module: {included module: (file, line, header) of its first include}} within each
    package."""
    present = set(files)
    graph = {}
    for f in files:
        pkg = package_of(f)
        if pkg not in LAYERS or not f.endswith((".h", ".cc")):
            continue
        src = module_of(f)
        out = graph.setdefault(src, {})
        with open(os.path.join(root, f), errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if m and package_of(m.group(1)) == pkg and m.group(1) in present:
                    dst = module_of(m.group(1))
                    if dst != src:
                        out.setdefault(dst, (f, no, m.group(1)))
    return graph


def strongly_connected(graph):
    """The strongly connected components of more than one module, each sorted (Tarjan,
    iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def cycle_path(graph, component):
    """One cycle through the component's first module, as "file:line includes header" steps."""
    members = set(component)
    start = component[0]
    previous = {start: None}
    queue = [start]
    while queue:  # breadth first, back to start
        v = queue.pop(0)
        for w in sorted(graph.get(v, {})):
            if w == start:
                steps, node = [(v, w)], v
                while previous[node] is not None:
                    steps.append((previous[node], node))
                    node = previous[node]
                return ["{}:{} includes {}".format(*graph[a][b]) for a, b in reversed(steps)]
            if w in members and w not in previous:
                previous[w] = v
                queue.append(w)
    return []


def cycle_problems(root, files, baseline):
    """Include cycles between modules of one package that `baseline` does not list."""
    graph = module_graph(root, files)
    components = strongly_connected(graph)
    allowed = [set(entry) for entry in baseline]
    problems = []
    for component in components:
        if any(set(component) <= entry for entry in allowed):
            continue
        problems.append(f"{package_of(component[0])}/: include cycle between modules "
                        f"{', '.join(component)}: " + "; ".join(cycle_path(graph, component)) +
                        " (modules of one package may not depend on each other in a circle)")
    for entry in baseline:  # (an entry none of whose modules exists is some other tree's)
        if any(m in graph for m in entry) and not any(set(entry) <= set(c) for c in components):
            problems.append(f"tools/layering.py CYCLE_BASELINE: {', '.join(entry)} is no longer "
                            "a cycle; remove the entry so that it cannot come back")
    return problems


def bench_problems(files, baseline):
    """Benchmark sources outside tools/ that `baseline` does not list."""
    return [f"{f}: a benchmark in a product package (benchmarks live in tools/bench)"
            for f in files if BENCH_FILE.search(f) and package_of(f) not in (None, "tools")
            and f not in baseline]


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


def check(root, cycle_baseline=None, bench_baseline=None):
    files = repo_files(root)
    problems = []
    for src, dst, f, no, text in edges(root, files):
        allowed = LAYERS.get(src)
        if allowed is None:
            problems.append(f"{f}:{no}: package '{src}' is not in tools/layering.py LAYERS")
        elif dst not in allowed:
            problems.append(f"{f}:{no}: {src} -> {dst} is not allowed ({src} may use: "
                            f"{', '.join(allowed) or 'nothing'}): {text}")
    problems += list(system_label_problems(root, files))
    problems += cycle_problems(root, files,
                               CYCLE_BASELINE if cycle_baseline is None else cycle_baseline)
    problems += bench_problems(files, BENCH_BASELINE if bench_baseline is None else bench_baseline)
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


VIS_BEGIN = "# layers:begin (generated by tools/layering.py visibility --write BUILD.bazel)\n"
VIS_END = "# layers:end\n"


def group_name(pkg):
    return f"{pkg}_users"


def system_group_name(label):
    return label.rsplit(":", 1)[1] + "_users"


def package_group(name, packages, comment):
    lines = [f"# {comment}", "package_group(", f'    name = "{name}",', "    packages = ["]
    lines += [f'        "//{p}/...",' for p in packages]
    lines += ["    ],", ")", ""]
    return "\n".join(lines) + "\n"


def visibility_block():
    """package_groups: for each package, itself and the packages LAYERS lets use it; for each
    restricted system library, the packages that may name it."""
    out = []
    for pkg in LAYERS:
        if pkg in UNGROUPED:
            continue
        users = [pkg] + [p for p in LAYERS if pkg in LAYERS[p] and p != pkg]
        out.append(package_group(group_name(pkg), users, f"Who may use //{pkg}."))
    for label, users in RESTRICTED_SYSTEM.items():
        out.append(package_group(system_group_name(label), users, f"Who may use {label}."))
    return "".join(out)


DEFAULT_VIS = re.compile(r"package\(\s*default_visibility\s*=\s*\[([^\]]*)\]")


def package_visibility_problems(root):
    """Top-level packages whose BUILD.bazel does not set default_visibility to their group."""
    for pkg in LAYERS:
        path = os.path.join(root, pkg, "BUILD.bazel")
        if pkg in UNGROUPED or not os.path.exists(path):
            continue
        m = DEFAULT_VIS.search(open(path).read())
        want = f'"//:{group_name(pkg)}"'
        if not m or m.group(1).strip().rstrip(",").strip() != want:
            yield (f"{pkg}/BUILD.bazel: package(default_visibility = [{want}]) expected "
                   f"(generated from LAYERS by tools/layering.py visibility)")


def replace_vis_block(text, block):
    if VIS_BEGIN not in text or VIS_END not in text:
        return text.rstrip("\n") + "\n\n" + VIS_BEGIN + block + VIS_END
    head, rest = text.split(VIS_BEGIN, 1)
    _, tail = rest.split(VIS_END, 1)
    return head + VIS_BEGIN + block + VIS_END + tail


def visibility(root, check_path, write_path):
    block = visibility_block()
    if not check_path and not write_path:
        sys.stdout.write(block)
        return 0
    path = os.path.join(root, check_path or write_path)
    text = open(path).read() if os.path.exists(path) else ""
    updated = replace_vis_block(text, block)
    if write_path:
        open(path, "w").write(updated)
        return 0
    problems = list(package_visibility_problems(root))
    if updated != text:
        problems.insert(0, f"{check_path}: the package_groups are stale; run tools/layering.py "
                           f"visibility --write {check_path}")
    for p in problems:
        print(p)
    if not problems:
        print(f"{check_path}: package_groups up to date; every package's default_visibility "
              "is its group")
    return 1 if problems else 0


CI_CHECKS = [
    ("layering_check", ["check"]),
    ("architecture_table", ["table", "--check", "docs/ARCHITECTURE.md"]),
    ("bazel_visibility", ["visibility", "--check", "BUILD.bazel"]),
]


def write_junit(path, name, output, failed):
    from xml.sax.saxutils import escape, quoteattr
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = f"<failure message={quoteattr(name + ' failed')}>{escape(output)}</failure>" if failed \
        else ""
    with open(path, "w") as fh:
        fh.write('<?xml version="1.0"?>\n<testsuites><testsuite name="layering"><testcase '
                 f'classname="layering" name={quoteattr(name)}>{body}</testcase></testsuite>'
                 "</testsuites>\n")


def ci(root, testlogs):
    """Runs CI_CHECKS, prints their output, writes <testlogs>/tools/<name>/test.xml for each
    (one test case, failed when the check fails) for tools/count_tests.py --extra-testlogs."""
    status = 0
    for name, argv in CI_CHECKS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                rc = main(argv + ["--root", root])
            except Exception as e:  # a crash of a check is its failure, not CI's
                print(f"{name}: {type(e).__name__}: {e}")
                rc = 1
        sys.stdout.write(buf.getvalue())
        write_junit(os.path.join(testlogs, "tools", name, "test.xml"), name, buf.getvalue(),
                    rc != 0)
        status |= rc != 0
    return 1 if status else 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["check", "table", "visibility", "ci"])
    ap.add_argument("--testlogs", default="bazel-lint-testlogs",
                    help="ci: where the JUnit test.xml files go (relative to --root)")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", metavar="DOC", help="fail when DOC's generated table is stale")
    group.add_argument("--write", metavar="DOC", help="rewrite DOC's generated table")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    if args.command == "check":
        return check(root)
    if args.command == "ci":
        return ci(root, os.path.join(root, args.testlogs))
    if args.command == "visibility":
        return visibility(root, args.check, args.write)
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
