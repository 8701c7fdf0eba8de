"""tools/layering.py on small repositories made by the test: it must fail on an upward include,
an upward BUILD dependency and an impure include in a pure file, pass on a clean tree, and keep
a document's generated table in step."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layering  # noqa: E402
from repo_testing import make_repo  # noqa: E402




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


# Include cycles inside one package (issue 42): modules (foo.h + foo.cc) may not depend on each
# other in a circle, though no file includes itself.
CYCLE = {
    "coordinator/engine.h": "struct Engine {};\n",
    "coordinator/engine.cc": '#include "coordinator/engine.h"\n#include "coordinator/fleet.h"\n',
    "coordinator/fleet.h": "struct Fleet {};\n",
    "coordinator/fleet.cc": '#include "coordinator/fleet.h"\n#include "coordinator/engine.h"\n',
}


def test_an_include_cycle_between_modules_of_a_package_fails_naming_its_includes(tmp_path,
                                                                                 capsys):
    files = dict(CLEAN)
    files.update(CYCLE)
    assert layering.check(make_repo(tmp_path, files), cycle_baseline=[]) == 1
    out = capsys.readouterr().out
    assert ("coordinator/: include cycle between modules coordinator/engine, coordinator/fleet: "
            "coordinator/engine.cc:2 includes coordinator/fleet.h; coordinator/fleet.cc:2 "
            "includes coordinator/engine.h") in out


def test_one_way_includes_and_a_private_internal_header_are_no_cycle(tmp_path, capsys):
    files = dict(CLEAN)
    files.update(CYCLE)
    files["coordinator/fleet.cc"] = '#include "coordinator/fleet.h"\n'
    # foo_internal.h is foo's private part: foo.cc includes it and it includes foo.h.
    files["coordinator/engine_internal.h"] = '#include "coordinator/engine.h"\n'
    files["coordinator/engine.cc"] += '#include "coordinator/engine_internal.h"\n'
    assert layering.check(make_repo(tmp_path, files), cycle_baseline=[]) == 0, \
        capsys.readouterr().out


def test_a_cycle_in_the_baseline_passes_but_may_not_grow_or_outlive_its_cut(tmp_path, capsys):
    files = dict(CLEAN)
    files.update(CYCLE)
    baseline = [["coordinator/engine", "coordinator/fleet"]]
    assert layering.check(make_repo(tmp_path, files), cycle_baseline=baseline) == 0
    # A third module joins the cycle: a new cycle, refused.
    root = str(tmp_path)
    open(os.path.join(root, "coordinator/catalog.h"), "w").write('#include "coordinator/fleet.h"\n')
    with open(os.path.join(root, "coordinator/engine.cc"), "a") as fh:
        fh.write('#include "coordinator/catalog.h"\n')
    capsys.readouterr()
    assert layering.check(root, cycle_baseline=baseline) == 1
    assert ("include cycle between modules coordinator/catalog, coordinator/engine, "
            "coordinator/fleet") in capsys.readouterr().out
    # The cycle is cut: the baseline entry must go, so that the cycle cannot come back.
    with open(os.path.join(root, "coordinator/engine.cc"), "w") as fh:
        fh.write('#include "coordinator/engine.h"\n')
    assert layering.check(root, cycle_baseline=baseline) == 1
    assert ("CYCLE_BASELINE: coordinator/engine, coordinator/fleet is no longer a cycle"
            in capsys.readouterr().out)


def real_package(pkg):
    """The repository's own files of `pkg` (Bazel: the runfiles of //<pkg>:sources)."""
    for base in (os.path.join(os.environ.get("TEST_SRCDIR", ""), "ckpt"),
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
        folder = os.path.join(base, pkg)
        if os.path.isdir(folder) and any(f.endswith(".h") for f in os.listdir(folder)):
            return folder
    pytest.fail(f"no sources of {pkg}/ found (data = //{pkg}:sources)")


def test_a_cycle_introduced_into_a_copy_of_the_real_coordinator_fails(tmp_path, capsys):
    source = real_package("coordinator")
    files = {f"coordinator/{name}": open(os.path.join(source, name), errors="replace").read()
             for name in sorted(os.listdir(source)) if name.endswith((".h", ".cc"))}
    assert "coordinator/job_state.cc" in files and "coordinator/coordinator_service.h" in files
    root = make_repo(tmp_path, files)
    assert layering.check(root) == 0, capsys.readouterr().out  # the copy as it is: no cycle
    # The pure job state machine reaching up into the gRPC service: a cycle.
    with open(os.path.join(root, "coordinator/job_state.cc"), "a") as fh:
        fh.write('#include "coordinator/coordinator_service.h"\n')
    capsys.readouterr()
    assert layering.check(root) == 1
    out = capsys.readouterr().out
    assert "coordinator/: include cycle between modules" in out
    assert "coordinator/coordinator_service" in out and "coordinator/job_state, " in out
    assert "coordinator/job_state.cc:" in out
    assert "includes coordinator/coordinator_service.h" in out


def test_a_benchmark_beside_product_code_fails_and_one_in_tools_bench_passes(tmp_path, capsys):
    files = dict(CLEAN)
    files["tools/bench/plan_benchmark.cc"] = '#include "planner/save_plan.h"\n'
    files["tools/loadgen/loadgen.cc"] = '#include "planner/save_plan.h"\n'
    assert layering.check(make_repo(tmp_path, files), bench_baseline=[]) == 0
    open(os.path.join(str(tmp_path), "planner/plan_benchmark.cc"), "w").write("\n")
    capsys.readouterr()
    assert layering.check(str(tmp_path), bench_baseline=[]) == 1
    assert ("planner/plan_benchmark.cc: a benchmark in a product package (benchmarks live in "
            "tools/bench)") in capsys.readouterr().out
    assert layering.check(str(tmp_path), bench_baseline=["planner/plan_benchmark.cc"]) == 0
