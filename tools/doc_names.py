#!/usr/bin/env python3
"""Fails when a backticked code name in the design docs names nothing in the code.

    tools/doc_names.py                   # docs/ARCHITECTURE.md, docs/paths/*.md, tests/README.md
    tools/doc_names.py --list            # also print every name checked and how it was read
    tools/doc_names.py ci --junit FILE   # the same check, one JUnit test case (tools/test.sh)
    tools/doc_names.py DOC...            # check other Markdown files

Every `inline code span` outside fenced blocks is read as one of:
- a flag (`--tick_ms`, `--persist-to`, also inside a longer span such as `ckptctl save --job J`):
  its name, with either dash or underscore spelling, must appear in some code file;
- a Bazel label (`//tests:transfer_test`, `//planner/...`, `@system//:jemalloc`): the package's
  BUILD file must exist and name the target;
- a repository path (`worker/worker_service.cc`, `coordinator/memory_catalog`,
  `proto/convert.{h,cc}`, `tests/*_oracle_test.py`; the first folder is a top-level folder of the
  repository): the file or folder must exist, a path without extension as a source file
  (.h/.cc/.py/.proto/...) or folder; a bare file name with a code extension (`types.proto`)
  must be the name of some file;
- a code identifier (`RunSave`, `kAllHostTensors`, `OPERATION_RECEIVE`, `send_full_state`,
  `WorkerService::Save`, `pb::WorkItem.plan_part`, `shards.Piece(i)`): every part must be an
  identifier of the code, and in `A::B` or `A.B` where A is a type the code defines, B must be
  written in a file that defines A or as `A::B` / `A.B` somewhere (so a method that moved to
  another class is caught even if its name lives on elsewhere). Leading namespaces (`pb::`,
  `client::`) are dropped; names in external namespaces (`absl::`, `std::`, `grpc::`, `torch.`)
  are not checked.
Plain words (`auto`, `done`: lower case, no underscore), URLs (`mem://<name>`), spans with
placeholders (`<name>`) or shell commands without flags are not code names and are skipped.

"Code" is every tracked or untracked-but-not-ignored file of the repository except Markdown,
this checker, its test and its allowlist. Deliberate non-code names go in
tools/doc_names_allowlist.txt, one per line with a comment saying why; keep it short.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
from xml.sax.saxutils import escape, quoteattr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DOCS = ["docs/ARCHITECTURE.md", "docs/paths/*.md", "tests/README.md"]
ALLOWLIST = "tools/doc_names_allowlist.txt"
# Files that are not "the code": the checker, its test (which holds made-up names) and the list.
NOT_CODE = {"tools/doc_names.py", "tools/doc_names_test.py", ALLOWLIST}
# A bare word with one of these extensions names a file of the repository (`types.proto`).
CODE_EXTENSIONS = ("h", "cc", "cu", "proto", "py", "pyi", "sh", "bzl", "bazel")
SOURCE_SUFFIXES = [".h", ".cc", ".py", ".proto", ".sh", ".bzl", ".cu", ".pyi"]
EXTERNAL_NAMESPACES = {"absl", "std", "grpc", "torch", "nb", "gloo", "spdlog", "google",
                       "megatron", "np", "numpy", "safetensors", "os", "sys"}

IDENT = r"[A-Za-z_~][A-Za-z0-9_]*"
IDENT_EXPR = re.compile(rf"^(?:{IDENT})(?:(?:::|\.){IDENT})*$")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][A-Za-z0-9_-]*)")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
TYPE_DEF = r"\b(?:class|struct|message|enum|union|service|using|namespace)\s+(?:class\s+)?{}\b"


def repo_files(root):
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if os.path.isfile(os.path.join(root, f))]


class Code:
    """What the docs may name: the repository's files, folders, identifiers and text."""

    def __init__(self, root):
        self.root = root
        self.files = repo_files(root)
        self.paths = set(self.files)
        self.dirs = {os.path.dirname(f) for f in self.files}
        for d in list(self.dirs):
            while d:
                d = os.path.dirname(d)
                self.dirs.add(d)
        self.basenames = {os.path.basename(f) for f in self.files}
        self.top = {f.split("/", 1)[0] for f in self.files if "/" in f}
        self.texts = {}
        for f in self.files:
            if f in NOT_CODE or f.endswith(".md") or f.startswith("docs/"):
                continue
            try:
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    self.texts[f] = fh.read()
            except (UnicodeDecodeError, OSError):
                continue  # binary files name nothing
        self.raw_text = "\n".join(self.texts.values())  # flags may be spelled in help text
        self.code_texts = {f: strip_comments(f, t) for f, t in self.texts.items()}
        self.all_text = "\n".join(self.code_texts.values())
        self.words = set(WORD.findall(self.all_text))
        self._defs = {}

    def defining_files(self, name):
        """Files that define `name` as a class, struct, proto message, enum, namespace..."""
        if name not in self._defs:
            pat = re.compile(TYPE_DEF.format(re.escape(name)))
            self._defs[name] = [(f, m.end()) for f, t in self.code_texts.items() if name in t
                                for m in [pat.search(t)] if m]
        return self._defs[name]

    def namespaces(self):
        if not hasattr(self, "_namespaces"):
            self._namespaces = set(re.findall(r"\bnamespace\s+(\w+)", self.all_text)) | {"pb"}
        return self._namespaces


