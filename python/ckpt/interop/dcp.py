"""PyTorch DCP and Megatron torch_dist checkpoints <-> ckpt checkpoints.

    python -m interop.dcp import <dcp-dir> <ckpt> [--overwrite] [--workers N]
                                [--memory-budget SIZE] [--step N]
    python -m interop.dcp export <ckpt> <dcp-dir> [--layout layout.json] [--workers N]
                                [--memory-budget SIZE] [--max-file-size SIZE]

(with python/ckpt on PYTHONPATH and the project's environment, .venv/bin/python; `ckptctl
import --from dcp` and `ckptctl export --to dcp` run exactly this.)

Import reads a directory written by DCP's FileSystemWriter (`.metadata` plus
`__<rank>_<i>.distcp`, each tensor item a torch.save archive): the metadata through the
restricted unpickler of dcp_metadata (no code from the file runs), every item with
torch.load(weights_only=True) from its byte range. Every DCP chunk becomes one ckpt piece of
the same box, so nothing is gathered; non-tensor (bytes) entries are kept verbatim as U8
tensors listed in the manifest's user metadata ("dcp.bytes_entries"), never unpickled. A
Megatron torch_dist directory's metadata.json is kept as user metadata and its common.pt
verbatim as the bytes entry named by "megatron.common_pt" (read with weights_only=True only to
take its "iteration" as the step). The ckpt checkpoint is written by storage/'s own writer
(through _storage) and committed atomically: on any error nothing appears at the destination.
A refused input ends in one line naming the file and what is wrong (exit code 1), never a
traceback: a .metadata naming a class outside DCP's, lacking a field, listing a chunk twice or
more chunks than storage items, or with planner data nested deeper than 64 levels (dcp_metadata);
a metadata.json that is not UTF-8 JSON or is nested deeper than Python's recursion limit; a
missing, truncated or damaged .distcp item.

Export writes a DCP checkpoint that dcp.load accepts under any sharding of the loader: its
chunks are the pieces of `--layout` (main replicas only; flat ranges become boxes), or without
it the stored pieces; each rank's chunks go to `__<rank>_<i>.distcp` files written by
torch.save, and `.metadata` is a pickle of torch's own Metadata classes. A checkpoint imported
from torch_dist gets its metadata.json and common.pt back. The directory is built under a
hidden sibling name and renamed into place when complete.

Memory: at most about --memory-budget (default 1GiB) of item data is held at once, split
evenly over --workers processes (an item larger than a worker's share is held alone; import
holds an item's raw bytes and its loaded tensor together, about twice its size).
"""

import argparse
import io
import json
import multiprocessing
import os
import pickle
import stat
import sys
import uuid
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_md

from . import dcp_metadata
from ._native import storage

DTYPE_NAMES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.uint16: "U16", torch.int32: "I32", torch.uint32: "U32", torch.int64: "I64",
    torch.uint64: "U64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
    torch.float64: "F64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e8m0fnu: "F8_E8M0", torch.complex64: "C64",
}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}

BYTES_ENTRIES = "dcp.bytes_entries"
PLANNER_DATA = "dcp.planner_data"
MEGATRON_METADATA_JSON = "megatron.metadata_json"
MEGATRON_COMMON_PT = "megatron.common_pt"
COMMON_PT_KEY = "__torch_dist__/common.pt"
MAX_SIDE_FILE_BYTES = 1 << 30  # metadata.json, common.pt
DEFAULT_BUDGET = 1 << 30


class ConversionError(Exception):
    """A refused input or a failed conversion; the message names the file and entry."""


@dataclass
class Item:
    """One DCP storage item: a tensor chunk (or a bytes entry) and where its bytes are."""
    fqn: str
    is_bytes: bool
    dtype: str  # ckpt dtype name ("U8" for bytes entries)
    offsets: tuple
    sizes: tuple
    file: str  # relative to the DCP directory
    offset: int
    length: int


# ---------------------------------------------------------------------------------- import


def _plain_file(src, name, fqn):
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") \
            or "\0" in name:
        raise ConversionError(f"{src}/.metadata: entry {fqn!r} names the file {name!r}, "
                              "which is not a plain file name in the checkpoint directory")
    return name


def _storage_info(md, src, index, fqn):
    info = md.storage_data.get(index)
    if info is None:
        raise ConversionError(f"{src}/.metadata: no storage item for {fqn!r} at offsets "
                              f"{None if index.offset is None else list(index.offset)}")
    if getattr(info, "transform_descriptors", None):
        raise ConversionError(f"{src}: item {fqn!r} is stored with DCP extensions "
                              f"{list(info.transform_descriptors)}, which import does not read")
    return info


