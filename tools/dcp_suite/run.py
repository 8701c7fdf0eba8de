#!/usr/bin/env python3
"""PyTorch's own DCP test suite against ckpt.torch (issue 41).

    .venv/bin/python tools/dcp_suite/run.py fetch            # the installed torch's tests
    .venv/bin/python tools/dcp_suite/run.py run [--tests DIR] [--only test_x.py ...]
                                                [-k EXPR] [--timeout S] [--status FILE]

`fetch` downloads test/distributed/checkpoint/ of the pytorch/pytorch commit the installed
torch was built from (torch.version.git_version) with curl (the GitHub contents API for the
listing, raw.githubusercontent.com for the files) into
~/.cache/ckpt-dcp-suite/<torch version>-<commit[:12]>/, and pip-installs PyTorch's test-only
dependency (expecttest) into ~/.cache/ckpt-dcp-suite/deps/. The files are PyTorch's and stay
in that cache: none is copied into this repository. Without network access, put the directory
there by other means (a checkout of that commit: `git clone --filter=blob:none --sparse`,
`git sparse-checkout set test/distributed/checkpoint`) and pass it with --tests.

`run` starts a ckpt.LocalCluster (4 workers; daemons found as ckpt.LocalCluster finds them),
then runs each test file with pytest twice, in fresh processes:
  1. "dcp": unchanged, against torch.distributed.checkpoint;
  2. "ckpt": only the tests that passed in 1, with tools/dcp_suite/shim/ on PYTHONPATH and
     CKPT_DCP_SUITE_MODE=ckpt, so that in every process (the suite's ranks are spawned
     interpreters) dcp.save / load / async_save / save_state_dict / load_state_dict are
     ckpt.torch's (see shim/sitecustomize.py).
Tests skipped in mode 1 (most need CUDA: skip_if_lt_x_gpu) or failing there are not counted.
It prints a table (test, DCP, ckpt, first line of the ckpt failure) and the count, and with
--status writes the same as Markdown. Exit code 0 when every counted test passes with ckpt.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "ckpt-dcp-suite")
SUITE = "test/distributed/checkpoint"
REPO = "pytorch/pytorch"


# ---- fetch ------------------------------------------------------------------------------------
def torch_identity(python):
    """(version, git commit) of the torch that `python` imports."""
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__); "
                          "print(torch.version.git_version)"],
                         capture_output=True, text=True, timeout=120, check=True)
    version, commit = out.stdout.split()[-2:]
    return version, commit


def default_tests_dir(python):
    version, commit = torch_identity(python)
    return os.path.join(CACHE, f"{version}-{commit[:12]}", SUITE)


def _curl(url, out=None):
    argv = ["curl", "-fsSL", "--max-time", "60", "-H", "User-Agent: ckpt-dcp-suite", url]
    if out is not None:
        argv += ["-o", out]
    done = subprocess.run(argv, capture_output=True, text=out is None, timeout=90)
    if done.returncode != 0:
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode()
        raise RuntimeError(f"curl {url}: exit {done.returncode}: {err.strip()}")
    return done.stdout


def _listing(path, commit):
    """[(relative path, download url)] of every .py file below `path` at `commit`."""
    url = f"https://api.github.com/repos/{REPO}/contents/{path}?ref={commit}"
    files = []
    for entry in json.loads(_curl(url)):
        if entry["type"] == "dir":
            files += _listing(entry["path"], commit)
        elif entry["name"].endswith(".py"):
            files.append((entry["path"], f"https://raw.githubusercontent.com/{REPO}/{commit}/"
                                         f"{entry['path']}"))
    return files


# The suite's files in PyTorch 2.x, tried one by one on raw.githubusercontent.com when the
# listing (api.github.com) cannot be had; a name missing at the commit is skipped.
KNOWN_FILES = [
    "e2e/test_e2e_save_and_load.py", "e2e/test_fine_tuning.py", "e2e/test_fsdp_ep.py",
    "e2e/test_pipeline.py", "fsdp/test_fsdp_dsd.py", "test_2d_fsdp_dt_checkpoint.py",
    "test_async_process_executor.py", "test_checkpoint.py", "test_compatibility.py",
    "test_consolidate_hf_safetensors.py", "test_dedup_tensors.py", "test_dtensor_checkpoint.py",
    "test_dtensor_resharding.py", "test_file_system_checkpoint.py",
    "test_file_system_checkpoint_cpu.py", "test_format_utils.py", "test_fsdp_model_state.py",
    "test_fsdp_optim_state.py", "test_fsdp_tp_checkpoint_conversion.py", "test_fsspec.py",
    "test_hf_safetensor_e2e.py", "test_hf_storage.py", "test_hsdp_checkpoint.py",
    "test_list_stored_state_dict.py", "test_nested_dict.py", "test_pg_transport.py",
    "test_planner.py", "test_save_load_api.py", "test_state_dict.py",
    "test_state_dict_stager.py", "test_state_dict_utils.py", "test_tp_checkpoint.py",
    "test_traverse.py", "test_utils.py",
]


def _known_files(commit):
    return [(f"{SUITE}/{name}", f"https://raw.githubusercontent.com/{REPO}/{commit}/{SUITE}/"
             f"{name}") for name in KNOWN_FILES]


def fetch(args):
    version, commit = torch_identity(args.python)
    dest = os.path.join(CACHE, f"{version}-{commit[:12]}")
    print(f"torch {version} ({commit}): {SUITE} -> {dest}/{SUITE}")
    try:
        try:
            files, listed = _listing(SUITE, commit), True
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"no listing ({e}); trying the known file names")
            files, listed = _known_files(commit), False
        got = 0
        for path, url in files:
            target = os.path.join(dest, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                _curl(url, target)
                got += 1
            except RuntimeError as e:
                if listed or "exit 22" not in str(e):  # curl -f exits 22 on HTTP 404
                    raise
        if not got:
            raise RuntimeError("no file could be downloaded")
        print(f"{got} files")
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        sys.exit(f"fetch failed: {e}\nWithout access to GitHub, check out {REPO} at {commit} "
                 f"elsewhere and copy its {SUITE}/ to {dest}/{SUITE}/ (or pass --tests DIR to "
                 "`run`).")
    deps = os.path.join(CACHE, "deps")
    subprocess.run([args.python, "-m", "pip", "install", "-q", "--target", deps, "expecttest"],
                   check=True, timeout=600)


# ---- run --------------------------------------------------------------------------------------
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Exit|Unimplemented|NotFound|"
                             r"AlreadyExists|InvalidArgument|PermissionDenied|DataLoss|Aborted|"
                             r"FailedPrecondition|Internal|Unavailable))(: .*)?$")


def reason(text):
    """The root cause of a failure: the last exception line of the innermost traceback (for a
    multi-process test, the failing rank's), else the first line."""
    lines = [l for l in (text or "").splitlines() if l.strip()]
    found = [l.strip() for l in lines if _EXCEPTION_LINE.match(l)]
    found = [l for l in found if not l.startswith("RuntimeError: Process ")] or found
    return (found[-1] if found else (lines[0].strip() if lines else ""))[:300]


def parse_junit(path):
    """{node id: (outcome, reason)} of one pytest run."""
    results = {}
    if not os.path.exists(path):
        return results
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("file") or ""
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        node = f"{os.path.basename(file) or case.get('classname', '').split('.')[0]}::" \
               f"{cls}::{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                why = reason((child.get("message") or "") + "\n" + (child.text or ""))
                break
        results[node] = (outcome, why)
    return results


def _env(args, mode):
    env = dict(os.environ)
    paths = [os.path.join(HERE, "shim"), os.path.join(CACHE, "deps"),
             os.path.join(ROOT, "python")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                 else []))
    env["CKPT_DCP_SUITE_MODE"] = mode
    if args.ckpt_so:
        env["CKPT_DCP_SUITE_CKPT_SO"] = os.path.abspath(args.ckpt_so)
    return env