def strip_comments(path, text):
    """The text without comments, so a name that survives only in a comment counts as gone."""
    if path.endswith((".h", ".cc", ".cu", ".proto")):
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        return re.sub(r"(?m)(^|[^:\"])//[^\n]*", r"\1", text)
    if path.endswith((".py", ".sh", ".bzl", ".bazel", ".BUILD")) or \
            os.path.basename(path) == "BUILD":
        return re.sub(r"(?m)(^|\s)#[^\n]*", r"\1", text)
    return text


def expand_braces(s):
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    return [x for alt in m.group(1).split(",")
            for x in expand_braces(s[:m.start()] + alt.strip() + s[m.end():])]


def check_flag(code, name):
    for spelling in {name, name.replace("-", "_"), name.replace("_", "-")}:
        if spelling in code.raw_text:
            return None
    return f"flag --{name}: no code file spells {name}"


def check_label(code, label):
    repo, _, rest = label.partition("//")
    pkg, _, target = rest.partition(":")
    if pkg.endswith("/..."):
        pkg = pkg[:-4]
        return None if pkg in code.dirs else f"label {label}: no folder {pkg}/"
    if repo == "@system":
        build = "third_party/system.BUILD"
    elif repo:
        return None  # other external repositories are not this code
    else:
        build = next((b.lstrip("/") for b in (f"{pkg}/BUILD.bazel", f"{pkg}/BUILD")
                      if b.lstrip("/") in code.paths), None)
    if build is None or build not in code.texts:
        return f"label {label}: no BUILD file for package //{pkg}"
    target = target or os.path.basename(pkg)
    text = code.texts[build]
    if f'"{target}"' in text:
        return None
    # A target a macro derives from its name (ckpt_fuzz_target: name + "_libfuzzer").
    for base in re.findall(r'name\s*=\s*"([^"]+)"', text):
        suffix = target[len(base):]
        macros = [t for f, t in code.code_texts.items() if f.endswith(".bzl")]
        if target.startswith(base + "_") and any(f'name + "{suffix}"' in t for t in macros):
            return None
    return f"label {label}: {build} defines no target {target}"


def check_path(code, path):
    """None when `path` names a file or folder of the repository; else why not."""
    path = path.rstrip("/")
    for p in expand_braces(path):
        if any(c in p for c in "*?["):
            if not glob.glob(os.path.join(code.root, p)):
                return f"path {path}: {p} matches no file"
            continue
        if p in code.paths or p in code.dirs:
            continue
        if any(p + s in code.paths for s in SOURCE_SUFFIXES):
            continue
        return f"path {path}: no file or folder {p}"
    return None