def plan_items(md, src):
    """Every item of the checkpoint and the ckpt tensor list (key, dtype, shape)."""
    items, tensors = [], []
    for fqn in sorted(md.state_dict_metadata):
        entry = md.state_dict_metadata[fqn]
        if isinstance(entry, dcp_md.BytesStorageMetadata):
            info = _storage_info(md, src, dcp_md.MetadataIndex(fqn), fqn)
            items.append(Item(fqn, True, "U8", (0,), (info.length,),
                              _plain_file(src, info.relative_path, fqn), info.offset,
                              info.length))
            tensors.append((fqn, "U8", [info.length]))
            continue
        dtype = DTYPE_NAMES.get(entry.properties.dtype)
        if dtype is None:
            raise ConversionError(f"{src}: tensor {fqn!r} has dtype {entry.properties.dtype}, "
                                  "which ckpt checkpoints cannot hold")
        tensors.append((fqn, dtype, list(entry.size)))
        for chunk in entry.chunks:
            info = _storage_info(md, src, dcp_md.MetadataIndex(fqn, chunk.offsets), fqn)
            items.append(Item(fqn, False, dtype, tuple(chunk.offsets), tuple(chunk.sizes),
                              _plain_file(src, info.relative_path, fqn), info.offset,
                              info.length))
    return items, tensors


def check_files(src, items):
    """Every item's file exists and is long enough (before anything is written)."""
    sizes = {}
    for item in items:
        if item.file not in sizes:
            path = os.path.join(src, item.file)
            try:
                sizes[item.file] = os.stat(path).st_size
            except OSError as e:
                raise ConversionError(f"{path}: {e.strerror}; .metadata lists item {item.fqn!r} "
                                      "in it") from None
        if item.offset + item.length > sizes[item.file]:
            raise ConversionError(
                f"{os.path.join(src, item.file)} is truncated: item {item.fqn!r} spans bytes "
                f"[{item.offset}, {item.offset + item.length}) of a {sizes[item.file]}-byte file")


def read_item(src, item):
    """The item as a contiguous CPU tensor (bytes entries: their raw bytes as uint8)."""
    path = os.path.join(src, item.file)
    with open(path, "rb") as f:
        f.seek(item.offset)
        raw = f.read(item.length)
    if len(raw) != item.length:
        raise ConversionError(f"{path} is truncated at item {item.fqn!r}")
    if item.is_bytes:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
            torch.empty(0, dtype=torch.uint8)
    where = f"{path}: item {item.fqn!r} at offsets {list(item.offsets)} (bytes {item.offset}+" \
            f"{item.length})"
    if not raw.startswith(b"PK\x03\x04"):
        raise ConversionError(f"{where} is not a torch.save archive (only DCP's default "
                              "torch_save serialization is read)")
    try:
        tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged archive
        raise ConversionError(f"{where} does not load: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None
    del raw
    if not isinstance(tensor, torch.Tensor) or DTYPE_NAMES.get(tensor.dtype) != item.dtype \
            or tuple(tensor.shape) != item.sizes:
        got = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) \
            else type(tensor).__name__
        raise ConversionError(f"{where} holds {got}, but .metadata says {item.dtype} "
                              f"{list(item.sizes)}")
    return tensor.contiguous()


def batch_items(items, max_bytes):
    """Consecutive items (sorted by file and offset) in batches of at most max_bytes each
    (an item larger than that alone)."""
    batches, current, held = [], [], 0
    for item in sorted(items, key=lambda i: (i.file, i.offset)):
        if current and held + item.length > max_bytes:
            batches.append(current)
            current, held = [], 0
        current.append(item)
        held += item.length
    if current:
        batches.append(current)
    return batches


def import_batches(src, staging, tensors, batches, writer_rank):
    """Writes each batch as one data file r<writer_rank>_<i>; returns the write records."""
    spec_of = {t[0]: t for t in tensors}
    records = []
    for index, batch in enumerate(batches):
        held = [read_item(src, item) for item in batch]
        pieces = [(item.fqn, list(item.offsets), list(item.sizes), None, t.data_ptr(),
                   t.numel() * t.element_size()) for item, t in zip(batch, held)]
        specs = [spec_of[k] for k in sorted({item.fqn for item in batch})]
        records.append(storage.write_data_file(staging, specs, pieces, writer_rank, index))
        del held
    return records


