"""tools/dcp_suite (issue 41): the shim really puts ckpt.torch under torch.distributed.checkpoint
in spawned ranks, and run.py runs a suite directory in both modes against a real ckpt
LocalCluster and reports each test with the root cause of a ckpt failure. The suite here is a
small one written by the test (PyTorch's files are not in the repository)."""

import json
import os
import subprocess
import sys
import textwrap

import torch
import torch.distributed.checkpoint as dcp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "dcp_suite")

_CHILD = """
import sys, torch, multiprocessing as mp

def rank(path, queue):
    import torch.distributed.checkpoint as dcp
    try:
        dcp.load({"a": torch.zeros(3)}, checkpoint_id=path)
        queue.put("loaded")
    except BaseException as e:
        try:
            detail = str(e)
        except BaseException:  # DCP's CheckpointException can fail to print itself
            detail = "?"
        queue.put(f"{type(e).__module__}.{type(e).__name__}: {detail}")

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=rank, args=(sys.argv[1], queue))
    p.start()
    print(queue.get(timeout=120))
    p.join()
"""


def _run_child(tmp_path, mode, path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, CKPT_DCP_SUITE_MODE=mode,
               PYTHONPATH=os.pathsep.join([os.path.join(TOOL, "shim"),
                                           os.path.join(ROOT, "python")]))
    done = subprocess.run([sys.executable, str(script), str(path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_shim_replaces_dcp_load_in_a_spawned_rank_only_in_ckpt_mode(tmp_path):
    """A truncated .metadata: DCP's load raises its own error, ckpt.torch's ckpt.DataLoss; so
    the spawned rank's dcp.load is ckpt.torch.load exactly in ckpt mode."""
    path = tmp_path / "dcp"
    dcp.save({"a": torch.ones(3)}, checkpoint_id=str(path), no_dist=True)
    assert _run_child(tmp_path, "ckpt", path) == "loaded"
    metadata = path / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:20])
    assert _run_child(tmp_path, "ckpt", path).startswith("ckpt.errors.DataLoss: ")
    assert not _run_child(tmp_path, "dcp", path).startswith("ckpt.")


_SUITE = """
import os, tempfile, unittest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner


class MyPlanner(DefaultSavePlanner):
    pass


class Suite(unittest.TestCase):
    def test_round_trip_in_a_new_directory(self):
        path = os.path.join(tempfile.mkdtemp(), "ckpt")
        dcp.save({"a": torch.arange(4)}, checkpoint_id=path, no_dist=True)
        target = {"a": torch.zeros(4, dtype=torch.int64)}
        dcp.load(target, checkpoint_id=path, no_dist=True)
        self.assertTrue(torch.equal(target["a"], torch.arange(4)))

    def test_custom_planner(self):
        path = os.path.join(tempfile.mkdtemp(), "ckpt")
        dcp.save({"a": torch.arange(4)}, checkpoint_id=path, planner=MyPlanner(), no_dist=True)

    def test_fails_with_dcp_too(self):
        self.assertEqual(1, 2)

    @unittest.skip("needs CUDA")
    def test_cuda(self):
        pass
"""


def test_run_reports_each_test_in_both_modes_with_the_ckpt_failure(tmp_path):
    suite = tmp_path / "suite"
    (suite / "sub").mkdir(parents=True)
    (suite / "sub" / "test_tiny.py").write_text(textwrap.dedent(_SUITE))
    status, rows = tmp_path / "status.md", tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, os.path.join(TOOL, "run.py"), "--python", sys.executable, "run",
         "--tests", str(suite), "--workers", "1", "--timeout", "300", "--status", str(status),
         "--json", str(rows)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr  # one counted test fails with ckpt
    got = {r["test"]: r for r in json.loads(rows.read_text())}
    base = "sub/test_tiny.py::Suite::"
    assert set(got) == {base + n for n in ("test_round_trip_in_a_new_directory",
                                            "test_custom_planner", "test_fails_with_dcp_too",
                                            "test_cuda")}
    assert (got[base + "test_round_trip_in_a_new_directory"]["dcp"],
            got[base + "test_round_trip_in_a_new_directory"]["ckpt"]) == ("passed", "passed")
    planner = got[base + "test_custom_planner"]
    assert (planner["dcp"], planner["ckpt"]) == ("passed", "failed")
    assert planner["ckpt_reason"].startswith("ckpt.errors.Unimplemented: ")
    assert "MyPlanner" in planner["ckpt_reason"]
    assert (got[base + "test_fails_with_dcp_too"]["dcp"],
            got[base + "test_fails_with_dcp_too"]["ckpt"]) == ("failed", "-")
    assert (got[base + "test_cuda"]["dcp"], got[base + "test_cuda"]["ckpt"]) == ("skipped", "-")
    assert "1 of 2 tests that pass with DCP pass with ckpt.torch" in status.read_text()
