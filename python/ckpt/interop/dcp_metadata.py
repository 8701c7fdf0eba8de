"""Reading a DCP checkpoint's `.metadata` without executing code from the file.

`.metadata` is a pickle of torch.distributed.checkpoint.metadata.Metadata. Unpickling runs
whatever callables the file names, so this reader admits only the globals a DCP metadata
needs (the metadata dataclasses, torch.Size, torch dtypes, the layout and memory-format
encodings, PosixPath for the checkpoint id); any other global is refused, naming the file and
the global, before anything is called. `builtins.getattr` (how Python pickles enum members)
is replaced by a lookup that admits only members of DCP's memory-format enum, so no attribute
of anything else can be reached. The unpickled result is then checked for shape and types
(`check_metadata`) before any field is used.
"""

import io
import pathlib
import pickle

import torch
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

# What a DCP (and Megatron torch_dist) .metadata may name.
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                 "_MEM_FORMAT_ENCODING")
}
_ALLOWED.update({
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp_filesystem._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
})

# Largest .metadata read (a 1M-chunk checkpoint's is a few hundred MB).
MAX_METADATA_BYTES = 4 << 30


class MetadataError(ValueError):
    """A .metadata that is refused; the message names the file."""


def _enum_member(cls, name):
    """Stands in for builtins.getattr: only (DCP memory-format enum, member name)."""
    if cls is dcp_metadata._MEM_FORMAT_ENCODING and isinstance(name, str) \
            and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not a DCP enum member")


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data, path):
        super().__init__(io.BytesIO(data))
        self._path = path

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        raise MetadataError(f"{self._path}: refusing to unpickle {module}.{name}: not one of "
                            "the DCP metadata classes (the file may run code when loaded)")

    def persistent_load(self, pid):
        raise MetadataError(f"{self._path}: persistent ids are not part of DCP metadata")


def load_metadata(path):
    """The checked Metadata of the DCP checkpoint file `path` (a `.metadata`)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_METADATA_BYTES + 1)
    except OSError as e:
        raise MetadataError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_METADATA_BYTES:
        raise MetadataError(f"{path}: larger than {MAX_METADATA_BYTES} bytes")
    try:
        metadata = _RestrictedUnpickler(data, path).load()
    except MetadataError:
        raise
    except Exception as e:  # any malformed pickle: truncated, bad opcode, bad state
        raise MetadataError(f"{path}: not a DCP metadata pickle: {type(e).__name__}: {e}") \
            from None
    check_metadata(metadata, path)
    return metadata


def _expect(condition, path, what):
    if not condition:
        raise MetadataError(f"{path}: {what}")


def _is_size(value):
    return isinstance(value, torch.Size) and all(isinstance(v, int) and v >= 0 for v in value)


def check_metadata(md, path):
    """Refuses a Metadata whose fields are not what DCP writes (types, ranks of chunks)."""
    _expect(isinstance(md, dcp_metadata.Metadata), path, "does not hold a DCP Metadata")
    _expect(isinstance(md.state_dict_metadata, dict), path, "state_dict_metadata is not a dict")
    _expect(isinstance(md.storage_data, dict), path, "storage_data is not a dict")
    for fqn, entry in md.state_dict_metadata.items():
        _expect(isinstance(fqn, str), path, f"key {fqn!r} is not a string")
        if isinstance(entry, dcp_metadata.BytesStorageMetadata):
            continue
        _expect(isinstance(entry, dcp_metadata.TensorStorageMetadata), path,
                f"entry {fqn!r} is neither tensor nor bytes metadata")
        _expect(isinstance(entry.properties, dcp_metadata.TensorProperties) and
                isinstance(entry.properties.dtype, torch.dtype), path,
                f"tensor {fqn!r} has no dtype")
        _expect(_is_size(entry.size), path, f"tensor {fqn!r} has a bad size {entry.size!r}")
        _expect(isinstance(entry.chunks, list), path, f"tensor {fqn!r} chunks is not a list")
        for chunk in entry.chunks:
            _expect(isinstance(chunk, dcp_metadata.ChunkStorageMetadata) and
                    _is_size(chunk.offsets) and _is_size(chunk.sizes) and
                    len(chunk.offsets) == len(entry.size) == len(chunk.sizes) and
                    all(o + s <= d for o, s, d in zip(chunk.offsets, chunk.sizes, entry.size)),
                    path, f"tensor {fqn!r} has a chunk outside its size {list(entry.size)}: "
                    f"{chunk!r}")
    for index, info in md.storage_data.items():
        _expect(isinstance(index, dcp_metadata.MetadataIndex) and isinstance(index.fqn, str),
                path, f"storage_data key {index!r} is not a MetadataIndex")
        _expect(isinstance(info, dcp_filesystem._StorageInfo) and
                isinstance(info.relative_path, str) and isinstance(info.offset, int) and
                isinstance(info.length, int) and info.offset >= 0 and info.length >= 0,
                path, f"storage_data of {index.fqn!r} is not a file range: {info!r}")
