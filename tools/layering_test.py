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
