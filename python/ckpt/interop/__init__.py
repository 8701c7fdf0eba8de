"""Interop between ckpt checkpoints and the formats people already have (issue 15).

- `dcp`: PyTorch Distributed Checkpoint (FileSystemWriter's `.metadata` + `__<rank>_<i>.distcp`)
  and Megatron-core `torch_dist` (DCP + `metadata.json` + `common.pt`) import and export;
  `python -m interop.dcp --help` with python/ckpt on PYTHONPATH.
- `dcp_metadata`: reading DCP's pickled metadata without executing code from the file.

ckpt checkpoints are written and read through `_storage`, a binding of storage/'s own writer
and reader (built by Bazel: //python/ckpt/interop:_storage.so).
"""
