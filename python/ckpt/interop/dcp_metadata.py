"""Reading a DCP checkpoint's `.metadata` without executing code from the file.

`.metadata` is a pickle of torch.distributed.checkpoint.metadata.Metadata. Unpickling runs
whatever callables the file names, so this reader admits only the globals a DCP metadata
needs (the metadata dataclasses, torch.Size, torch dtypes, the layout and memory-format
encodings, PosixPath for the checkpoint id); any other global is refused, naming the file and
the global, before anything is called. `builtins.getattr` (how Python pickles enum members)
is replaced by a lookup that admits only members of DCP's memory-format enum, so no attribute
of anything else can be reached. The unpickled result is then checked for shape and types
(`check_metadata`) before any field is used: a missing field, a chunk listed twice, more chunks
than storage items, and planner data nested deeper than MAX_NESTING levels (or expanding, through
shared references, to more than MAX_PLANNER_DATA_JSON bytes of JSON) are refused naming the file.
"""

import io
import json
import pathlib
import pickle
import sys

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
# Deepest planner data accepted (DCP's default planner writes {key: (path, ...)}: 3 levels).
MAX_NESTING = 64
# Most JSON the planner data may expand to (it is kept as user metadata).
MAX_PLANNER_DATA_JSON = 256 << 20


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
    except RecursionError:  # hashing or comparing keys nested that deep
        raise MetadataError(f"{path}: nested deeper than Python's recursion limit "
                            f"({sys.getrecursionlimit()} levels)") from None
    except Exception as e:  # any malformed pickle: truncated, bad opcode, bad state
        raise MetadataError(f"{path}: not a DCP metadata pickle: {type(e).__name__}: {e}") \
            from None
    check_metadata(metadata, path)
    return metadata


def _expect(condition, path, what):
    if not condition:
        raise MetadataError(f"{path}: {what}")


