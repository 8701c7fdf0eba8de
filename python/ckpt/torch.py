"""A drop-in for torch.distributed.checkpoint (DCP): change the import, keep the calls.

    import ckpt.torch as dcp                    # was: import torch.distributed.checkpoint as dcp
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": step}
    dcp.save(state, checkpoint_id="/ckpt/step100")
    future = dcp.async_save(state, checkpoint_id="/ckpt/step200")  # returns after the snapshot
    dcp.load(state, checkpoint_id="/ckpt/step200")                 # in place, any world size
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])

Top-level values that are ``Stateful`` (DCP's protocol: ``state_dict()`` and
``load_state_dict()``, e.g. a module, an optimizer wrapper, a dataloader, an app state object)
are treated as DCP treats them: save stores their ``state_dict()`` (async_save takes it before
it returns); load loads into their ``state_dict()`` and then calls ``load_state_dict()`` with
it. A Stateful below the top level is refused naming its key (pickling it would leave the
object unchanged at load).

What is stored, per leaf of the (nested) state dict, under its dotted key:
* a DTensor: its mesh shape, placements and this rank's coordinate are read from the DTensor
  and its piece (``to_local()``) is placed by ckpt's own sharding rules (``ckpt.resolve``);
  copies of a mesh that does not span the job (e.g. TP meshes, one per DP rank) get distinct
  replica ids, so each element is written once;
* a plain tensor: replicated (as DCP treats it), written once;
* any other value (int, float, str, small picklable object): pickled, written once by the lowest
  rank holding it (rank 0 when every rank holds the same value), loaded on every rank, with its
  SHA-256 checked on top of the storage checksums.

Saving needs the local ckpt worker daemons (``ckpt.LocalCluster`` or ``python -m ckpt.up``).
Differences from DCP (docs/python.md, "ckpt.torch and DCP", lists every entry point and
option): ``storage_writer``/``storage_reader`` are DCP's FileSystemWriter/Reader, taken for
their path; DCP's default planners are accepted (``allow_partial_load`` honoured), other
planners, storage classes and stagers refused naming the class (ckpt._dcp_options); a
ShardedTensor's local shards (any number per rank) are stored as pieces at their offsets, as
DCP stores them; the checkpoint directory may be new or empty; a ckpt checkpoint there is
replaced, atomically at the commit, only with ``overwrite=True`` or a FileSystemWriter whose
``overwrite`` is set (DCP's default), else ckpt.AlreadyExists; a directory holding anything
else (a DCP checkpoint included) is never written into; ``load`` loads a subset of the
checkpoint's keys, as DCP does (``strict=True`` refuses a checkpoint key no rank's state dict
holds). CPU tensors of 1 MiB or more that PyTorch allocated are moved into worker-shared memory
in place at their first save or load (PyTorch's share_memory_ mechanism; ckpt._share), so later
saves and loads copy nothing in the trainer (CKPT_TORCH_SHARE_IN_PLACE=0 turns it off); other
tensors, and every tensor of an async_save, are copied into shared staging at the snapshot
unless allocated with ``ckpt.empty``; CUDA tensors are refused for now.
"""

import concurrent.futures
import dataclasses
import json
import os
import threading
import uuid

import torch
import torch.distributed as dist

from ckpt import _dcp_options, _flatten, _location, _objects, _share
from ckpt import dtypes as _dtypes
from ckpt import errors as _errors
from ckpt.client import Client, read_manifest
from ckpt.layouts import DTensor as _DTensorLayout
from ckpt.layouts import Box, Replicated, resolve

__all__ = ["save", "async_save", "load", "save_state_dict", "load_state_dict", "init",
           "get_client", "shutdown"]

_OBJECTS_KEY = "ckpt.torch.objects"  # user metadata: {key: sha256} of non-tensor values
_lock = threading.Lock()
_client = None
_client_identity = None


# ---- the client -------------------------------------------------------------------------------
_NO_DIST = "ckpt.torch.no_dist"  # stands for the process group of no_dist=True: this rank alone


def _distributed():
    return dist.is_available() and dist.is_initialized()


def _group(process_group, no_dist):
    """The group a call runs over: ``process_group`` (None: the default group), or this process
    alone (_NO_DIST) with ``no_dist`` or without an initialized process group, as DCP."""
    return _NO_DIST if no_dist or not _distributed() else process_group


def _group_rank_world(process_group):
    if process_group is not _NO_DIST and _distributed():
        return dist.get_rank(process_group), dist.get_world_size(process_group)
    return 0, 1


def _job_suffix(process_group):
    """What tells this group's ckpt job from the default group's: ranks saving with no_dist
    are each a job of one; a process group other than the default one is a job of its ranks."""
    if not _distributed():
        return ""
    if process_group is _NO_DIST:
        return f".no_dist.r{dist.get_rank()}" if dist.get_world_size() > 1 else ""
    if process_group is None or process_group is dist.group.WORLD:
        return ""
    ranks = dist.get_process_group_ranks(process_group)
    if ranks == list(range(dist.get_world_size())):
        return ""
    listed = "-".join(map(str, ranks))
    if len(listed) > 40:
        import hashlib

        listed = hashlib.sha256(listed.encode()).hexdigest()[:16]
    return f".pg{listed}"


