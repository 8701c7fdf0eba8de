"""The trainer's connection to its local worker daemon (the C++ client, client/client.h)."""

import os
import time
from dataclasses import dataclass
from typing import Optional

from ckpt import _ckpt
from ckpt import dtypes as _dtypes
from ckpt import errors as _errors
from ckpt.layouts import Replicated
from ckpt.memory import data_pointer

_FOREVER = 10 * 365 * 24 * 3600.0


def _is_torch(tensor):
    return _dtypes.is_torch_dtype(getattr(tensor, "dtype", None))



def _groups_text(groups):
    """Process groups as the spec text the coordinator reads: a string as given, a list of
    rank lists as "0,1;2,3", None as "" (one group of every rank)."""
    if groups is None:
        return ""
    if isinstance(groups, str):
        return groups
    return ";".join(",".join(str(int(rank)) for rank in group) for group in groups)

class _Entry:
    """One tensor of a state dict: the caller's tensor and, when staged, its shared copy."""

    __slots__ = ("key", "tensor", "staging", "nbytes")

    def __init__(self, key, tensor, staging, nbytes):
        self.key, self.tensor, self.staging, self.nbytes = key, tensor, staging, nbytes


class StateDict:
    """Tensors this rank saves and loads, each with its layout. Make one with
    ``Client.state_dict()``; add tensors with ``add``."""

    def __init__(self, native):
        self._native = native
        self._entries = {}  # key -> its (first) piece
        self._more = []  # further pieces of keys in _entries (several shards of one tensor)
        self._lent_to = None  # the SaveHandle of a save its staging is lent to, until it ends

    def add(self, key, tensor, layout=None, *, stage=False):
        """Adds ``tensor`` (a CPU torch.Tensor or a NumPy array) under ``key`` with ``layout``
        (default ``Replicated()``). Tensors from ``ckpt.empty`` are used in place (unless
        ``stage``); any other is copied into shared staging memory at each save and back after
        each load. A CUDA tensor (contiguous) is shared with the worker through its allocation's
        CUDA IPC handle: the worker saves from and loads into device memory directly (its
        worker must serve that GPU; docs/python.md). Other devices are refused.

        A key may be added again with another piece of the same tensor (a layout at other
        offsets: several shards of one tensor on this rank); a piece overlapping one already
        added raises ckpt.AlreadyExists, another dtype or global shape ckpt.InvalidArgument.
        ``state[key]`` is then the first piece added."""
        if not isinstance(key, str) or not key:
            raise _errors.InvalidArgument(f"state-dict key {key!r} is not a non-empty string")
        layout = layout if layout is not None else Replicated()
        if _is_torch(tensor):
            if tensor.device.type not in ("cpu", "cuda"):
                raise _errors.Unimplemented(
                    f"tensor {key} is on {tensor.device}: ckpt saves and loads CPU and CUDA "
                    "tensors only; move it to one of those", key=key)
            if tensor.requires_grad:
                tensor = tensor.detach()  # same storage; loads write it in place
            if tensor.device.type == "cuda":
                return self._add_device(key, tensor, layout)
        elif not hasattr(tensor, "__array_interface__"):
            raise _errors.InvalidArgument(
                f"tensor {key} is a {type(tensor).__name__}, not a torch.Tensor or NumPy array",
                key=key)
        shape = tuple(int(d) for d in tensor.shape)
        dtype = _dtypes.name_of(tensor.dtype, key)
        global_shape, native_layout, replica = layout._native(key, shape)
        ptr, nbytes = data_pointer(tensor)
        raw = self._native.add(key, dtype, global_shape, native_layout, replica,
                               0 if stage else ptr, nbytes)
        staging = None if raw is None else self._view(raw, tensor)
        self._keep(_Entry(key, tensor, staging, nbytes))
        return self

    def _keep(self, entry):
        if entry.key in self._entries:
            self._more.append(entry)
        else:
            self._entries[entry.key] = entry

    def _all(self):
        """Every piece: the first of each key, then the further ones."""
        yield from self._entries.values()
        yield from self._more

    def _add_device(self, key, tensor, layout):
        """A CUDA tensor, registered in place (never staged: the worker copies it off the device
        before a save returns, through its pinned pool)."""
        if not tensor.is_contiguous():
            raise _errors.InvalidArgument(
                f"tensor {key} on {tensor.device} is not contiguous: device tensors are shared "
                "in place and must be (use .contiguous() and keep that tensor)", key=key)
        shape = tuple(int(d) for d in tensor.shape)
        dtype = _dtypes.name_of(tensor.dtype, key)
        global_shape, native_layout, replica = layout._native(key, shape)
        self._native.add_device(key, dtype, global_shape, native_layout, replica,
                                tensor.data_ptr(), tensor.device.index or 0)
        self._keep(_Entry(key, tensor, None, tensor.numel() * tensor.element_size()))
        return self

    @staticmethod
    def _view(raw, tensor):
        """The staging bytes viewed with the tensor's dtype and shape."""
        if _is_torch(tensor):
            import torch

            t = torch.from_numpy(raw)
            return t.view(tensor.dtype).view(tensor.shape) if raw.size else t
        return raw.view(tensor.dtype).reshape(tensor.shape)

    def __contains__(self, key):
        return key in self._entries

    def __len__(self):
        return len(self._entries)

    def keys(self):
        return list(self._entries)

    def description_bytes(self):
        """How large the description of these tensors is that this rank's worker sends the
        coordinator at each save or load: ``{"compact_bytes", "full_bytes", "compact_tensors",
        "pieces"}``. DTensor layouts travel compactly (placements over the mesh and this rank's
        coordinate; the coordinator expands them); ``full_bytes`` is the size listing every
        piece instead."""
        return dict(self._native.description_bytes())

    def __getitem__(self, key):
        return self._entries[key].tensor

    @property
    def shared_bytes(self):
        """Bytes saved and loaded in place (ckpt.empty memory)."""
        return sum(e.nbytes for e in self._all() if e.staging is None)

    @property
    def staged_bytes(self):
        """Bytes copied into (and out of) shared staging memory at each save (load)."""
        return sum(e.nbytes for e in self._all() if e.staging is not None)

    def _await_lent(self):
        """Waits until the save the staging buffers were lent to has ended (committed or
        aborted: its own handle reports how), so that they may be written again."""
        handle, self._lent_to = self._lent_to, None
        if handle is not None and handle._lent_state is not None:
            try:
                handle.wait()
            except _errors.Error:
                pass  # the save's outcome belongs to its handle; the buffers are free either way

    def _stage_in(self):
        """Copies staged tensors into their shared staging buffers (before a save)."""
        self._await_lent()
        for e in self._all():
            if e.staging is not None and e.nbytes:
                if _is_torch(e.tensor):
                    e.staging.copy_(e.tensor)
                else:
                    e.staging[...] = e.tensor
        return self.staged_bytes

    def _stage_out(self):
        """Copies loaded values from staging into the caller's tensors (after a load)."""
        self._await_lent()
        for e in self._all():
            if e.staging is not None and e.nbytes:
                if _is_torch(e.tensor):
                    e.tensor.copy_(e.staging)
                else:
                    e.tensor[...] = e.staging


