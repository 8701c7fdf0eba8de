"""tools/dcp_suite's shim: with CKPT_DCP_SUITE_MODE=ckpt, torch.distributed.checkpoint's
entry points are ckpt.torch's in this interpreter and in every process it spawns.

Python imports ``sitecustomize`` at start-up from PYTHONPATH, and PyTorch's distributed tests
start their ranks with the "spawn" start method (fresh interpreters inheriting the
environment), so putting this directory on PYTHONPATH reaches every rank. Nothing is imported
eagerly: a meta-path finder waits for ``torch.distributed.checkpoint`` to be imported and then
replaces, in that package and in state_dict_saver / state_dict_loader:

    save, async_save, save_state_dict   -> ckpt.torch.save, async_save, save_state_dict
    load, load_state_dict                -> ckpt.torch.load, load_state_dict

called with the test's own arguments, unchanged. A name ckpt.torch lacks raises
NotImplementedError naming it (so the table shows it). The only thing added is what torchrun
would give each rank: LOCAL_RANK (the process group rank, when unset), so each rank reaches
its own worker of the cluster tools/dcp_suite/run.py started (CKPT_WORKER_DIR in the
environment). With CKPT_DCP_SUITE_MODE unset or "dcp", nothing is patched.
"""

import importlib.abc
import importlib.machinery
import os
import sys

_PACKAGE = "torch.distributed.checkpoint"
_NAMES = {
    "": ("save", "async_save", "save_state_dict", "load", "load_state_dict"),
    ".state_dict_saver": ("save", "async_save", "save_state_dict"),
    ".state_dict_loader": ("load", "load_state_dict"),
}


def _replacement(name):
    def call(*args, **kwargs):
        import torch.distributed as dist

        import ckpt.torch

        if "LOCAL_RANK" not in os.environ and dist.is_available() and dist.is_initialized():
            os.environ["LOCAL_RANK"] = str(dist.get_rank())
        target = getattr(ckpt.torch, name, None)
        if target is None:
            raise NotImplementedError(f"ckpt.torch has no {name} (torch.distributed.checkpoint."
                                      f"{name} was called)")
        return target(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"ckpt.torch.{name} (tools/dcp_suite shim)"
    return call


def _patch():
    for suffix, names in _NAMES.items():
        module = sys.modules.get(_PACKAGE + suffix)
        if module is None:
            continue
        for name in names:
            setattr(module, name, _replacement(name))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches right after torch.distributed.checkpoint's __init__ ran (it imports the saver
    and the loader), before the test module binds any of its names."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch()

        spec.loader.exec_module = exec_module
        return spec


def _preload_extension(path):
    """ckpt's extension from an explicit path (run.py --ckpt-so: a Bazel output other than
    the one bazel-bin/ points at now)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ckpt._ckpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["ckpt._ckpt"] = module


if os.environ.get("CKPT_DCP_SUITE_CKPT_SO"):
    _preload_extension(os.environ["CKPT_DCP_SUITE_CKPT_SO"])
if os.environ.get("CKPT_DCP_SUITE_MODE") == "ckpt":
    if _PACKAGE in sys.modules:
        _patch()
    else:
        sys.meta_path.insert(0, _AfterImport())