def _job_name(process_group):
    """CKPT_JOB / TORCHELASTIC_RUN_ID / SLURM_JOB_ID, else a name rank 0 picks and broadcasts;
    with the group's suffix (_job_suffix)."""
    suffix = _job_suffix(process_group)
    for var in ("CKPT_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        if os.environ.get(var):
            return os.environ[var] + suffix
    name = [f"torch-{uuid.uuid4().hex[:12]}"]
    if process_group is not _NO_DIST and _distributed():
        src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        dist.broadcast_object_list(name, src=src, group=process_group)
    return name[0] + suffix


def init(client=None, **client_kwargs):
    """Uses ``client`` (a ckpt.Client) for the following calls, or connects one with
    ``client_kwargs`` (see ckpt.Client). Optional: the first save or load connects with the
    process group's rank and size, LOCAL_RANK and the job from the environment."""
    global _client, _client_identity
    with _lock:
        if _client is not None and _client is not client:
            _client.close()
        _client = client if client is not None else Client(**client_kwargs)
        _client_identity = (_client.job, _client.rank, _client.world_size, "")
    return _client


def get_client(process_group=None):
    """The client of this process for ``process_group``, connected at first use."""
    global _client, _client_identity
    rank, world = _group_rank_world(process_group)
    suffix = _job_suffix(process_group)
    with _lock:
        if _client is not None and _client_identity[1:] == (rank, world, suffix):
            return _client
    job = _job_name(process_group)
    local_rank = os.environ.get("LOCAL_RANK")
    client = Client(job=job, rank=rank, world_size=world,
                    local_rank=int(local_rank) if local_rank is not None else None)
    with _lock:
        if _client is not None:
            _client.close()
        _client, _client_identity = client, (job, rank, world, suffix)
    return client


def shutdown():
    """Closes this process's client (says Goodbye to the worker)."""
    global _client, _client_identity
    with _lock:
        for _, _, state in _SaveCache.slots.values():
            state._await_lent()  # the worker may still write from its staging
        _SaveCache.slots.clear()
        _share.release()
        if _client is not None:
            _client.close()
        _client, _client_identity = None, None


# ---- what each leaf is ------------------------------------------------------------------------
class _Item:
    """A state-dict leaf as ckpt stores it."""

    __slots__ = ("leaf", "kind", "dtype", "global_shape", "local", "layout", "mesh_ranks",
                 "payload", "digest")

    def __init__(self, leaf):
        self.leaf = leaf
        self.kind = "object"
        self.dtype = "U8"
        self.global_shape = ()
        self.local = None
        self.layout = None
        self.mesh_ranks = None
        self.payload = None
        self.digest = None

    @property
    def key(self):
        return self.leaf.key

    def describe(self):
        """What the other ranks need to agree on this key."""
        return (self.kind, self.dtype, tuple(self.global_shape), self.mesh_ranks, self.digest)


def _is_dtensor(v):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover (old torch)
        return False
    return isinstance(v, DTensor)


def _placement_of(key, p):
    name = type(p).__name__
    if name in ("Shard", "Replicate"):
        return p
    raise _errors.InvalidArgument(
        f"tensor {key}: DTensor placement {p!r} cannot be saved by ckpt (only Shard(dim) and "
        "Replicate(); redistribute Partial placements, and save FSDP+TP strided shards through "
        "full_tensor() or a DCP state dict without _StridedShard)", key=key)


def _dtensor_item(item, value):
    key = item.key
    mesh = value.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None  # this rank is not in the DTensor's mesh: it holds nothing of it
    placements = [_placement_of(key, p) for p in value.placements]
    local = value.to_local()
    if local.device.type not in ("cpu", "cuda"):
        _refuse_device(key, local)
    item.kind = "dtensor"
    item.dtype = _dtypes.name_of(value.dtype, key)
    item.global_shape = tuple(int(d) for d in value.shape)
    item.local = local
    item.mesh_ranks = tuple(int(r) for r in mesh.mesh.flatten().tolist())
    item.layout = _DTensorLayout(item.global_shape, tuple(mesh.mesh.shape), placements,
                                 tuple(coordinate))
    region = resolve(item.layout, key=key)
    if region.lengths != tuple(local.shape):
        raise _errors.InvalidArgument(
            f"tensor {key}: the DTensor's local tensor has shape {tuple(local.shape)} but "
            f"{item.layout.placements} over mesh {item.layout.mesh_shape} at coordinate "
            f"{tuple(coordinate)} gives shape {region.lengths} (torch.chunk sharding)", key=key)
    return item


def _is_sharded_tensor(v):
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except ImportError:  # pragma: no cover (builds without torch.distributed._shard)
        return False
    return isinstance(v, ShardedTensor)


def _sharded_items(leaf, value):
    """A ShardedTensor (torch.distributed._shard; FSDP1's SHARDED_STATE_DICT, older TP code):
    each local shard is a piece at its offsets (a Box), as DCP stores it; a rank may hold any
    number of shards of it (none, or several: ChunkShardingSpec or EnumerableShardingSpec
    placing two on it), each saved and loaded on its own. A nested ShardedTensor or one on the
    meta device is refused naming the key."""
    return [_sharded_item(_Item(leaf), value, shard) for shard in value.local_shards()]


def _sharded_item(item, value, shard):
    """One local shard of a ShardedTensor as an item (see _sharded_items)."""
    key = item.key
    local, meta = shard.tensor, shard.metadata
    if _is_sharded_tensor(local) or _is_dtensor(local):
        raise _errors.Unimplemented(
            f"tensor {key}: a ShardedTensor whose local shard is itself a "
            f"{type(local).__name__} (2-D FSDP+TP) cannot be saved by ckpt", key=key)
    if local.device.type not in ("cpu", "cuda"):
        _refuse_device(key, local)
    item.kind = "sharded"
    item.dtype = _dtypes.name_of(value.dtype, key)
    item.global_shape = tuple(int(d) for d in value.size())
    item.local = local
    offsets = tuple(int(o) for o in meta.shard_offsets)
    if tuple(int(d) for d in meta.shard_sizes) != tuple(local.shape):
        raise _errors.InvalidArgument(
            f"tensor {key}: the ShardedTensor's local shard has shape {tuple(local.shape)}, "
            f"its metadata says {tuple(meta.shard_sizes)}", key=key)
    # The offsets of this rank's shards of the key (_describe joins them): equal offsets on
    # several ranks are replicas of one piece.
    item.mesh_ranks = (offsets,)
    item.layout = Box(item.global_shape, offsets)
    return item


def _refuse_device(key, tensor):
    raise _errors.Unimplemented(
        f"tensor {key} is on {tensor.device}: ckpt.torch saves and loads CPU and CUDA tensors "
        "only", key=key)


# ---- Stateful values (models, optimizers, dataloaders, app states), as DCP treats them -------
def _stateful_class():
    from torch.distributed.checkpoint.stateful import Stateful

    return Stateful


def _state_dict_of(key, value):
    """``value.state_dict()``, any failure ckpt.InvalidArgument naming the key (so every rank
    raises together instead of the others waiting in the agreement)."""
    try:
        return value.state_dict()
    except Exception as e:  # user code can raise anything
        raise _errors.InvalidArgument(
            f"state-dict value {key} ({type(value).__name__}): its state_dict() raised "
            f"{type(e).__name__}: {e}", key=str(key)) from e


def _stateful_keys(state_dict):
    """The top-level keys whose values are Stateful (DCP's runtime-checked Protocol: a
    ``state_dict()`` and a ``load_state_dict()``), in DCP's order (sorted, when the keys
    sort), which keeps any collectives inside their state_dict() calls in step across ranks."""
    from collections.abc import Mapping

    if not isinstance(state_dict, Mapping):
        return []  # refused by _flatten.flatten, naming the type
    stateful = _stateful_class()
    keys = [k for k, v in state_dict.items() if isinstance(v, stateful)]
    try:
        return sorted(keys)
    except TypeError:
        return keys


def _with_states(state_dict, stateful_keys):
    """A shallow copy of ``state_dict`` with each Stateful value replaced by its
    ``state_dict()`` (DCP's ``_stateful_to_state_dict``), in the caller's key order."""
    if not stateful_keys:
        return state_dict
    states = {k: _state_dict_of(k, state_dict[k]) for k in stateful_keys}
    return {k: states[k] if k in states else v for k, v in state_dict.items()}


def _refuse_nested_stateful(key, value):
    """A Stateful below the top level would be pickled and, at load, replaced in its container
    while the caller's object stays as it was: refused, naming the key."""
    from collections.abc import Mapping

    stateful = _stateful_class()

    def find(v):
        if isinstance(v, stateful):
            return v
        for x in v.values() if isinstance(v, Mapping) else \
                v if isinstance(v, (list, tuple)) else ():
            f = find(x)
            if f is not None:
                return f
        return None

    found = find(value)
    if found is not None:
        raise _errors.InvalidArgument(
            f"state-dict value {key} is or holds a {type(found).__name__}, which has "
            "state_dict() and load_state_dict(), below the top level of the state dict: ckpt.torch "
            "(like DCP) calls them only on top-level values, and pickling it would leave the "
            "object unchanged at load; put it at the top level or store its state_dict()",
            key=key)


def _classify(leaves):
    """One _Item per leaf this rank holds."""
    items = []
    for leaf in leaves:
        item = _Item(leaf)
        value = leaf.value
        if _is_dtensor(value):
            if _dtensor_item(item, value) is not None:
                items.append(item)
            continue
        if _is_sharded_tensor(value):
            items.extend(_sharded_items(leaf, value))
            continue
        if isinstance(value, torch.Tensor):
            if value.device.type not in ("cpu", "cuda"):
                _refuse_device(leaf.key, value)
            item.kind = "tensor"
            item.dtype = _dtypes.name_of(value.dtype, leaf.key)
            item.global_shape = tuple(int(d) for d in value.shape)
            item.local = value
        else:
            _refuse_nested_stateful(leaf.key, value)
            try:
                item.payload, item.digest = _objects.encode(value)
            except Exception as e:  # pickling user objects can raise anything
                raise _errors.InvalidArgument(
                    f"state-dict value {leaf.key} ({type(value).__name__}) cannot be pickled: "
                    f"{e}", key=leaf.key) from None
            item.global_shape = (len(item.payload),)
        items.append(item)
    return items


# ---- agreement across ranks -------------------------------------------------------------------
def _all_gather(obj, process_group):
    if process_group is _NO_DIST or not _distributed():
        return [obj]
    out = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(out, obj, group=process_group)
    return out


def _agree(local_error, payload, process_group):
    """Gathers (error, payload) from every rank. If any rank failed, every rank raises: its own
    error, or ckpt.Aborted quoting the first failing rank's, so nobody enters the collective
    save or load alone. Returns the payloads."""
    gathered = _all_gather((None if local_error is None else
                            (type(local_error).__name__, str(local_error)), payload),
                           process_group)
    if local_error is not None:
        raise local_error
    for rank, (err, _) in enumerate(gathered):
        if err is not None:
            raise _errors.Aborted(f"rank {rank} failed: {err[0]}: {err[1]}")
    return [p for _, p in gathered]


def _check_agreement(per_rank):
    """The same key must be the same kind, dtype and global shape on every rank holding it."""
    first = {}
    for rank, described in enumerate(per_rank):
        for key, d in described.items():
            if key not in first:
                first[key] = (rank, d)
                continue
            r0, d0 = first[key]
            if d[0] != d0[0] or (d[0] != "object" and d[1:3] != d0[1:3]):
                raise _errors.InvalidArgument(
                    f"state-dict key {key} differs between ranks: rank {r0} holds {_what(d0)}, "
                    f"rank {rank} holds {_what(d)}", key=key)


def _what(d):
    if d[0] == "object":
        return "a non-tensor value"
    kind = {"dtensor": "DTensor", "sharded": "ShardedTensor"}.get(d[0], "tensor")
    return f"a {kind} of {d[1]} {list(d[2])}"


def _describe(items):
    """What this rank tells the others, per key (_Item.describe); the shards of a
    ShardedTensor this rank holds several of are one entry listing all their offsets."""
    described = {}
    for item in items:
        d = item.describe()
        if item.kind == "sharded" and item.key in described:
            first = described[item.key]
            d = first[:3] + (first[3] + d[3],) + first[4:]
        described[item.key] = d
    return described


def _id_of(ids, item):
    """The replica id of ``item`` in _replica_ids' answer (a ShardedTensor's per shard)."""
    rid = ids[item.key]
    return rid[tuple(item.layout.offsets)] if item.kind == "sharded" else rid


def _replica_ids(per_rank, rank):
    """Replica id per key this rank holds: its position among the holders (plain tensors and
    values; the lowest holder is the main replica), or, for a DTensor, the position of its mesh
    among the distinct meshes holding it (ordered by their first rank), or, for a ShardedTensor,
    per shard offsets this rank holds ({offsets: id}, read with _id_of), its position among the
    holders of a shard at the same offsets."""
    holders, meshes = {}, {}
    for r, described in enumerate(per_rank):
        for key, d in described.items():
            holders.setdefault(key, []).append(r)
            if d[0] == "dtensor" and d[3] not in meshes.setdefault(key, []):
                meshes[key].append(d[3])
    ids = {}
    for key, d in per_rank[rank].items():
        if d[0] == "dtensor":
            ids[key] = sorted(meshes[key], key=min).index(d[3])
        elif d[0] == "sharded":
            ids[key] = {offsets: [r for r in holders[key] if offsets in per_rank[r][key][3]]
                        .index(rank) for offsets in d[3]}
        else:
            ids[key] = holders[key].index(rank)
    return ids


# ---- save -------------------------------------------------------------------------------------
def _path(checkpoint_id, storage, what):
    """The checkpoint directory: ``checkpoint_id``, else the path of DCP's FileSystemWriter or
    FileSystemReader (its options checked; other storage objects refused naming the class). An
    object-store URL (``s3://bucket/prefix``) is returned as it is, for the coordinator."""
    if storage is not None:
        stored = _dcp_options.storage_path(storage, what)
        url = _location.mangled_url(stored)
        if checkpoint_id is None and url is not None:
            raise _errors.InvalidArgument(
                f"{what}: the storage object's path {stored!r} is the URL {url!r} made a local "
                f"path (DCP keeps it as a pathlib.Path); pass checkpoint_id={url!r}")
        checkpoint_id = stored if checkpoint_id is None else checkpoint_id
    if checkpoint_id is None:
        raise _errors.InvalidArgument(f"{what}: give checkpoint_id (the checkpoint directory)")
    return _location.absolute(checkpoint_id)


def _make_parent(path):
    """Creates the checkpoint's parent directory, as DCP's FileSystemWriter does (nothing for
    an object-store URL: its store has no directories)."""
    if _location.is_object_store_url(path):
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
        cls = _errors.PermissionDenied if isinstance(e, PermissionError) else \
            _errors.FailedPrecondition
        raise cls(f"ckpt.torch.save: cannot create the parent directory of {path}: {e}") from None


def _check_target(path, overwrite=False):
    """Before the ranks agree: the checkpoint path must not exist or be an empty directory (as
    DCP's callers create it: mkdtemp, makedirs), which the coordinator's commit replaces
    atomically (it removes it with rmdir right before its no-replace rename), or, with
    ``overwrite``, hold a ckpt checkpoint (manifest.pb), which the commit swaps out atomically
    (the coordinator checks again that it is a committed checkpoint and nothing else,
    storage/overwrite_guard.h). Anything else is refused naming it: ckpt.AlreadyExists, or with
    ``overwrite`` ckpt.FailedPrecondition (what the coordinator's guard raises); a DCP
    checkpoint is never replaced, nor a directory holding anything else deleted. An
    object-store URL is not looked at here: its store refuses an existing checkpoint unless
    overwriting, and never replaces anything but a committed one."""
    if _location.is_object_store_url(path):
        return
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise _errors.AlreadyExists(f"ckpt.torch.save: {path} exists and is not a directory")
    except OSError as e:
        raise _errors.FailedPrecondition(f"ckpt.torch.save: cannot list {path}: {e}") from None
    if not names:
        return
    if "manifest.pb" in names:
        if overwrite:
            return
        why = ("holds a ckpt checkpoint; ckpt.torch.save replaces one only with overwrite=True "
               "(or a FileSystemWriter whose overwrite is set): save under a new path, remove "
               "it first or ask for overwrite")
    elif ".metadata" in names:
        why = ("holds a DCP checkpoint; ckpt.torch.save does not write over it (overwrite "
               "replaces only a ckpt checkpoint)")
    else:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        why = (f"is not an empty directory (it holds {shown}); a checkpoint is written only to a "
               "new path or an empty directory" +
               (" (overwrite replaces only a ckpt checkpoint)" if overwrite else ""))
    cls = _errors.FailedPrecondition if overwrite else _errors.AlreadyExists
    raise cls(f"ckpt.torch.save: {path} {why}")


def _init_meta(leaves, pg):
    """As DCP's load (_init_state_dict): a tensor or DTensor on the meta device is replaced in
    its container by an uninitialized one on the process group's default device (the CPU for
    gloo), which the load then fills. A meta ShardedTensor is refused naming the key, as DCP
    refuses it."""
    for leaf in leaves:
        value = leaf.value
        if not isinstance(value, torch.Tensor) or value.device.type != "meta":
            continue
        if _is_sharded_tensor(value):
            raise _errors.Unimplemented(
                f"tensor {leaf.key}: a ShardedTensor on the meta device cannot be loaded into "
                "(DCP refuses it too)", key=leaf.key)
        device = torch.device("cpu")
        if pg is not _NO_DIST and _distributed():
            import warnings

            with warnings.catch_warnings():  # DCP's call; deprecated, and warns for gloo
                warnings.simplefilter("ignore")
                device = dist.distributed_c10d._get_pg_default_device(pg)
            if device.type != "cpu":
                device = torch.device(device.type, getattr(torch, device.type).current_device())
        if _is_dtensor(value):
            from torch.distributed.tensor import DTensor

            local = torch.empty_like(value.to_local(), device=device)
            new = DTensor.from_local(local, device_mesh=value.device_mesh,
                                     placements=value.placements, shape=value.size(),
                                     stride=value.stride())
        else:
            new = torch.empty_like(value, device=device)
        if isinstance(leaf.container, tuple):
            raise _errors.InvalidArgument(
                f"tensor {leaf.key} is on the meta device inside a tuple: it cannot be replaced "
                "by a loaded tensor in place", key=leaf.key)
        leaf.container[leaf.index] = new
        leaf.value = new
    return leaves


def _snapshot(state_dict, checkpoint_id, storage_writer, planner, process_group, metadata,
              lend, groups=None, compression=None, overwrite=None):
    """Everything up to the snapshot: returns the SaveHandle. ``lend``: the caller waits for
    the commit before it touches any tensor (see ckpt.Client.save). ``overwrite`` None: the
    FileSystemWriter's (_dcp_options.writer_overwrite), False without one."""
    path, items, error = None, [], None
    try:
        path = _path(checkpoint_id, storage_writer, "ckpt.torch.save")
        if overwrite is None:
            overwrite = _dcp_options.writer_overwrite(storage_writer)
        overwrite = bool(overwrite)
        _dcp_options.save_planner(planner, "ckpt.torch.save")
        _check_target(path, overwrite)
        _make_parent(path)
        items = _classify(_flatten.flatten(_with_states(state_dict,
                                                        _stateful_keys(state_dict))))
    except _errors.Error as e:
        error = e
    described = _describe(items)
    per_rank = _agree(error, (path, overwrite, described), process_group)
    paths = {p for p, _, _ in per_rank}
    if len(paths) != 1:
        raise _errors.InvalidArgument(f"ckpt.torch.save: ranks name different checkpoints: "
                                      f"{sorted(paths)}")
    if len({o for _, o, _ in per_rank}) != 1:
        raise _errors.InvalidArgument(
            f"ckpt.torch.save of {path}: ranks disagree on overwrite "
            f"({[o for _, o, _ in per_rank]} by rank)")
    per_rank = [d for _, _, d in per_rank]
    _check_agreement(per_rank)
    rank, _ = _group_rank_world(process_group)
    ids = _replica_ids(per_rank, rank)
    objects = {}
    for described_by_rank in per_rank:
        for key, d in described_by_rank.items():
            if d[0] == "object" and key not in objects:
                objects[key] = d[4]  # the lowest holder's digest: the value that is written
    client = get_client(process_group)
    state = _save_state(client, items, ids, "in_place" if lend else "staged")
    meta = dict(metadata or {})
    meta[_OBJECTS_KEY] = json.dumps(objects, sort_keys=True)
    return client.save(path, state, meta, lend=lend, groups=groups, compression=compression,
                       overwrite=overwrite)


class _SaveCache:
    """The last ckpt state dict of each kind, reused by the next save or load of the same
    tensors (same keys, layouts, replica ids, memory and values' sizes), so its shared staging
    buffers are allocated once and each save only copies into them. Two kinds:
    * "in_place" (blocking save, load): large CPU tensors are moved into worker-shared memory
      once (ckpt._share) and saved and loaded where they are; the rest is staged;
    * "staged" (async_save): every tensor is copied into ckpt's staging at the snapshot, which
      is cheaper than the worker copying shared tensors into fresh buffers of its own.
    Each holds one copy of its staged tensors in shared memory until shutdown() or a save of
    something else. The buffers are lent to each save until it is durable (the worker writes
    from them, no second copy): the next save or load of the same tensors waits for the
    previous save to end before it writes them."""

    slots = {}  # kind -> (client, signature, state)


def _signature(items, ids):
    sig = []
    for item in items:
        if item.kind == "object":
            sig.append((item.key, "object", _id_of(ids, item), len(item.payload)))
            continue
        t = item.local
        sig.append((item.key, item.kind, item.dtype, item.global_shape, repr(item.layout),
                    _id_of(ids, item), t.data_ptr(), tuple(t.shape), tuple(t.stride())))
    return tuple(sig)


def _save_state(client, items, ids, kind="in_place"):
    """The ckpt state dict of this save or load (the cached one when the tensors are the same).
    ``kind``: see _SaveCache."""
    import numpy as np

    stage = kind == "staged"
    if not stage:
        for item in items:
            if item.kind != "object":
                _share.share(item.key, item.local)  # before the signature: it moves the memory
    signature = _signature(items, ids)
    cached = _SaveCache.slots.get(kind)
    if cached is not None and cached[0] is client and cached[1] == signature:
        state = cached[2]
        for item in items:
            if item.kind == "object" and ids[item.key] == 0:
                state._entries[item.key].tensor = np.frombuffer(item.payload, dtype=np.uint8)
        return state
    if cached is not None:
        cached[2]._await_lent()  # its staging may be freed and reused below
        del _SaveCache.slots[kind]
    if not stage:
        _share.retain([item.local for item in items if item.kind != "object"])
    state = client.state_dict()
    for item in items:
        rid = _id_of(ids, item)
        if item.kind == "object":
            if rid == 0:  # the writer; the others hold a copy that is not stored
                state.add(item.key, np.frombuffer(item.payload, dtype=np.uint8), Replicated(0))
        elif item.kind == "dtensor":
            state.add(item.key, item.local, dataclasses.replace(item.layout, replica_id=(rid,)),
                      stage=stage)
        elif item.kind == "sharded":
            state.add(item.key, item.local, dataclasses.replace(item.layout, replica_id=rid),
                      stage=stage)
        else:
            state.add(item.key, item.local, Replicated(rid), stage=stage)
    _SaveCache.slots[kind] = (client, signature, state)
    return state


def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
         process_group=None, no_dist=False, use_collectives=True, metadata=None, groups=None,
         compression=None, overwrite=None):
    """Collective: saves ``state_dict`` to the directory ``checkpoint_id`` (a new path or an
    empty directory; with ``overwrite``, also a ckpt checkpoint, replaced atomically at the
    commit: a failed or interrupted save leaves the old one) and returns once it is committed
    (durable). ``overwrite`` None: the ``overwrite`` of a FileSystemWriter given as
    ``storage_writer`` (DCP's default True), else False. Returns the SaveHandle
    (``staged_bytes``: bytes copied into shared staging; ``lent_bytes``: bytes the worker wrote
    from shared memory without copying them again, here every byte: the call does not return
    before the commit, so all the memory is lent to the save). ``storage_writer``: DCP's
    FileSystemWriter, for its path; ``planner``: None or DCP's DefaultSavePlanner;
    ``no_dist``: this process alone (also without a process group). ``metadata``: extra
    str -> str stored in the manifest. ``groups``: process groups the writes are distributed
    within (see ckpt.Client.save). ``compression``: None, "zstd" or "zstd:<level>": lossless
    compression of the data files (see ckpt.Client.save)."""
    _dcp_options.refuse_no_collectives(use_collectives, "ckpt.torch.save")
    handle = _snapshot(state_dict, checkpoint_id, storage_writer, planner,
                       _group(process_group, no_dist), metadata, lend=True, groups=groups,
                       compression=compression, overwrite=overwrite)
    handle.wait()
    return handle