def run_file(args, tests_dir, file, mode, nodes, scratch):
    """Runs one test file (or the given node ids of it) in `mode`; {node: (outcome, why)}."""
    xml = os.path.join(scratch, f"{mode}-{file.replace('/', '_')}.xml")
    targets = [os.path.join(tests_dir, file)] if nodes is None else \
        [os.path.join(tests_dir, os.path.dirname(file), n) for n in nodes]
    argv = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
            "junit_family=xunit1", f"--junitxml={xml}", "--rootdir", tests_dir] + targets
    if args.k:
        argv += ["-k", args.k]
    try:
        done = subprocess.run(argv, cwd=os.path.join(tests_dir, os.path.dirname(file)),
                              env=_env(args, mode), capture_output=True, text=True,
                              timeout=args.timeout)
        results = parse_junit(xml)
        if not results and done.returncode not in (0, 5):
            results = {f"{os.path.basename(file)}::(collection)":
                       ("failed", reason(done.stdout + done.stderr))}
    except subprocess.TimeoutExpired:
        results = parse_junit(xml) or {f"{os.path.basename(file)}::(file)":
                                       ("failed", f"timed out after {args.timeout} s")}
    return {f"{os.path.dirname(file) + '/' if os.path.dirname(file) else ''}{n}": r
            for n, r in results.items()}