def _transfer_version(name, version):
    """`version` as an int the C++ client takes (int64), or InvalidArgument naming the name; the
    C++ client refuses negative versions and the one after 2^63-1 (NextTransferVersion)."""
    v = int(version)
    if not -(2**63) <= v < 2**63:
        raise _errors.InvalidArgument(
            f"xfer://{name}: version {v} is out of range (a version is a positive 63-bit integer)")
    return v


@dataclass
class Progress:
    """Where a save stands."""

    phase: str  # gathering, planning, executing, committing, done, aborted
    bytes_done: int
    bytes_total: int
    snapshotted: bool  # this rank's state is copied into worker memory
    error: Optional[_errors.Error]  # the diagnosis when aborted
    staged_bytes: int  # copied by this process into shared staging before the snapshot
    shared_bytes: int  # saved in place from ckpt.empty memory
    worker_copied_bytes: int  # host bytes the worker copied out of shared memory (snapshot)
    lent_bytes: int  # host bytes lent until durable: written in place, not copied again
    device_bytes: int  # bytes staged off the device through the worker's pinned pool
    device_over_pinned_budget: bool  # the device bytes exceeded the pinned budget
    snapshot_waited_for_writes: bool  # so save() returned after part of them was written
    bytes_written_before_snapshot: int  # device bytes written before save() returned


def _status_error(code, message):
    return None if code == 0 else _errors.BY_CODE.get(code, _errors.Internal)(message)