def _run_workers(function, jobs, workers):
    """function(*job) for every job: in this process for one worker, else in a fork pool."""
    if workers <= 1 or len(jobs) <= 1:
        return [function(*job) for job in jobs]
    with multiprocessing.get_context("fork").Pool(min(workers, len(jobs))) as pool:
        return pool.starmap(function, jobs)


def megatron_side_files(src, keys):
    """user metadata and an extra bytes item for a torch_dist directory's metadata.json and
    common.pt ({} and None for plain DCP), plus a note about common.pt when it is not read."""
    meta, note = {}, None
    json_path = os.path.join(src, "metadata.json")
    if not os.path.exists(json_path):
        return meta, None, None, note
    with open(json_path, "rb") as f:
        text = f.read(MAX_SIDE_FILE_BYTES + 1)
    if len(text) > MAX_SIDE_FILE_BYTES:
        raise ConversionError(f"{json_path} is larger than {MAX_SIDE_FILE_BYTES} bytes")
    try:  # UTF-8 only (json.loads of bytes would also take UTF-16 and UTF-32)
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(f"{json_path} is not UTF-8 JSON: byte {e.start} "
                              f"(0x{text[e.start]:02x}) is not UTF-8") from None
    try:
        parsed = json.loads(decoded)
    except RecursionError:
        raise ConversionError(f"{json_path}: nested deeper than Python's recursion limit "
                              f"({sys.getrecursionlimit()} levels)") from None
    except ValueError as e:
        raise ConversionError(f"{json_path} is not JSON: {e}") from None
    if not isinstance(parsed, dict) or parsed.get("sharded_backend") != "torch_dist":
        raise ConversionError(f"{json_path}: sharded_backend is "
                              f"{parsed.get('sharded_backend') if isinstance(parsed, dict) else parsed!r}"
                              ", only torch_dist (DCP) checkpoints are imported")
    meta[MEGATRON_METADATA_JSON] = decoded
    common = os.path.join(src, "common.pt")
    if not os.path.exists(common):
        return meta, None, None, note
    if COMMON_PT_KEY in keys:
        raise ConversionError(f"{src}: an entry is named {COMMON_PT_KEY!r}, the key reserved "
                              "for common.pt")
    size = os.path.getsize(common)
    if size > MAX_SIDE_FILE_BYTES:
        raise ConversionError(f"{common} is larger than {MAX_SIDE_FILE_BYTES} bytes")
    step = None
    try:
        state = torch.load(common, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and isinstance(state.get("iteration"), int):
            step = state["iteration"]
    except Exception as e:  # weights-only loading refuses classes it does not know
        note = (f"{common}: kept verbatim; weights-only loading refused it "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}), so no step is "
                "read from it")
    meta[MEGATRON_COMMON_PT] = COMMON_PT_KEY
    item = Item(COMMON_PT_KEY, True, "U8", (0,), (size,), "common.pt", 0, size)
    return meta, item, step, note


def _planner_data_json(planner_data):
    try:
        return json.dumps(planner_data)
    except (TypeError, ValueError):
        return None


