"""ckpt for PyTorch and NumPy programs (see python/README.md).

Low-level API (mirrors the C++ client):

    client = ckpt.Client()                          # rank, world size, job from the launcher
    state = client.state_dict()
    w = ckpt.empty(1024, 1024, dtype=torch.bfloat16)  # in worker-shared memory: zero copy
    state.add("w", w, ckpt.Box((4096, 1024), (1024 * rank, 0)))
    handle = client.save("/ckpt/step100", state, metadata={"step": "100"})
    ... training continues ...
    handle.wait(timeout=600)                         # durable (committed)
    client.load("/ckpt/step100", state)              # in place

High-level API, a drop-in for torch.distributed.checkpoint: ``ckpt.torch``.
Daemons for one host: ``ckpt.LocalCluster`` / ``python -m ckpt.up``.
"""

import os as _os

# From a source checkout the extension lives under bazel-bin (bazel build //python:ckpt).
_here = _os.path.dirname(_os.path.abspath(__file__))
if not any(_os.path.exists(_os.path.join(_here, n)) for n in ("_ckpt.so",)):
    _bazel_bin = _os.path.join(_here, "..", "..", "bazel-bin", "python", "ckpt")
    if _os.path.exists(_os.path.join(_bazel_bin, "_ckpt.so")):
        __path__.append(_os.path.realpath(_bazel_bin))  # noqa: F821 (package __path__)

from ckpt.errors import *  # noqa: E402,F401,F403
from ckpt.errors import Error  # noqa: E402,F401
from ckpt.layouts import Box, DTensor, Flat, Replicated, Replicate, Shard, resolve  # noqa: E402,F401
from ckpt.memory import empty, empty_like, is_shared  # noqa: E402,F401
from ckpt.client import (  # noqa: E402,F401
    Client, Progress, PublishHandle, Received, SaveHandle, StateDict, read_manifest)
from ckpt.cluster import LocalCluster  # noqa: E402,F401

__version__ = "0.1.0"
