"""ckpt.torch.load of a directory torch.distributed.checkpoint wrote (issue 41, item 4).

A DCP checkpoint (``dcp.save`` or ``format_utils.torch_save_to_dcp``: a ``.metadata`` pickle and
``__<rank>_<i>.distcp`` files, no ``manifest.pb``) is loaded in place into the caller's state
dict, so a job can switch from DCP to ckpt mid-run. Each rank reads the byte ranges of the DCP
chunks that overlap what it holds, straight from the .distcp files (no conversion, no daemon):

* a DTensor: its local piece (``compute_local_shape_and_global_offset``, any placements, any
  mesh); a ShardedTensor: each local shard; a plain tensor: the whole tensor. The overlaps of
  the stored chunks are copied into the caller's tensors in place, so any sharding the
  checkpoint was saved with loads into any sharding;
* a non-tensor value: DCP stores it as a ``torch.save`` archive; its ``data.pkl`` is read by
  ckpt's plain-data unpickler (ckpt._objects) unless ``trust_pickles``, and the value replaced
  in its container, as DCP does;
* top-level Stateful values as ckpt.torch.load takes them (state_dict() in, load_state_dict()
  out).

Keys are DCP's flattened keys (nested dicts and lists of dicts or tensors joined with "."), taken
with DCP's own flatten_state_dict. ``.metadata`` is read by ckpt.interop.dcp_metadata's
restricted unpickler (no code from the file runs) and checked before use; a refused one is
ckpt.DataLoss naming the file. DCP stores no checksums: a flipped bit inside a tensor's bytes is
not detected (a damaged archive or a wrong dtype or shape is, naming the file and key).
"""

import io
import os
import zipfile

import torch

from ckpt import _location
from ckpt import _objects
from ckpt import errors as _errors

_METADATA = ".metadata"
_MANIFEST = "manifest.pb"


def checkpoint_path(checkpoint_id, storage_reader):
    """The directory a load names (checkpoint_id, else the reader's path), or None."""
    if checkpoint_id is None and storage_reader is not None:
        checkpoint_id = getattr(storage_reader, "path", None) or \
            getattr(storage_reader, "checkpoint_id", None)
    if checkpoint_id is None:
        return None
    try:
        return _location.absolute(checkpoint_id)
    except TypeError:
        return None


def is_dcp_checkpoint(checkpoint_id, storage_reader=None):
    """True for a directory holding DCP's ``.metadata`` and no ckpt manifest (never for an
    object-store URL: only ckpt checkpoints are read from a store)."""
    path = checkpoint_path(checkpoint_id, storage_reader)
    if path is None or _location.is_object_store_url(path):
        return False
    return os.path.isfile(os.path.join(path, _METADATA)) and \
        not os.path.exists(os.path.join(path, _MANIFEST))


# ---- what the checkpoint holds ----------------------------------------------------------------
def read_metadata(path):
    """The checked DCP Metadata of the checkpoint directory ``path``; ckpt.DataLoss naming the
    file when it is refused (damaged, truncated, naming a class outside DCP's)."""
    from ckpt.interop import dcp_metadata

    try:
        return dcp_metadata.load_metadata(os.path.join(path, _METADATA))
    except dcp_metadata.MetadataError as e:
        raise _errors.DataLoss(f"ckpt.torch.load of the DCP checkpoint {path}: {e}") from None


def _storage_info(md, path, fqn, offsets=None):
    from torch.distributed.checkpoint.metadata import MetadataIndex

    info = md.storage_data.get(MetadataIndex(fqn, offsets))
    if info is None:
        at = "" if offsets is None else f" at offsets {list(offsets)}"
        raise _errors.DataLoss(f"{path}/{_METADATA}: no storage item for {fqn}{at}", key=fqn)
    name = info.relative_path
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise _errors.DataLoss(f"{path}/{_METADATA}: {fqn} names the file {name!r}, which is "
                               "not a plain file name in the checkpoint directory", key=fqn)
    if getattr(info, "transform_descriptors", None):
        raise _errors.Unimplemented(
            f"{path}: {fqn} is stored with DCP extensions {list(info.transform_descriptors)}, "
            "which ckpt does not read", key=fqn)
    return info