def _field(obj, name, path, what):
    """obj.name; a MetadataError naming the file, `what` and the field when it is missing."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise MetadataError(f"{path}: {what} has no field {name!r}") from None


def _show(value, limit=200):
    """repr(value) for a message: shortened, and never raising (a damaged object's repr can)."""
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 (a dataclass missing fields, a deep structure)
        text = f"<{type(value).__name__}: {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _is_size(value):
    return isinstance(value, torch.Size) and all(isinstance(v, int) and v >= 0 for v in value)


def _children(value):
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if type(value) in _ALLOWED.values() and hasattr(value, "__dict__"):
        return list(vars(value).values())
    return []


def _json_size(value):
    try:
        return len(json.dumps(value)) if isinstance(value, str) else 32
    except (TypeError, ValueError):
        return 32


def check_nesting(value, path, what, max_json=MAX_PLANNER_DATA_JSON):
    """Walks `value` without recursion: refuses nesting deeper than MAX_NESTING levels, a
    reference cycle, and shared references that would make its JSON longer than `max_json`
    bytes (each shared object is measured once, so a small pickle cannot make this slow)."""
    done, on_path, end = {}, set(), object()
    stack = [[value, iter(_children(value)), 1, _json_size(value)]]
    on_path.add(id(value))
    while stack:
        frame = stack[-1]
        child = next(frame[1], end)
        if child is end:
            stack.pop()
            on_path.discard(id(frame[0]))
            done[id(frame[0])] = (frame[2], frame[3])
            if stack:
                stack[-1][2] = max(stack[-1][2], frame[2] + 1)
                stack[-1][3] = min(max_json + 1, stack[-1][3] + frame[3] + 2)
            continue
        if id(child) in on_path:
            raise MetadataError(f"{path}: {what} contains itself (a reference cycle)")
        if id(child) in done:
            height, size = done[id(child)]
            frame[2] = max(frame[2], height + 1)
            frame[3] = min(max_json + 1, frame[3] + size + 2)
            continue
        if len(stack) >= MAX_NESTING:
            raise MetadataError(f"{path}: {what} is nested deeper than {MAX_NESTING} levels")
        on_path.add(id(child))
        stack.append([child, iter(_children(child)), 1, _json_size(child)])
    if done[id(value)][1] > max_json:
        raise MetadataError(f"{path}: {what} expands to more than {max_json} bytes of JSON "
                            "(through shared references)")


def _check_entry(fqn, entry, path):
    """A TensorStorageMetadata's fields; returns its chunks."""
    what = f"tensor {fqn!r}"
    properties = _field(entry, "properties", path, what)
    _expect(isinstance(properties, dcp_metadata.TensorProperties) and
            isinstance(_field(properties, "dtype", path, f"{what}'s properties"), torch.dtype),
            path, f"{what} has no dtype")
    size = _field(entry, "size", path, what)
    _expect(_is_size(size), path, f"{what} has a bad size {_show(size)}")
    chunks = _field(entry, "chunks", path, what)
    _expect(isinstance(chunks, list), path, f"{what} chunks is not a list")
    seen = set()
    for chunk in chunks:
        _expect(isinstance(chunk, dcp_metadata.ChunkStorageMetadata), path,
                f"{what} has a chunk that is not ChunkStorageMetadata: {_show(chunk)}")
        offsets = _field(chunk, "offsets", path, f"a chunk of {what}")
        sizes = _field(chunk, "sizes", path, f"a chunk of {what}")
        _expect(_is_size(offsets) and _is_size(sizes) and
                len(offsets) == len(size) == len(sizes) and
                all(o + s <= d for o, s, d in zip(offsets, sizes, size)),
                path, f"{what} has a chunk outside its size {list(size)}: {_show(chunk)}")
        _expect(tuple(offsets) not in seen, path,
                f"{what} lists its chunk at offsets {list(offsets)} twice")
        seen.add(tuple(offsets))
    return chunks


def check_metadata(md, path):
    """Refuses a Metadata whose fields are not what DCP writes (types, missing fields, ranks of
    chunks, chunks listed twice, planner data nested too deeply)."""
    _expect(isinstance(md, dcp_metadata.Metadata), path, "does not hold a DCP Metadata")
    state = _field(md, "state_dict_metadata", path, "the Metadata")
    storage = _field(md, "storage_data", path, "the Metadata")
    _expect(isinstance(state, dict), path, "state_dict_metadata is not a dict")
    _expect(isinstance(storage, dict), path, "storage_data is not a dict")
    version = _field(md, "version", path, "the Metadata")
    _expect(version is None or isinstance(version, str), path,
            f"version is not a string: {_show(version)}")
    check_nesting(_field(md, "planner_data", path, "the Metadata"), path, "planner_data")
    # Every chunk needs a storage item of its own: more chunks than items (a long chunk list
    # shared by many entries) is refused before any is looked at.
    total = 0
    for fqn, entry in state.items():
        _expect(isinstance(fqn, str), path, f"key {_show(fqn)} is not a string")
        try:
            fqn.encode("utf-8")
        except UnicodeEncodeError:
            raise MetadataError(f"{path}: key {fqn!r} is not valid UTF-8 text") from None
        if isinstance(entry, dcp_metadata.BytesStorageMetadata):
            total += 1
            continue
        _expect(isinstance(entry, dcp_metadata.TensorStorageMetadata), path,
                f"entry {fqn!r} is neither tensor nor bytes metadata")
        chunks = _field(entry, "chunks", path, f"tensor {fqn!r}")
        total += len(chunks) if isinstance(chunks, list) else 0
        _expect(total <= len(storage), path, f"lists more chunks than storage_data has items "
                f"({len(storage)}); at tensor {fqn!r}")
    for fqn, entry in state.items():
        if isinstance(entry, dcp_metadata.TensorStorageMetadata):
            _check_entry(fqn, entry, path)
    for index, info in storage.items():
        _expect(isinstance(index, dcp_metadata.MetadataIndex) and
                isinstance(_field(index, "fqn", path, "a storage_data key"), str),
                path, f"storage_data key {_show(index)} is not a MetadataIndex")
        what = f"storage_data of {index.fqn!r}"
        _expect(isinstance(info, dcp_filesystem._StorageInfo), path,
                f"{what} is not a file range: {_show(info)}")
        relative_path, offset, length = (_field(info, n, path, what)
                                         for n in ("relative_path", "offset", "length"))
        _expect(isinstance(relative_path, str) and isinstance(offset, int) and
                isinstance(length, int) and offset >= 0 and length >= 0,
                path, f"{what} is not a file range: {_show(info)}")
