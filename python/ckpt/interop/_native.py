"""Finds and imports `_storage` (//python/ckpt/interop:_storage.so).

Looked for, in order: next to this file (Bazel runfiles, or an installed copy), the path in
$CKPT_STORAGE_MODULE, and bazel-bin/python/ckpt/interop/ of the workspace holding this file
(after `bazel build //python/ckpt/interop:_storage.so`).
"""

import importlib.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    yield os.path.join(_HERE, "_storage.so")
    if os.environ.get("CKPT_STORAGE_MODULE"):
        yield os.environ["CKPT_STORAGE_MODULE"]
    workspace = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
    yield os.path.join(workspace, "bazel-bin", "python", "ckpt", "interop", "_storage.so")


def load_storage():
    """The `_storage` extension module, or ImportError saying where it was looked for."""
    tried = []
    for path in _candidates():
        tried.append(path)
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_storage", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError("ckpt's _storage extension is not built; run `bazel build "
                      "//python/ckpt/interop:_storage.so` (looked at " + ", ".join(tried) + ")")


storage = load_storage()