class SaveHandle:
    """A save in flight: returned once this rank's state is snapshotted.

    ``staged_bytes``: copied by this process into shared staging; ``shared_bytes``: ckpt.empty
    memory; ``worker_copied_bytes``: copied again by the worker at the snapshot (memory not
    lent); ``lent_bytes``: written by the worker straight from shared memory (staging, and with
    ``lend=True`` every tensor), which the state dict keeps busy until the save ends;
    ``device_bytes`` / ``device_over_pinned_budget``: device staging; over the budget,
    ``snapshot_waited_for_writes`` and ``bytes_written_before_snapshot``: save() returned only
    after that many device bytes were written (see docs/python.md)."""

    def __init__(self, native, staged_bytes, shared_bytes, state=None):
        self._native = native
        self.staged_bytes = staged_bytes
        self.shared_bytes = shared_bytes
        self.stage_seconds = 0.0  # copying staged tensors into shared memory
        self.snapshot_seconds = 0.0  # until save() returned (staging included)
        snapshot = native.snapshot()
        self.worker_copied_bytes = snapshot["copied_bytes"]
        self.lent_bytes = snapshot["lent_bytes"]
        self.device_bytes = snapshot["device_bytes"]
        self.device_over_pinned_budget = snapshot["device_over_pinned_budget"]
        self.snapshot_waited_for_writes = snapshot["snapshot_waited_for_writes"]
        self.bytes_written_before_snapshot = snapshot["bytes_written_before_snapshot"]
        # Lent memory stays alive (and unwritten by this package) until the save ended.
        self._lent_state = state if self.lent_bytes else None

    @property
    def operation_id(self):
        return self._native.operation_id

    def wait(self, timeout=None):
        """Blocks until the checkpoint is committed (durable). Raises the abort diagnosis
        (a ckpt.Error), or ckpt.DeadlineExceeded after ``timeout`` seconds (the save goes on)."""
        try:
            self._native.wait(_FOREVER if timeout is None else float(timeout))
            self._lent_state = None
        except _errors.DeadlineExceeded:
            raise  # still running: the lent memory stays lent
        except _errors.Error:
            self._lent_state = None  # ended (aborted): the lent memory is free again
            raise

    def progress(self):
        p = self._native.progress()
        return Progress(p["phase"], p["bytes_done"], p["bytes_total"], p["snapshotted"],
                        _status_error(p["code"], p["message"]), self.staged_bytes,
                        self.shared_bytes, self.worker_copied_bytes, self.lent_bytes,
                        self.device_bytes, self.device_over_pinned_budget,
                        self.snapshot_waited_for_writes, self.bytes_written_before_snapshot)


class PublishHandle:
    """A publish in flight (Client.publish): its version, and wait() until it is readable."""

    def __init__(self, native):
        self._native = native

    @property
    def version(self):
        return self._native.version

    @property
    def operation_id(self):
        return self._native.operation_id

    def wait(self, timeout=None):
        """Returns once receivers can read the version; raises the diagnosis otherwise."""
        self._native.wait(3600.0 * 24 if timeout is None else float(timeout))


@dataclass
class Received:
    """What ``Client.receive`` delivered: the published ``name`` and its ``version``."""
    name: str
    version: int


@dataclass
class PollResult:
    kind: str  # "save" or "load"
    path: str
    operation_id: str


def _worker_address(worker_address, socket, job, rank, world_size, local_rank):
    """Explicit address or socket; else CKPT_WORKER_ADDRESS (the C++ client reads it); else
    ``unix:$CKPT_WORKER_DIR/worker-<local rank>.sock`` (what ckpt.LocalCluster exports)."""
    if worker_address is not None:
        return worker_address
    if socket is not None:
        return "unix:" + os.fspath(socket)
    directory = os.environ.get("CKPT_WORKER_DIR")
    if directory and not os.environ.get("CKPT_WORKER_ADDRESS"):
        o = _ckpt.resolve_options(job=job, rank=rank, world_size=world_size,
                                  local_rank=local_rank, worker_address="unix:unused")
        return f"unix:{directory}/worker-{o['local_rank']}.sock"
    return None