def test_files(tests_dir, only):
    files = []
    for base, _, names in os.walk(tests_dir):
        for name in sorted(names):
            if name.startswith("test_") and name.endswith(".py"):
                files.append(os.path.relpath(os.path.join(base, name), tests_dir))
    files.sort()
    return [f for f in files if not only or f in only or os.path.basename(f) in only]


def _import_ckpt(args):
    """ckpt from this checkout (python/), its extension from --ckpt-so when given."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    if args.ckpt_so:
        import importlib.util

        spec = importlib.util.spec_from_file_location("ckpt._ckpt", args.ckpt_so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["ckpt._ckpt"] = module
    import ckpt

    return ckpt


def run(args):
    ckpt = _import_ckpt(args)

    tests_dir = os.path.abspath(args.tests or default_tests_dir(args.python))
    if not os.path.isdir(tests_dir):
        sys.exit(f"{tests_dir}: no test directory; run `{sys.argv[0]} fetch` or pass --tests")
    files = test_files(tests_dir, args.only)
    scratch = tempfile.mkdtemp(prefix="ckpt-dcp-suite-")
    rows = []
    try:
        # The suite's checkpoints go to tempfile.mkdtemp(): TMPDIR points below the cluster's
        # checkpoint root (the coordinator accepts paths under its root only).
        tmp = os.path.join(scratch, "tmp")
        os.makedirs(tmp)
        os.environ["TMPDIR"] = tmp
        with ckpt.LocalCluster(num_workers=args.workers, root=tmp):
            for file in files:
                rows += run_both(args, tests_dir, file, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(args, tests_dir, rows)
    counted = [r for r in rows if r[1] == "passed"]
    return 0 if counted and all(r[2] == "passed" for r in counted) else 1


def run_both(args, tests_dir, file, scratch):
    started = time.monotonic()
    with_dcp = run_file(args, tests_dir, file, "dcp", None, scratch)
    passing = [n.split("/")[-1] for n, (o, _) in with_dcp.items() if o == "passed"]
    with_ckpt = run_file(args, tests_dir, file, "ckpt", passing, scratch) if passing else {}
    rows = []
    for node, (outcome, why) in sorted(with_dcp.items()):
        got, why_ckpt = with_ckpt.get(node, ("-", "")) if outcome == "passed" else ("-", "")
        rows.append((node, outcome, got, why_ckpt if got != "passed" else "",
                     why if outcome == "failed" else ""))
    print(f"{file}: {len(with_dcp)} tests, {len(passing)} pass with DCP, "
          f"{sum(1 for r in rows if r[2] == 'passed')} with ckpt "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return rows


def report(args, tests_dir, rows):
    counted = [r for r in rows if r[1] == "passed"]
    ok = sum(1 for r in counted if r[2] == "passed")
    skipped = sum(1 for r in rows if r[1] == "skipped")
    failing_dcp = sum(1 for r in rows if r[1] == "failed")
    lines = [f"Suite: {tests_dir}",
             f"{ok} of {len(counted)} tests that pass with DCP pass with ckpt.torch "
             f"({skipped} skipped with DCP, e.g. CUDA; {failing_dcp} failing with DCP, not "
             "counted)", "",
             "| test | DCP | ckpt | ckpt failure (first line) |", "| --- | --- | --- | --- |"]
    for node, dcp, got, why, _ in rows:
        if dcp == "passed":
            lines.append(f"| {node} | {dcp} | {got} | {why.replace('|', '/')} |")
    text = "\n".join(lines)
    print(text)
    if args.status:
        with open(args.status, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(("test", "dcp", "ckpt", "ckpt_reason", "dcp_reason"), r))
                       for r in rows], f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"),
                        help="the interpreter the tests run with (default: .venv/bin/python)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the installed torch's DCP tests")
    r = sub.add_parser("run", help="run them against DCP and against ckpt.torch")
    r.add_argument("--tests", help="directory of the test files (default: the fetch cache)")
    r.add_argument("--only", nargs="*", help="test files to run (names or relative paths)")
    r.add_argument("-k", help="pytest -k expression")
    r.add_argument("--timeout", type=int, default=1800, help="seconds per file and mode")
    r.add_argument("--workers", type=int, default=4, help="ckpt workers (the most ranks)")
    r.add_argument("--status", help="also write the table as Markdown here")
    r.add_argument("--json", help="also write every row as JSON here")
    r.add_argument("--ckpt-so", help="ckpt's extension (_ckpt.so) when bazel-bin/ lacks it")
    args = parser.parse_args()
    sys.exit(fetch(args) if args.command == "fetch" else run(args))


if __name__ == "__main__":
    main()
