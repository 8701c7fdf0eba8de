"""The wheel //python:wheel builds installs with pip into an empty directory, imports from there
alone, and its bundled daemons save a checkpoint."""

import os
import subprocess
import sys
import zipfile


def test_wheel_installs_and_works_without_the_source_tree(tmp_path):
    wheel = os.environ["CKPT_WHEEL"]
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("ckpt/__init__.py", "ckpt/torch.py", "ckpt/_ckpt.so",
                     "ckpt/bin/ckpt_coordinator", "ckpt/bin/ckpt_worker", "ckpt/bin/ckptctl"):
        assert required in names, required
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                          "--no-compile", "--target", str(target), wheel],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert os.access(target / "ckpt" / "bin" / "ckpt_worker", os.X_OK)
    script = (
        "import ckpt, torch, sys\n"
        f"assert ckpt.__file__.startswith({str(target)!r}), ckpt.__file__\n"
        "assert ckpt._ckpt.__file__.startswith(ckpt.__path__[0])\n"
        f"with ckpt.LocalCluster(num_workers=1, root={str(tmp_path)!r}) as cluster:\n"
        "    with ckpt.Client(job='wheel', rank=0, world_size=1) as c:\n"
        "        s = c.state_dict().add('x', ckpt.empty(3).fill_(2))\n"
        f"        c.save({str(tmp_path / 'saved')!r}, s).wait(60)\n"
        "print('ok', ckpt.cluster.find_binary('ckpt_worker', 'worker'))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CKPT_COORDINATOR_BIN", "CKPT_WORKER_BIN", "RUNFILES_DIR",
                        "TEST_SRCDIR")}
    env["PYTHONPATH"] = str(target)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"ok {target}" in run.stdout, run.stdout