class Client:
    """This rank's connection to its local worker daemon.

    Rank, world size, local rank and job come from the keywords, else the launcher's
    environment as the C++ client resolves them (torchrun RANK/WORLD_SIZE/LOCAL_RANK, SLURM,
    Open MPI; job from CKPT_JOB, TORCHELASTIC_RUN_ID or SLURM_JOB_ID). The worker is at
    ``worker_address`` ("unix:/path"), ``socket`` (a path), $CKPT_WORKER_ADDRESS,
    $CKPT_WORKER_DIR/worker-<local rank>.sock, or /tmp/ckpt-worker-<uid>-<local rank>.sock.
    Waits up to ``rpc_timeout`` seconds for the worker to come up."""

    def __init__(self, *, job=None, rank=None, world_size=None, local_rank=None,
                 worker_address=None, socket=None, rpc_timeout=10.0):
        address = _worker_address(worker_address, socket, job, rank, world_size, local_rank)
        self._native = _ckpt.Client.connect(job=job, rank=rank, world_size=world_size,
                                            local_rank=local_rank, worker_address=address,
                                            rpc_timeout_s=float(rpc_timeout))
        self._options = self._native.options()

    job = property(lambda self: self._options["job"])
    rank = property(lambda self: self._options["rank"])
    world_size = property(lambda self: self._options["world_size"])
    local_rank = property(lambda self: self._options["local_rank"])
    worker_address = property(lambda self: self._options["worker_address"])
    launcher = property(lambda self: self._options["launcher"])
    worker_id = property(lambda self: self._options["worker_id"])

    def state_dict(self):
        """A new, empty state dict of this rank."""
        return StateDict(self._native.new_state_dict())

    def share(self, state):
        """Describes ``state`` to the worker now (save and load do it themselves): validates
        layouts and memory early."""
        self._native.share(state._native)

    def save(self, path, state, metadata=None, *, arrival_timeout=300.0, lend=False,
             persist_to=None, persist_overwrite=False, memory_replicas=None, groups=None,
             compression=None, overwrite=False):
        """Collective: saves ``state`` to the checkpoint directory ``path`` (absolute, or
        relative to the working directory; or an object-store URL ``s3://bucket/prefix``, sent
        as given; under the coordinator's checkpoint roots). Returns a
        SaveHandle once this rank's state is snapshotted: the tensors may be modified at once.
        ``metadata`` (str -> str) is stored in the manifest.

        Tensors that are not ckpt.empty memory are copied into shared staging here; the
        staging is lent to the worker until the save ends (it writes from it without a second
        copy), so the next save or load of ``state`` first waits for this one to end.
        ``lend=True`` also lends the ckpt.empty tensors: the caller promises not to change any
        tensor of ``state`` until ``handle.wait()`` returned (a blocking save); the worker then
        copies nothing. Without it the worker copies ckpt.empty tensors before this returns.

        Memory saves (``path`` "mem://<name>") keep the checkpoint in the workers' memory with
        ``memory_replicas`` extra copies on other hosts (None: the coordinator's default);
        ``persist_to`` (a storage path) has the coordinator persist it there in the background
        as an ordinary committed checkpoint once it is durable in memory
        (``persist_overwrite``: it may replace a committed checkpoint there). A mem://
        ``persist_to``, or one on a storage save, raises InvalidArgument.

        ``groups``: process groups the writes are distributed within, each as Megatron's
        parallelization group: a spec string ("per-node", "read-groups:K", "model-replica:K",
        "data-parallel:K") or a list of rank lists partitioning the ranks; None: one group of
        every rank. Every rank passes the same; bad groups raise ckpt.InvalidArgument naming
        the rank or group.

        ``compression``: None or "none" (raw), "zstd" or "zstd:<level>": the worker writes the
        data files losslessly compressed (docs/layout.md "Compression"); storage saves only. A
        bad spec raises ckpt.InvalidArgument naming it; on a mem:// path, ckpt.Unimplemented.

        ``overwrite``: a committed ckpt checkpoint at ``path`` may be replaced (storage saves
        only). The replacement is atomic: the old checkpoint is swapped out in one rename at the
        commit and removed after it, so a crash or a failed save leaves the old checkpoint or
        the new one, never a mix, and a reader never sees a partial one. Anything else at the
        path (a file, a DCP checkpoint, a directory holding other things) is still refused,
        ckpt.FailedPrecondition naming it. Without it an existing checkpoint raises
        ckpt.AlreadyExists; an empty directory is always saved into. Any rank asking for it
        decides; on a mem:// path, ckpt.InvalidArgument."""
        if compression is not None and not isinstance(compression, str):
            raise _errors.InvalidArgument(
                f"save of {path}: compression must be a str or None, not {compression!r}")
        start = time.perf_counter()
        staged = state._stage_in()
        staged_at = time.perf_counter()
        meta = {str(k): str(v) for k, v in (metadata or {}).items()}
        if memory_replicas is not None and int(memory_replicas) < 0:
            raise _errors.InvalidArgument(
                f"save of {path}: negative memory_replicas {memory_replicas}")
        native = self._native.save(os.fspath(path), state._native, meta, float(arrival_timeout),
                                   bool(lend), os.fspath(persist_to) if persist_to else "",
                                   bool(persist_overwrite),
                                   -1 if memory_replicas is None else int(memory_replicas),
                                   _groups_text(groups), compression or "", bool(overwrite))
        handle = SaveHandle(native, staged, state.shared_bytes, state)
        state._lent_to = handle
        handle.stage_seconds = staged_at - start
        handle.snapshot_seconds = time.perf_counter() - start
        return handle

    def load(self, path, state, *, arrival_timeout=300.0, deadline=3600.0, algorithm="",
             memory_budget_bytes=0, groups=None):
        """Collective: fills ``state``'s tensors in place from the checkpoint at ``path``,
        whatever layout it was saved from (checksums verified). ``algorithm``: "" (the
        coordinator's choice), "direct", "broadcast", "overlap_all_to_all", ...
        ``groups`` (as for save): each group reads from storage every piece its ranks need and
        exchanges only within itself (Megatron's ignore_groups with cross-group pieces)."""
        state._await_lent()
        self._native.load(os.fspath(path), state._native, float(arrival_timeout),
                          float(deadline), algorithm, int(memory_budget_bytes),
                          _groups_text(groups))
        state._stage_out()

    def publish(self, name, state, *, version=0, metadata=None, arrival_timeout=300.0):
        """Collective over this job's ranks (live transfer, the source side): publishes
        ``state`` as a version of ``name`` (``version``: e.g. the step; it must grow; 0: one
        more than this client's previous publish of the name). Returns a PublishHandle once
        this rank's bytes left its memory (the tensors may change at once);
        ``handle.wait()`` returns once receivers can read the version."""
        version = _transfer_version(name, version)
        state._stage_in()
        meta = {str(k): str(v) for k, v in (metadata or {}).items()}
        return PublishHandle(self._native.publish(str(name), state._native, version, meta,
                                                  float(arrival_timeout)))

    def receive(self, name, state, *, version=0, verify=False, arrival_timeout=300.0,
                deadline=3600.0, memory_budget_bytes=0, algorithm=None):
        """Collective over this job's ranks (live transfer, the destination side): fills
        ``state``'s tensors with the newest (or the given) ``version`` of ``name`` published by
        another job, whatever its layout, world size and hosts. All or nothing: on error
        (a source worker lost, a timeout, DataLoss in ``verify`` mode) the tensors keep the
        version they held. ``verify`` checks every received byte against its reader's
        checksum. ``algorithm``: how the source's workers send ("broadcast", the default and
        always with ``verify``; "overlap_all_to_all" sends each byte only to the ranks that
        need it). Returns a ``Received`` (``name``, ``version``): the version that arrived (the
        newest published when ``version`` was 0)."""
        version = _transfer_version(name, version)
        state._await_lent()
        got = self._native.receive(str(name), state._native, version, bool(verify),
                                   float(arrival_timeout), float(deadline),
                                   int(memory_budget_bytes), str(algorithm or ""))
        state._stage_out()
        return Received(str(name), int(got))

    def poll(self, state):
        """Call once per step: runs a save or load an operator requested (``ckptctl save|load
        --job``) on ``state``. Returns a PollResult, or None when nothing was pending."""

        def prepare(kind, path):
            if kind == "save":
                state._stage_in()

        r = self._native.poll(state._native, prepare)
        if r is None:
            return None
        if r[0] == "load":
            state._stage_out()
        return PollResult(*r)

    def close(self):
        """Says Goodbye: the worker releases this process's shared memory mappings."""
        if self._native is not None:
            self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_manifest(path):
    """A committed checkpoint's tensors ({key: (dtype, shape)}), user metadata and step."""
    return _ckpt.read_manifest(os.fspath(path))