def import_dcp(src, dst, overwrite=False, workers=1, memory_budget=DEFAULT_BUDGET, step=None,
               log=print):
    """Converts the DCP (or torch_dist) directory `src` into the ckpt checkpoint `dst`."""
    md = dcp_metadata.load_metadata(os.path.join(src, ".metadata"))
    items, tensors = plan_items(md, src)
    extra_meta, common_item, common_step, note = megatron_side_files(
        src, {t[0] for t in tensors})
    if common_item is not None:
        items.append(common_item)
        tensors.append((COMMON_PT_KEY, "U8", [common_item.length]))
    if note:
        log(f"note: {note}")
    check_files(src, items)
    user_metadata = {"imported_from": os.path.abspath(src),
                     "format": "torch_dist" if extra_meta else "dcp",
                     BYTES_ENTRIES: json.dumps(sorted(i.fqn for i in items if i.is_bytes and
                                                      i.fqn != COMMON_PT_KEY))}
    planner = _planner_data_json(md.planner_data)
    if planner is not None:
        user_metadata[PLANNER_DATA] = planner
    if isinstance(md.version, str):
        user_metadata["dcp.version"] = md.version
    user_metadata.update(extra_meta)
    workers = max(1, workers)
    batches = batch_items(items, max(1, memory_budget // (2 * workers)))
    staging = storage.create_staging(dst, overwrite)
    try:
        # Worker w writes data files r<w>_<i>: one per batch, batches dealt round robin.
        jobs = [(src, staging, tensors, batches[w::workers], w) for w in range(workers)
                if batches[w::workers]]
        records = [r for part in _run_workers(import_batches, jobs, workers) for r in part]
        final_step = step if step is not None else (common_step or 0)
        storage.commit(staging, dst, tensors, records, user_metadata, final_step, overwrite)
    except BaseException:
        storage.discard_staging(staging)
        raise
    total = sum(i.length for i in items)
    log(f"imported {len(tensors)} entries ({len(items)} items, {total} bytes) from {src} into "
        f"{dst}")
    return tensors


# ---------------------------------------------------------------------------------- export


@dataclass
class Chunk:
    """One DCP chunk to write: a box of a tensor, in the file of `rank`."""
    key: str
    dtype: str
    offsets: list
    sizes: list
    rank: int


def _boxes(key, dtype, offsets, lengths, flat, rank):
    if flat is None:
        return [Chunk(key, dtype, list(offsets), list(lengths), rank)]
    return [Chunk(key, dtype, list(o), list(s), rank)
            for o, s in storage.flat_range_boxes(offsets, lengths, flat[0], flat[1])]


def plan_chunks(reader, tensors, layout):
    """The chunks of every tensor: the layout's main-replica pieces, or the stored pieces;
    flat ranges as boxes, empty boxes dropped (a tensor left without any keeps one whole)."""
    dtype_of = {t[0]: t[1] for t in tensors}
    chunks = []
    if layout:
        for key, rank, offsets, lengths, flat, main in storage.layout_pieces(layout, tensors):
            if main:
                chunks += _boxes(key, dtype_of[key], offsets, lengths, flat, rank)
    else:
        for key, offsets, lengths, flat in reader.pieces():
            if key in dtype_of:
                chunks += _boxes(key, dtype_of[key], offsets, lengths, flat, 0)
    chunks = [c for c in chunks if all(s > 0 for s in c.sizes)]
    covered = {c.key for c in chunks}
    for key, dtype, shape in tensors:
        if key not in covered:
            chunks.append(Chunk(key, dtype, [0] * len(shape), list(shape), 0))
    return chunks


def plan_files(chunks, byte_items, max_file_bytes):
    """File name -> its chunks (and bytes entries, in rank 0's first file): __<rank>_<i>.distcp
    with at most max_file_bytes of chunk data each (a larger chunk alone)."""
    files, by_rank = {}, {}
    for c in chunks:
        by_rank.setdefault(c.rank, []).append(c)
    by_rank.setdefault(0, [])
    for rank, rank_chunks in sorted(by_rank.items()):
        index, held = 0, 0
        files[f"__{rank}_0.distcp"] = []
        for c in rank_chunks:
            size = _nbytes(c)
            if held and held + size > max_file_bytes:
                index, held = index + 1, 0
                files[f"__{rank}_{index}.distcp"] = []
            files[f"__{rank}_{index}.distcp"].append(c)
            held += size
    files["__0_0.distcp"] = list(byte_items) + files["__0_0.distcp"]
    return {name: content for name, content in files.items() if content}


def _nbytes(chunk):
    n = storage.element_size(chunk.dtype)
    for s in chunk.sizes:
        n *= s
    return n


def export_files(src, staging, files, memory_budget):
    """Writes the given DCP files; returns [(key, offsets, sizes, file, offset, length)]
    (offsets and sizes None for bytes entries)."""
    reader = storage.Reader(src)
    results = []
    for name, content in files:
        with open(os.path.join(staging, name), "xb") as f:
            for batch in _export_batches(content, memory_budget):
                results += _write_batch(reader, f, name, batch)
            f.flush()
            os.fsync(f.fileno())
    return results


def _export_batches(content, max_bytes):
    batch, held = [], 0
    for entry in content:
        size = _nbytes(entry) if isinstance(entry, Chunk) else entry[1]
        if batch and held + size > max_bytes:
            yield batch
            batch, held = [], 0
        batch.append(entry)
        held += size
    if batch:
        yield batch


def _write_batch(reader, f, name, batch):
    """Reads the batch in one call, then appends each entry to f: chunks by torch.save,
    bytes entries verbatim."""
    held = []
    for entry in batch:
        if isinstance(entry, Chunk):
            held.append(torch.empty(entry.sizes, dtype=TORCH_DTYPES[entry.dtype]))
        else:
            held.append(torch.empty(entry[1], dtype=torch.uint8))
    reads = []
    for entry, t in zip(batch, held):
        key, offsets, sizes = (entry.key, entry.offsets, entry.sizes) \
            if isinstance(entry, Chunk) else (entry[0], [0], [entry[1]])
        reads.append((key, offsets, sizes, None, t.data_ptr(), t.numel() * t.element_size()))
    reader.read_regions(reads)
    results = []
    for entry, t in zip(batch, held):
        offset = f.tell()
        if isinstance(entry, Chunk):
            torch.save(t, f)
            results.append((entry.key, entry.offsets, entry.sizes, name, offset,
                            f.tell() - offset))
        else:
            f.write(t.numpy().tobytes())
            results.append((entry[0], None, None, name, offset, entry[1]))
    return results


def build_metadata(tensors, bytes_keys, results, planner_data, dst):
    """torch's own Metadata for the written items (chunks in the order written)."""
    chunks_of = {key: [] for key, _, _ in tensors}
    storage_data = {}
    for key, offsets, sizes, name, offset, length in results:
        if offsets is None:
            index = dcp_md.MetadataIndex(key)
        else:
            index = dcp_md.MetadataIndex(key, offsets, len(chunks_of[key]))
            chunks_of[key].append(dcp_md.ChunkStorageMetadata(offsets=torch.Size(offsets),
                                                              sizes=torch.Size(sizes)))
        storage_data[index] = dcp_filesystem._StorageInfo(name, offset, length)
    state = {}
    for key, dtype, shape in tensors:
        state[key] = dcp_md.TensorStorageMetadata(
            properties=dcp_md.TensorProperties(dtype=TORCH_DTYPES[dtype]),
            size=torch.Size(shape), chunks=chunks_of[key])
    for key in bytes_keys:
        state[key] = dcp_md.BytesStorageMetadata()
    return dcp_md.Metadata(state_dict_metadata=state, planner_data=planner_data,
                           storage_data=storage_data,
                           storage_meta=dcp_md.StorageMeta(checkpoint_id=dst,
                                                           save_id=str(uuid.uuid4())),
                           version=dcp_filesystem.CURRENT_DCP_VERSION)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path, data):
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def export_dcp(src, dst, layout=None, workers=1, memory_budget=DEFAULT_BUDGET,
               max_file_bytes=4 << 30, log=print):
    """Writes the ckpt checkpoint `src` as the DCP (or torch_dist) directory `dst`."""
    dst = os.path.abspath(dst)
    if os.path.lexists(dst):
        raise ConversionError(f"{dst} already exists; export writes a new directory")
    reader = storage.Reader(src)
    meta = reader.user_metadata()
    bytes_keys = set(json.loads(meta.get(BYTES_ENTRIES, "[]")))
    common_key = meta.get(MEGATRON_COMMON_PT)
    all_tensors = {t[0]: t for t in reader.tensors()}
    tensors = [t for k, t in sorted(all_tensors.items())
               if k not in bytes_keys and k != common_key]
    chunks = plan_chunks(reader, tensors, layout)
    byte_items = [(k, all_tensors[k][2][0]) for k in sorted(bytes_keys)]
    files = sorted(plan_files(chunks, byte_items, max_file_bytes).items())
    workers = max(1, min(workers, len(files)))
    staging = os.path.join(os.path.dirname(dst),
                           f".{os.path.basename(dst)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(staging)
    try:
        jobs = [(src, staging, files[w::workers], max(1, memory_budget // workers))
                for w in range(workers)]
        results = [r for part in _run_workers(export_files, jobs, workers) for r in part]
        planner_json = meta.get(PLANNER_DATA)
        planner = json.loads(planner_json) if planner_json else \
            {k: (k,) for k in [t[0] for t in tensors] + sorted(bytes_keys)}
        if isinstance(planner, dict):
            planner = {k: tuple(v) if isinstance(v, list) else v for k, v in planner.items()}
        md = build_metadata(tensors, sorted(bytes_keys), results, planner, dst)
        _write_file(os.path.join(staging, ".metadata"), pickle.dumps(md))
        _write_megatron_files(reader, meta, common_key, staging, all_tensors)
        _fsync_dir(staging)
        if os.path.lexists(dst):
            raise ConversionError(f"{dst} appeared while exporting; left untouched")
        os.rename(staging, dst)
        _fsync_dir(os.path.dirname(dst))
    except BaseException:
        _remove_tree(staging)
        raise
    log(f"exported {len(tensors)} tensors ({len(chunks)} chunks) and {len(bytes_keys)} bytes "
        f"entries from {src} into {dst} ({len(files)} files)")


def _write_megatron_files(reader, meta, common_key, staging, all_tensors):
    if MEGATRON_METADATA_JSON in meta:
        _write_file(os.path.join(staging, "metadata.json"),
                    meta[MEGATRON_METADATA_JSON].encode("utf-8"))
    if common_key and common_key in all_tensors:
        length = all_tensors[common_key][2][0]
        data = torch.empty(length, dtype=torch.uint8)
        reader.read_regions([(common_key, [0], [length], None, data.data_ptr(), length)])
        _write_file(os.path.join(staging, "common.pt"), data.numpy().tobytes())


_MAX_REMOVE_DEPTH = 256


def _remove_tree(path):
    """Removes `path` and all under it by file descriptor, as storage/file_util.h's RemoveTree.

    Each directory is opened relative to its parent's descriptor with O_NOFOLLOW and must be the
    one listed (st_dev, st_ino), and every entry is removed relative to the open directory, so a
    directory swapped for a symlink meanwhile cannot point the removal outside `path`: the swap
    is refused with an error naming the path. A symlink is removed itself, never followed; a
    missing `path` is nothing to do."""
    parent, name = os.path.split(os.path.normpath(path))
    if name in ("", ".", ".."):
        raise OSError(f"not removing {path}: not a path to a named entry")
    try:
        parent_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _remove_entry(parent_fd, name, path, 0)
    finally:
        os.close(parent_fd)


def _remove_entry(dir_fd, name, path, depth):
    try:
        listed = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(listed.st_mode):
            os.unlink(name, dir_fd=dir_fd)
            return
        if depth >= _MAX_REMOVE_DEPTH:
            raise OSError(f"not removing {path}: deeper than {_MAX_REMOVE_DEPTH} directory levels")
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return  # gone meanwhile
    except OSError as e:
        if e.filename != name:
            raise
        raise OSError(e.errno, e.strerror, path) from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (listed.st_dev, listed.st_ino):
            raise OSError(f"not removing {path}: it was replaced while being removed")
        with os.scandir(fd) as entries:
            names = [e.name for e in entries]
        for n in names:
            _remove_entry(fd, n, os.path.join(path, n), depth + 1)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None


# ------------------------------------------------------------------------------------- CLI


def parse_size(text):
    """"123", "64KiB", "5MB", "2GiB" -> bytes."""
    units = [("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40),
             ("KB", 10**3), ("MB", 10**6), ("GB", 10**9), ("TB", 10**12), ("K", 1 << 10),
             ("M", 1 << 20), ("G", 1 << 30), ("B", 1)]
    for suffix, factor in units:
        if text.endswith(suffix) and len(text) > len(suffix):
            value = float(text[:-len(suffix)]) * factor
            break
    else:
        value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(value)


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m interop.dcp",
        description="PyTorch DCP / Megatron torch_dist <-> ckpt checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="DCP or torch_dist directory -> ckpt checkpoint")
    imp.add_argument("source")
    imp.add_argument("checkpoint")
    imp.add_argument("--overwrite", action="store_true",
                     help="replace an existing committed ckpt checkpoint (nothing else)")
    imp.add_argument("--step", type=int, help="the step to record (default: common.pt's "
                     "iteration for torch_dist, else 0)")
    exp = sub.add_parser("export", help="ckpt checkpoint -> DCP directory")
    exp.add_argument("checkpoint")
    exp.add_argument("destination")
    exp.add_argument("--layout", help="layout JSON (docs/layout.md) whose main-replica pieces "
                     "become the chunks; default: the stored pieces")
    exp.add_argument("--max-file-size", type=parse_size, default=4 << 30,
                     help="most chunk bytes per .distcp file (default 4GiB)")
    for p in (imp, exp):
        p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                       help="processes reading and writing (default min(8, CPUs))")
        p.add_argument("--memory-budget", type=parse_size, default=DEFAULT_BUDGET,
                       help="item data held at once over all workers (default 1GiB)")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    name = f"dcp {args.command}"
    try:
        if args.command == "import":
            import_dcp(args.source, args.checkpoint, args.overwrite, args.workers,
                       args.memory_budget, args.step)
        else:
            export_dcp(args.checkpoint, args.destination, args.layout, args.workers,
                       args.memory_budget, args.max_file_size)
    except (ConversionError, dcp_metadata.MetadataError, RuntimeError, OSError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
