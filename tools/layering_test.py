"""tools/layering.py on small repositories made by the test: it must fail on an upward include,
an upward BUILD dependency and an impure include in a pure file, pass on a clean tree, and keep
a document's generated table in step."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layering  # noqa: E402


def make_repo(tmp_path, files):
    for path, text in files.items():
        full = tmp_path / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return str(tmp_path)


CLEAN = {
    "sharding/region.h": '#include "common/status_macros.h"\n',
    "planner/save_plan.cc": '#include "sharding/region.h"\n#include "absl/status/status.h"\n',
    "coordinator/service.cc": '#include "planner/save_plan.h"\n#include <grpcpp/grpcpp.h>\n',
    "coordinator/BUILD.bazel": 'load("//tools:x.bzl", "m")\ncc_library(deps = ["//planner:save_plan"])\n',
}


def test_a_clean_tree_passes(tmp_path, capsys):
    assert layering.check(make_repo(tmp_path, CLEAN)) == 0


def test_an_upward_include_fails_naming_the_file_and_line(tmp_path, capsys):
    files = dict(CLEAN)
    files["planner/load_plan.cc"] = '#include "sharding/region.h"\n#include "coordinator/job.h"\n'
    assert layering.check(make_repo(tmp_path, files)) == 1
    out = capsys.readouterr().out
    assert "planner/load_plan.cc:2: planner -> coordinator is not allowed" in out


def test_an_upward_build_dependency_fails(tmp_path, capsys):
    files = dict(CLEAN)
    files["sharding/BUILD.bazel"] = 'cc_library(\n    deps = ["//worker:memory_registry"],\n)\n'
    assert layering.check(make_repo(tmp_path, files)) == 1
    assert "sharding/BUILD.bazel:2: sharding -> worker" in capsys.readouterr().out


def test_a_pure_package_may_not_include_grpc_or_threads(tmp_path, capsys):
    files = dict(CLEAN)
    files["planner/cache.cc"] = "#include <mutex>\n"
    assert layering.check(make_repo(tmp_path, files)) == 1
    assert "planner/cache.cc:1: a pure file includes #include <mutex>" in capsys.readouterr().out


def test_a_target_tagged_pure_is_held_to_the_same_rule(tmp_path, capsys):
    files = dict(CLEAN)
    files["storage/BUILD.bazel"] = ('cc_library(\n    name = "codec",\n    srcs = ["codec.cc"],\n'
                                    '    tags = ["pure"],\n)\n')
    files["storage/codec.cc"] = '#include "spdlog/spdlog.h"\n'
    assert layering.check(make_repo(tmp_path, files)) == 1
    assert "storage/codec.cc:1: a pure file includes" in capsys.readouterr().out


def test_the_documented_table_is_regenerated_and_its_staleness_detected(tmp_path, capsys):
    files = dict(CLEAN)
    files["docs/ARCHITECTURE.md"] = ("# x\n" + layering.BEGIN + "old\n" + layering.END + "tail\n")
    root = make_repo(tmp_path, files)
    assert layering.main(["table", "--root", root, "--check", "docs/ARCHITECTURE.md"]) == 1
    assert layering.main(["table", "--root", root, "--write", "docs/ARCHITECTURE.md"]) == 0
    assert layering.main(["table", "--root", root, "--check", "docs/ARCHITECTURE.md"]) == 0
    text = open(os.path.join(root, "docs/ARCHITECTURE.md")).read()
    assert "| `planner/` | sharding |" in text and text.endswith("tail\n")


def test_grpc_outside_the_shells_fails(tmp_path, capsys):
    files = dict(CLEAN)
    files["planner/BUILD.bazel"] = 'cc_library(\n    deps = ["@system//:grpc"],\n)\n'
    assert layering.check(make_repo(tmp_path, files)) == 1
    assert "planner/BUILD.bazel:2: planner may not use @system//:grpc" in capsys.readouterr().out


def with_visibility(files):
    """CLEAN's BUILD files with their package's generated group as default_visibility."""
    files = dict(files)
    for path in [p for p in files if p.endswith("/BUILD.bazel")]:
        pkg = path.split("/", 1)[0]
        files[path] = f'package(default_visibility = ["//:{pkg}_users"])\n' + files[path]
    files["BUILD.bazel"] = "# root\n"
    return files


def test_package_groups_are_generated_from_layers_and_checked(tmp_path, capsys):
    files = with_visibility(CLEAN)
    files["planner/BUILD.bazel"] = 'package(default_visibility = ["//:planner_users"])\n'
    root = make_repo(tmp_path, files)
    assert layering.main(["visibility", "--root", root, "--check", "BUILD.bazel"]) == 1
    assert layering.main(["visibility", "--root", root, "--write", "BUILD.bazel"]) == 0
    assert layering.main(["visibility", "--root", root, "--check", "BUILD.bazel"]) == 0
    text = open(os.path.join(root, "BUILD.bazel")).read()
    group = text.split('name = "planner_users"', 1)[1].split(")", 1)[0]
    assert '"//coordinator/..."' in group and '"//storage/..."' not in group
    # A package that opens itself to everyone again is caught.
    open(os.path.join(root, "planner/BUILD.bazel"), "w").write(
        'package(default_visibility = ["//visibility:public"])\n')
    capsys.readouterr()
    assert layering.main(["visibility", "--root", root, "--check", "BUILD.bazel"]) == 1
    assert "planner/BUILD.bazel: package(default_visibility" in capsys.readouterr().out


def test_ci_records_a_deliberate_upward_include_as_a_failed_test_case(tmp_path, capsys):
    files = with_visibility(CLEAN)
    files["docs/ARCHITECTURE.md"] = layering.BEGIN + layering.END
    root = make_repo(tmp_path, files)
    layering.main(["visibility", "--root", root, "--write", "BUILD.bazel"])
    layering.main(["table", "--root", root, "--write", "docs/ARCHITECTURE.md"])
    assert layering.main(["ci", "--root", root, "--testlogs", "logs"]) == 0
    results = os.path.join(root, "logs", "tools", "layering_check", "test.xml")
    assert "<failure" not in open(results).read()

    with open(os.path.join(root, "sharding/region.h"), "a") as fh:
        fh.write('#include "coordinator/job_state.h"\n')
    assert layering.main(["ci", "--root", root, "--testlogs", "logs"]) == 1
    xml = open(results).read()
    assert "<failure" in xml and "sharding/region.h:2: sharding -&gt; coordinator" in xml
    # The doc's table now also differs from the code: its own test case fails too.
    table = open(os.path.join(root, "logs", "tools", "architecture_table", "test.xml")).read()
    assert "<failure" in table