def check_identifier(code, expr):
    parts = re.split(r"::|\.", expr)
    if parts[0] in EXTERNAL_NAMESPACES:
        return None
    if parts[0] == "ckpt" and len(parts) > 1:  # a Python module path: python/ckpt/...
        module = "python/" + "/".join(parts[:-1])
        if not (module in code.dirs or module + ".py" in code.paths or
                "python/" + "/".join(parts) in code.dirs or
                "python/" + "/".join(parts) + ".py" in code.paths):
            if parts[-1] not in code.words:
                return f"name {expr}: no module {module} and no name {parts[-1]}"
        return None
    while len(parts) > 1 and parts[0] in code.namespaces() and parts[0][0].islower():
        parts = parts[1:]
    # A one-letter part is a variable of the prose (`R.flat`: "a piece with region R").
    missing = [p for p in parts if len(p) > 1 and p.lstrip("~") not in code.words]
    if missing:
        return f"name {expr}: {', '.join(missing)} appears nowhere in the code"
    for a, b in zip(parts, parts[1:]):
        if len(a) == 1:
            continue  # a variable of the prose (`R.flat`: "a piece with region R")
        defs = code.defining_files(a)
        if not defs:
            continue
        # B written after A's definition starts, in a file that defines A (a member, a field).
        if any(re.search(rf"\b{re.escape(b)}\b", code.code_texts[f][at:]) for f, at in defs):
            continue
        if f"{a}::{b}" in code.all_text or f"{a}.{b}" in code.all_text:
            continue
        where = ", ".join(sorted(f for f, _ in defs)[:3])
        return (f"name {expr}: {a} is defined in {where} but none of them "
                f"names {b}, and {a}::{b} is written nowhere")
    return None


def is_plain_word(s):
    """Prose (`auto`, `done`) or a placeholder (`J`, `R`), not a name to look up."""
    return re.fullmatch(r"[a-z][a-z0-9]*|[A-Za-z]", s) is not None


def strip_arguments(s):
    """Calls, initializers and subscripts name their callee: `Save(pb::X{a, b})` -> `Save`."""
    while True:
        t = re.sub(r"\([^()]*\)", "", s)
        t = re.sub(r"(?<=\w)\{[^{}]*\}", "", t)
        t = re.sub(r"(?<=\w)\[[^\[\]]*\]", "", t)
        if t == s:
            return s
        s = t


def classify(code, span):
    """(kind, problem or None) pairs for one code span; kind "skip" is not checked. A span of
    several words (a command, an expression) is checked word by word."""
    words = strip_arguments(" ".join(span.split())).split()
    if len(words) <= 1:
        return [classify_word(code, words[0] if words else "", alone=True)]
    results = [classify_word(code, w, alone=False) for w in words]
    return [r for r in results if r[0] != "skip"] or [("skip", None)]


def looks_like_code(word):
    """An identifier no prose or command placeholder is spelled like: `A::B`, `snake_case`,
    `CamelCase`, `kConstant`."""
    return "::" in word or "_" in word or re.search(r"[a-z][A-Z]|[A-Z][a-z]", word) is not None