def _read_range(path, fqn, info):
    """The raw bytes of one storage item."""
    file = os.path.join(path, info.relative_path)
    try:
        with open(file, "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.length)
    except OSError as e:
        raise _errors.DataLoss(f"{file}: {e.strerror}; {path}/{_METADATA} lists {fqn} in it",
                               key=fqn) from None
    if len(raw) != info.length:
        raise _errors.DataLoss(f"{file} is truncated: {fqn} spans bytes [{info.offset}, "
                               f"{info.offset + info.length})", key=fqn)
    return raw, file


def _read_chunk(path, fqn, chunk, dtype, md):
    """One stored chunk of tensor ``fqn`` as a CPU tensor."""
    info = _storage_info(md, path, fqn, chunk.offsets)
    raw, file = _read_range(path, fqn, info)
    where = f"{file}: {fqn} at offsets {list(chunk.offsets)} (bytes {info.offset}+{info.length})"
    if not raw.startswith(b"PK\x03\x04"):
        raise _errors.DataLoss(f"{where} is not a torch.save archive (ckpt reads DCP's default "
                               "torch_save serialization)", key=fqn)
    try:
        tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (a damaged archive raises many types)
        first = str(e).splitlines()[0] if str(e) else ""
        raise _errors.DataLoss(f"{where} does not load: {type(e).__name__}: {first}",
                               key=fqn) from None
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or \
            tuple(tensor.shape) != tuple(chunk.sizes):
        got = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else \
            type(tensor).__name__
        raise _errors.DataLoss(f"{where} holds {got}, but {_METADATA} says {dtype} "
                               f"{list(chunk.sizes)}", key=fqn)
    return tensor


def _read_value(path, fqn, md, trust_pickles):
    """A non-tensor value (DCP: torch.save of the object)."""
    info = _storage_info(md, path, fqn)
    raw, file = _read_range(path, fqn, info)
    if trust_pickles:
        try:
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 (user classes raise anything)
            raise _errors.DataLoss(f"{file}: value {fqn} does not load: {type(e).__name__}: "
                                   f"{e}", key=fqn) from None
    return _objects.decode(_archived_pickle(raw, file, fqn), fqn, None, False, path=path)


def _archived_pickle(raw, file, fqn):
    """The data.pkl of a torch.save archive, bounded by the archive's own size (torch.save
    stores it uncompressed)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            names = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
            if len(names) != 1 or names[0].compress_type != zipfile.ZIP_STORED or \
                    names[0].file_size > len(raw):
                raise ValueError("no single uncompressed data.pkl in it")
            return archive.read(names[0])
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise _errors.DataLoss(f"{file}: value {fqn} is not a torch.save archive: {e}",
                               key=fqn) from None


# ---- what this rank holds ---------------------------------------------------------------------
def _boxes(fqn, value):
    """[(local tensor, global offsets)] of a tensor leaf on this rank."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        if value.device_mesh.get_coordinate() is None:
            return []  # this rank is not in the DTensor's mesh
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            value.shape, value.device_mesh, value.placements)
        local = value.to_local()
        if tuple(local.shape) != tuple(shape):
            raise _errors.InvalidArgument(
                f"tensor {fqn}: the DTensor's local tensor has shape {tuple(local.shape)}, its "
                f"placements give {tuple(shape)}", key=fqn)
        return [(local, tuple(offset))]
    if isinstance(value, ShardedTensor):
        return [(s.tensor, tuple(s.metadata.shard_offsets)) for s in value.local_shards()]
    return [(value, (0,) * value.dim())]


def _check_tensor(path, fqn, value, entry):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not isinstance(entry, TensorStorageMetadata):
        raise _errors.InvalidArgument(f"state-dict key {fqn} is a tensor here but the DCP "
                                      f"checkpoint {path} holds a non-tensor value", key=fqn)
    if value.device.type == "meta":
        raise _errors.Unimplemented(f"tensor {fqn} is on the meta device: ckpt.torch loads a "
                                    "DCP checkpoint into allocated tensors only", key=fqn)
    if value.dtype != entry.properties.dtype:
        raise _errors.InvalidArgument(f"tensor {fqn}: the DCP checkpoint {path} holds "
                                      f"{entry.properties.dtype}, the state dict {value.dtype}",
                                      key=fqn)
    if tuple(value.shape) != tuple(entry.size):
        raise _errors.InvalidArgument(f"tensor {fqn}: the DCP checkpoint {path} holds shape "
                                      f"{tuple(entry.size)}, the state dict {tuple(value.shape)}",
                                      key=fqn)