def save_state_dict(state_dict, storage_writer, process_group=None, coordinator_rank=0,
                    no_dist=False, planner=None):
    """DCP's older name for ``save`` (its signature: ``storage_writer`` positional, carrying
    the path; its ``overwrite`` honoured for a ckpt checkpoint). ``coordinator_rank`` has no
    meaning for ckpt, whose coordinator daemon plans."""
    return save(state_dict, storage_writer=storage_writer, planner=planner,
                process_group=process_group, no_dist=no_dist)


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
               process_group=None, async_checkpointer_type=None, async_stager=None,
               no_dist=False, use_collectives=True, metadata=None, groups=None,
               compression=None, overwrite=None):
    """Collective: returns once this rank's state is snapshotted (copied out of the trainer's
    tensors), so they may be modified at once; the returned concurrent.futures.Future completes
    (result: the SaveHandle) when the checkpoint is committed, or raises the abort diagnosis.
    With DCP's DefaultStager(StagingOptions(use_async_staging=True)) it returns DCP's
    AsyncSaveResponse instead, whose ``staging_completion`` is already done.
    ``async_checkpointer_type`` THREAD or PROCESS: ckpt's worker daemon writes either way.
    Tensors are copied into ckpt's shared staging by this call and the worker writes from
    there; ckpt.empty tensors are copied by the worker before this returns. The staging stays
    busy until the save is durable: a following save or load of the same tensors waits for it.
    ``compression``, ``overwrite``: as for ``save``."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    if async_checkpointer_type is None:
        async_checkpointer_type = AsyncCheckpointerType.THREAD
    response = _dcp_options.async_options(async_checkpointer_type, async_stager, storage_writer,
                                          use_collectives, "ckpt.torch.async_save")
    handle = _snapshot(state_dict, checkpoint_id, storage_writer, planner,
                       _group(process_group, no_dist), metadata, lend=False, groups=groups,
                       compression=compression, overwrite=overwrite)
    future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()

    def wait():
        try:
            handle.wait()
            future.set_result(handle)
        except BaseException as e:  # handed to the future's waiter
            future.set_exception(e)

    threading.Thread(target=wait, name="ckpt-async-save", daemon=True).start()
    if not response:
        return future
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    staged = concurrent.futures.Future()
    staged.set_result(None)  # the snapshot was taken before this returns
    return AsyncSaveResponse(staging_completion=staged, upload_completion=future)


# ---- load -------------------------------------------------------------------------------------
def _check_against_manifest(items, manifest, allow_partial_load=False):
    """Missing keys, shape or dtype mismatches and tensor/value confusion, named. Returns the
    items to load: with ``allow_partial_load`` (DCP's DefaultLoadPlanner option) those the
    checkpoint lacks are dropped (left as they are), as DCP does."""
    stored = manifest["tensors"]
    objects = json.loads(manifest["metadata"].get(_OBJECTS_KEY, "{}"))
    if allow_partial_load:
        items = [i for i in items if i.key in stored]
    for item in items:
        key = item.key
        if key not in stored:
            raise _errors.NotFound(f"state-dict key {key} is not in the checkpoint"
                                   f"{_empty_hint(item, stored)}", key=key)
        if (item.kind == "object") != (key in objects):
            raise _errors.InvalidArgument(
                f"state-dict key {key} is a {'non-tensor value' if item.kind == 'object' else 'tensor'}"
                f" here but the checkpoint holds a "
                f"{'non-tensor value' if key in objects else 'tensor'}", key=key)
        dtype, shape = stored[key]
        if item.kind == "object":
            item.global_shape, item.digest = tuple(shape), objects[key]
            continue
        if dtype != item.dtype:
            raise _errors.InvalidArgument(f"tensor {key}: the checkpoint holds {dtype}, the state "
                                          f"dict {item.dtype}", key=key)
        if tuple(shape) != tuple(item.global_shape):
            raise _errors.InvalidArgument(
                f"tensor {key}: the checkpoint holds shape {tuple(shape)}, the state dict "
                f"{tuple(item.global_shape)}", key=key)
    return items


def _empty_hint(item, stored):
    """Why an empty dict (a fresh optimizer's ``state``) is missing from a checkpoint that holds
    keys below it."""
    from collections.abc import Mapping

    value = item.leaf.value
    below = sorted(k for k in stored if k.startswith(item.key + "."))
    if item.kind != "object" or not below or not isinstance(value, Mapping) or value:
        return ""
    return (f": it is empty here, the checkpoint holds {below[0]} and {len(below) - 1} more "
            "keys below it (an optimizer whose state is not initialized yet? "
            "torch.distributed.checkpoint.state_dict.get_state_dict initializes it)")


def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, no_dist=False, strict=False, trust_pickles=False, groups=None):
    """Collective: fills ``state_dict`` in place from the checkpoint ``checkpoint_id``, saved
    from any world size and layout: tensors, DTensor local pieces and ShardedTensor local shards
    are written in place, meta-device tensors and DTensors replaced by loaded ones (as DCP),
    non-tensor values are replaced in their containers; a top-level Stateful value is loaded
    into its ``state_dict()``, which is then handed to its ``load_state_dict()``. The state dict
    may hold a subset of the checkpoint's keys, in any order. Raises (on every rank) naming the
    key: ckpt.NotFound for a key the checkpoint lacks (unless DCP's
    ``DefaultLoadPlanner(allow_partial_load=True)``), ckpt.InvalidArgument for a shape or dtype
    mismatch, and with ``strict`` for a key of the checkpoint no rank's state dict holds.
    ``storage_reader``: DCP's FileSystemReader, for its path; ``no_dist``: this process alone.
    Non-tensor values are unpickled as plain data only unless ``trust_pickles``. ``groups``:
    process groups each reading what its ranks need and exchanging within itself (see
    ckpt.Client.load)."""
    pg = _group(process_group, no_dist)
    from ckpt import _dcp_read  # a directory DCP wrote (issue 41, item 4): read in place

    if _dcp_read.is_dcp_checkpoint(checkpoint_id, storage_reader):
        return _dcp_read.load(state_dict, checkpoint_id=checkpoint_id,
                              storage_reader=storage_reader, planner=planner, process_group=pg,
                              strict=strict, trust_pickles=trust_pickles)
    path, items, manifest, error = None, [], None, None
    stateful_keys, loaded = _stateful_keys(state_dict), state_dict
    try:
        path = _path(checkpoint_id, storage_reader, "ckpt.torch.load")
        options = _dcp_options.load_planner(planner, "ckpt.torch.load")
        loaded = _with_states(state_dict, stateful_keys)
        if loaded is state_dict and any(_has_meta(v) for v in state_dict.values()):
            loaded = dict(state_dict)  # meta tensors are replaced in a copy, handed back
        items = _classify(_init_meta(_flatten.flatten(loaded), pg))
        manifest = read_manifest(path)
        items = _check_against_manifest(items, manifest, options.allow_partial_load)
    except _errors.Error as e:
        error = e
    per_rank = _agree(error, _describe(items), pg)
    if strict:
        _refuse_extra_keys(manifest, per_rank)
    _check_agreement(per_rank)
    _load_items(path, items, per_rank, pg, trust_pickles, groups)
    _hand_back(state_dict, loaded, stateful_keys)


def load_state_dict(state_dict, storage_reader, process_group=None, coordinator_rank=0,
                    no_dist=False, planner=None):
    """DCP's older name for ``load`` (its signature: ``storage_reader`` positional, carrying
    the path). ``coordinator_rank`` has no meaning for ckpt, whose coordinator daemon plans."""
    return load(state_dict, storage_reader=storage_reader, planner=planner,
                process_group=process_group, no_dist=no_dist)


def _has_meta(value):
    from collections.abc import Mapping

    if isinstance(value, torch.Tensor):
        return value.device.type == "meta"
    if isinstance(value, Mapping):
        return any(_has_meta(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_meta(v) for v in value)
    return False


def _refuse_extra_keys(manifest, per_rank):
    everyone = set().union(*map(set, per_rank))
    extra = sorted(set(manifest["tensors"]) - everyone)
    if extra:
        raise _errors.InvalidArgument(
            f"the checkpoint holds key {extra[0]} that no rank's state dict has"
            f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}; pass strict=False"
            " to ignore such keys", key=extra[0])


def _load_items(path, items, per_rank, pg, trust_pickles, groups):
    """Loads the agreed items: tensors in place, non-tensor values assigned to their leaves."""
    rank, _ = _group_rank_world(pg)
    ids = _replica_ids(per_rank, rank)
    client = get_client(pg)
    # Tensors through the same (cached) state dict a save of them uses: its staging buffers
    # are allocated once. Non-tensor values, whose stored sizes vary, in a second small load.
    tensors = [i for i in items if i.kind != "object"]
    objects = [i for i in items if i.kind == "object"]
    if tensors or not objects:
        client.load(path, _save_state(client, tensors, ids), groups=groups)
    if objects:
        import numpy as np

        state = client.state_dict()
        buffers = {}
        for item in objects:
            buffers[item.key] = np.empty(item.global_shape, dtype=np.uint8)
            state.add(item.key, buffers[item.key], Replicated(1))
        client.load(path, state, groups=groups)
    for item in objects:
        value = _objects.decode(buffers[item.key].tobytes(), item.key, item.digest,
                                trust_pickles, path=path)
        _flatten.assign(item.leaf, value)


def _hand_back(state_dict, loaded, stateful_keys):
    """As DCP's load: each Stateful gets ``load_state_dict()`` of its loaded state dict (whose
    tensors were filled in place and values replaced), and the other top-level values replaced
    in the caller's dict take their new values there."""
    if loaded is state_dict:
        return
    for key in stateful_keys:
        state_dict[key].load_state_dict(loaded[key])
    stateful = set(stateful_keys)
    for key, value in loaded.items():
        if key not in stateful and state_dict[key] is not value:
            state_dict[key] = value