def classify_word(code, s, alone):
    """(kind, problem or None) for one word of a code span; a word of a longer span (a command,
    an expression) is an identifier only when it looks like code."""
    if "://" in s:
        return ("skip", None)
    if s.startswith("--"):
        name = FLAG.match(s)
        return ("flag", check_flag(code, name.group(1))) if name else ("skip", None)
    s = s.strip("(),;").rstrip(":=")
    if not s or any(c in s for c in "<>\"'$|"):
        return ("skip", None)
    if s.startswith("//") or s.startswith("@") and "//" in s:
        return ("label", check_label(code, s))
    first = s.split("/", 1)[0]
    if "/" in s:
        if first not in code.top:
            return ("skip", None)  # not a path of this repository (data/, /tmp, load/...)
        if ":" in s:  # tests/python:foo_test
            return ("label", check_label(code, "//" + s))
        return ("path", check_path(code, s))
    alts = expand_braces(s)
    if all("." in a and a.rsplit(".", 1)[1] in CODE_EXTENSIONS and
           IDENT_EXPR.match(a.rsplit(".", 1)[0].replace("-", "_")) for a in alts):
        bad = [a for a in alts if a not in code.basenames]
        return ("file", f"file {s}: no file is named {', '.join(bad)}" if bad else None)
    if not IDENT_EXPR.match(s) or is_plain_word(s) or not (alone or looks_like_code(s)):
        return ("skip", None)
    return ("name", check_identifier(code, s))


def code_spans(text):
    """(line number, span text) of every inline code span outside fenced blocks; a span may
    wrap over lines, as Markdown allows."""
    lines = text.split("\n")
    in_fence = False
    for i, line in enumerate(lines):
        fence = line.lstrip().startswith("```")
        if fence or in_fence:
            lines[i] = ""
        if fence:
            in_fence = not in_fence
    kept = "\n".join(lines)
    for paragraph in re.finditer(r"(?:[^\n]+\n?)+", kept):
        for m in CODE_SPAN.finditer(paragraph.group(0)):
            yield kept.count("\n", 0, paragraph.start() + m.start()) + 1, m.group(2)


def load_allowlist(root):
    path = os.path.join(root, ALLOWLIST)
    allowed = set()
    if os.path.exists(path):
        for line in open(path):
            name = line.split("#", 1)[0].strip()
            if name:
                allowed.add(name)
    return allowed


def check_docs(root, docs, listing=False, out=None):
    """Prints one line per name the code lacks ("doc:line: `span`: why"); returns the count."""
    out = out or sys.stdout
    code = Code(root)
    allowed = load_allowlist(root)
    paths = sorted({p for d in docs for p in glob.glob(os.path.join(root, d))})
    problems = checked = 0
    for path in paths:
        rel = os.path.relpath(path, root)
        for no, span in code_spans(open(path, encoding="utf-8").read()):
            if span.strip() in allowed:
                continue
            for kind, problem in classify(code, span):
                checked += kind != "skip"
                shown = " ".join(span.split())
                if listing:
                    print(f"{rel}:{no}: {kind}: `{shown}`", file=out)
                if problem:
                    problems += 1
                    print(f"{rel}:{no}: `{shown}`: {problem}", file=out)
    print(f"doc_names: {problems} name(s) the code lacks, of {checked} checked in "
          f"{len(paths)} docs (allowlist: {ALLOWLIST})", file=out)
    return problems


def write_junit(path, output, failed):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    body = f"<failure message={quoteattr('doc names drifted')}>{escape(output)}</failure>" \
        if failed else ""
    with open(path, "w") as fh:
        fh.write('<?xml version="1.0"?>\n<testsuites><testsuite name="doc_names"><testcase '
                 f'classname="doc_names" name="doc_names">{body}</testcase></testsuite>'
                 "</testsuites>\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("args", nargs="*", help="'ci' and/or Markdown files (default: the design docs)")
    ap.add_argument("--junit", help="ci: write one JUnit test case here")
    ap.add_argument("--list", action="store_true", help="print every span and how it was read")
    ap.add_argument("--root", default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    docs = [a for a in args.args if a != "ci"] or DEFAULT_DOCS
    root = os.path.abspath(args.root)
    if args.junit:
        import io
        buf = io.StringIO()
        problems = check_docs(root, docs, args.list, buf)
        sys.stdout.write(buf.getvalue())
        write_junit(args.junit, buf.getvalue(), problems > 0)
    else:
        problems = check_docs(root, docs, args.list)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