def _overlap(chunk, offsets, shape):
    """(start in chunk, start in box, lengths) of a chunk and a box, or None when disjoint."""
    lo = [max(c, b) for c, b in zip(chunk.offsets, offsets)]
    hi = [min(c + s, b + n) for c, s, b, n in zip(chunk.offsets, chunk.sizes, offsets, shape)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return ([l - c for l, c in zip(lo, chunk.offsets)], [l - b for l, b in zip(lo, offsets)],
            [h - l for l, h in zip(lo, hi)])


def _narrow(tensor, starts, lengths):
    for dim, (start, length) in enumerate(zip(starts, lengths)):
        tensor = tensor.narrow(dim, start, length)
    return tensor


def _fill(path, fqn, value, entry, md):
    """Copies every stored chunk overlapping this rank's pieces of ``value`` into them."""
    for local, offsets in _boxes(fqn, value):
        shape = tuple(local.shape)
        covered = 0
        for chunk in entry.chunks:
            overlap = _overlap(chunk, offsets, shape)
            if overlap is None:
                continue
            stored = _read_chunk(path, fqn, chunk, entry.properties.dtype, md)
            src, dst, lengths = overlap
            with torch.no_grad():
                _narrow(local, dst, lengths).copy_(_narrow(stored, src, lengths))
            covered += _volume(lengths)
        if covered != _volume(shape):
            raise _errors.DataLoss(
                f"tensor {fqn}: the chunks of the DCP checkpoint {path} cover {covered} of the "
                f"{_volume(shape)} elements at offsets {list(offsets)}", key=fqn)


def _volume(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


# ---- the load ---------------------------------------------------------------------------------
def _partial_allowed(planner):
    """None: no planner; DCP's DefaultLoadPlanner: its allow_partial_load; anything else is
    refused naming its class (ckpt reads DCP checkpoints by its own plan)."""
    if planner is None:
        return False
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    if type(planner) is DefaultLoadPlanner:
        return bool(getattr(planner, "allow_partial_load", False))
    raise _errors.Unimplemented(f"ckpt.torch.load of a DCP checkpoint: the custom load planner "
                                f"{type(planner).__name__} is not supported; pass planner=None "
                                "or DefaultLoadPlanner()")


def _plan(state_dict, path, planner):
    """(metadata, flat state dict, mappings, keys this rank holds that the checkpoint has)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    partial = _partial_allowed(planner)
    md = read_metadata(path)
    flat, mappings = flatten_state_dict(state_dict)
    present = []
    for fqn, value in flat.items():
        entry = md.state_dict_metadata.get(fqn)
        if entry is None:
            if partial:
                continue
            raise _errors.NotFound(f"state-dict key {fqn} is not in the DCP checkpoint {path}",
                                   key=fqn)
        if isinstance(value, torch.Tensor):
            _check_tensor(path, fqn, value, entry)
        elif not isinstance(entry, _bytes_class()):
            raise _errors.InvalidArgument(f"state-dict key {fqn} is a non-tensor value here but "
                                          f"the DCP checkpoint {path} holds a tensor", key=fqn)
        present.append(fqn)
    return md, flat, mappings, present


def _bytes_class():
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    return BytesStorageMetadata


def _read_all(path, md, flat, mappings, present, loaded, trust_pickles):
    from torch.distributed.checkpoint._traverse import set_element

    for fqn in present:
        value, entry = flat[fqn], md.state_dict_metadata[fqn]
        if isinstance(value, torch.Tensor):
            _fill(path, fqn, value, entry, md)
        else:
            set_element(loaded, mappings[fqn], _read_value(path, fqn, md, trust_pickles))


def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, strict=False, trust_pickles=False):
    """Collective (over ``process_group``, or this process alone without one): fills
    ``state_dict`` in place from the DCP checkpoint directory ``checkpoint_id``, as
    ckpt.torch.load does from a ckpt checkpoint (same errors, same ``strict`` and
    ``trust_pickles``). Every rank raises when any rank fails."""
    from ckpt import torch as ckpt_torch

    path = checkpoint_path(checkpoint_id, storage_reader)
    stateful_keys = ckpt_torch._stateful_keys(state_dict)
    md, flat, mappings, present, error, loaded = None, {}, {}, [], None, state_dict
    try:
        loaded = ckpt_torch._with_states(state_dict, stateful_keys)
        md, flat, mappings, present = _plan(loaded, path, planner)
    except _errors.Error as e:
        error = e
    per_rank = ckpt_torch._agree(error, present, process_group)
    if strict:
        extra = sorted(set(md.state_dict_metadata) - set().union(*map(set, per_rank)))
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise _errors.InvalidArgument(
                f"the DCP checkpoint {path} holds key {extra[0]} that no rank's state dict "
                f"has{more}; pass strict=False to ignore such keys", key=extra[0])
    try:
        _read_all(path, md, flat, mappings, present, loaded, trust_pickles)
    except _errors.Error as e:
        error = e
    ckpt_torch._agree(error, None, process_group)
    ckpt_torch._hand_back(state_dict, loaded, stateful_keys)

