"""tools/doc_names.py on small repositories made by the test: a doc naming only what the code
has passes; a made-up function, method, path, flag or Bazel target fails naming the doc and
line; a name left only in a comment counts as gone; prose, commands and allowlisted names pass."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_names  # noqa: E402
import repo_testing  # noqa: E402

CODE = {
    "worker/worker_service.h": (
        "// WorkerService: the worker's gRPC shell.\n"
        "class WorkerService {\n public:\n  absl::Status Save(const Request& r);\n};\n"),
    "worker/worker_service.cc": (
        '#include "worker/worker_service.h"\n'
        "ABSL_FLAG(int, tick_ms, 100, \"ms between ticks\");\n"
        "// RunSave was the old name of Save.\n"
        "absl::Status WorkerService::Save(const Request& r) { return RunPlan(r); }\n"),
    "worker/save_executor.h": (
        "struct SaveSnapshot {\n  int buffers = 0;\n};\nabsl::Status RunPlan(const Request& r);\n"),
    "worker/BUILD.bazel": 'cc_library(\n    name = "worker_service",\n)\n',
    "proto/coordinator.proto": "message WorkItem {\n  bytes plan_part = 1;\n}\n",
    "tools/ckptctl/main.cc": 'constexpr char kHelp[] = "--persist-to DIR";\n',
}

CLEAN_DOC = """# Save
Fenced blocks are pictures, not names:
```
 trainer ──► MadeUpInAPicture
```
1. `WorkerService::Save` (`worker/worker_service.cc`, `worker/worker_service.{h,cc}`) calls
   `RunPlan(r)` with `pb::WorkItem.plan_part`; `SaveSnapshot::buffers` holds the bytes.
2. Flags: `--tick_ms`, `--tick-ms`, `ckptctl save --persist-to D`. Target:
   `//worker:worker_service`, `//worker/...`. A file: `coordinator.proto`. The folder `worker/`.
3. Not names: `auto`, `done`, `mem://<name>`, `ckptctl inspect`, `data/*.safetensors`,
   `"flat": {"over": dim}`, `absl::StatusOr`, `R.buffers`.
"""


def make_repo(tmp_path, doc, extra=None):
    files = dict(CODE)
    files["docs/ARCHITECTURE.md"] = doc
    files.update(extra or {})
    return repo_testing.make_repo(tmp_path, files)


def run(tmp_path, doc, capsys, extra=None):
    rc = doc_names.main(["--root", make_repo(tmp_path, doc, extra)])
    return rc, capsys.readouterr().out


def test_a_doc_naming_only_what_the_code_has_passes(tmp_path, capsys):
    rc, out = run(tmp_path, CLEAN_DOC, capsys)
    assert rc == 0, out
    assert "doc_names: 0 name(s) the code lacks" in out


def test_a_made_up_function_fails_naming_the_doc_and_line(tmp_path, capsys):
    rc, out = run(tmp_path, CLEAN_DOC + "4. Then `SetPlanner(kSave, …)` plans.\n", capsys)
    assert rc == 1
    assert "docs/ARCHITECTURE.md:12: `SetPlanner(kSave, …)`: name SetPlanner: SetPlanner " \
        "appears nowhere in the code" in out


def test_a_name_left_only_in_a_comment_counts_as_gone(tmp_path, capsys):
    rc, out = run(tmp_path, CLEAN_DOC + "4. `WorkerService::RunSave` writes.\n", capsys)
    assert rc == 1
    assert "RunSave appears nowhere in the code" in out


def test_a_method_named_on_the_wrong_class_fails(tmp_path, capsys):
    # RunPlan exists, but as a free function, not a member of WorkerService.
    rc, out = run(tmp_path, CLEAN_DOC + "4. `WorkerService::RunPlan` writes.\n", capsys)
    assert rc == 1
    assert "name WorkerService::RunPlan: WorkerService is defined in worker/worker_service.h" in out


def test_a_made_up_field_of_a_proto_message_fails(tmp_path, capsys):
    rc, out = run(tmp_path, CLEAN_DOC + "4. `pb::WorkItem.buffers` carries it.\n", capsys)
    assert rc == 1
    assert "WorkItem is defined in proto/coordinator.proto but none of them names buffers" in out


def test_a_missing_path_flag_target_or_file_fails(tmp_path, capsys):
    doc = CLEAN_DOC + ("4. `worker/save_pipeline.cc`, `worker/gone`, `--no_such_flag`,\n"
                       "   `ckptctl load --no-such-option X`, `//worker:gone_test`, `gone.proto`,\n"
                       "   `worker/worker_service.{h,cc,py}`, `//nowhere:x`.\n")
    rc, out = run(tmp_path, doc, capsys)
    assert rc == 1
    for expected in ["path worker/save_pipeline.cc: no file or folder worker/save_pipeline.cc",
                     "path worker/gone: no file or folder worker/gone",
                     "flag --no_such_flag: no code file spells no_such_flag",
                     "flag --no-such-option: no code file spells no-such-option",
                     "label //worker:gone_test: worker/BUILD.bazel defines no target gone_test",
                     "file gone.proto: no file is named gone.proto",
                     "no file or folder worker/worker_service.py",
                     "label //nowhere:x: no BUILD file for package //nowhere",
                     "doc_names: 8 name(s) the code lacks"]:
        assert expected in out, out


def test_a_span_wrapping_over_two_lines_is_checked_from_its_first_line(tmp_path, capsys):
    rc, out = run(tmp_path, CLEAN_DOC + "4. Run `ckptctl save\n   --no-such-flag J` now.\n", capsys)
    assert rc == 1
    assert "docs/ARCHITECTURE.md:12: `ckptctl save --no-such-flag J`: flag --no-such-flag" in out


def test_an_allowlisted_name_passes(tmp_path, capsys):
    allow = {doc_names.ALLOWLIST: "# history\nworker/gpu.h  # became device/\n"}
    rc, out = run(tmp_path, CLEAN_DOC + "4. `worker/gpu.h` held CUDA once.\n", capsys, allow)
    assert rc == 0, out


def test_the_path_docs_are_checked_too(tmp_path, capsys):
    extra = {"docs/paths/load.md": "# Load\n`WorkerService::RunLoad` reads.\n"}
    rc, out = run(tmp_path, CLEAN_DOC, capsys, extra)
    assert rc == 1
    assert "docs/paths/load.md:2: `WorkerService::RunLoad`" in out


def test_ci_writes_one_junit_case_that_fails_with_the_names(tmp_path, capsys):
    root = make_repo(tmp_path, CLEAN_DOC + "4. `SetFinalizer` commits.\n")
    junit = os.path.join(root, "logs", "test.xml")
    assert doc_names.main(["ci", "--junit", junit, "--root", root]) == 1
    xml = open(junit).read()
    assert '<testcase classname="doc_names" name="doc_names"><failure' in xml
    assert "SetFinalizer" in xml


def test_ci_writes_a_passing_case_on_a_clean_doc(tmp_path, capsys):
    root = make_repo(tmp_path, CLEAN_DOC)
    junit = os.path.join(root, "logs", "test.xml")
    assert doc_names.main(["ci", "--junit", junit, "--root", root]) == 0
    assert "<failure" not in open(junit).read()
