"""Shares the trainer's CPU tensors with the worker in place, so saves and loads copy nothing.

A torch tensor that is not ``ckpt.empty`` memory is otherwise copied into shared staging at
every save and back out after every load (one extra pass over its bytes each time). Here its
storage is moved into shared memory once, in place, by PyTorch's own ``share_memory_``
mechanism (the file_system variant: a named /dev/shm file; every view of the storage, e.g.
FSDP2's padded shards, keeps pointing at it), and that file is given a second, ckpt name that
the worker maps (``SharedSegment::Link`` validates that this process maps it there). From then
on the worker writes the checkpoint from, and loads it into, the tensor's own memory.

Only storages of at least ``MIN_BYTES`` on the CPU that PyTorch allocated itself (resizable:
not NumPy's memory, not a mapped file), not yet shared with other processes, not pinned and
viewed contiguously are moved; anything else (or a move PyTorch refuses) stays on the staging
path. A process forked after the move shares those pages with its parent instead of getting
copy-on-write copies, as after ``Tensor.share_memory_()``. A registration
holds the storage alive; ``retain`` drops those nothing else holds any more and ``release`` all
of them (ckpt.torch.shutdown; tensors moved before it are staged by later saves, being shared
already). Set CKPT_TORCH_SHARE_IN_PLACE=0 to keep every tensor on the staging path.
"""

import os

from ckpt import _ckpt
from ckpt.memory import is_shared

MIN_BYTES = 1 << 20  # smaller tensors are staged: a file and a link each would cost more
_adopted = {}  # storage data_ptr -> (storage, the registration's array)


def enabled():
    return os.environ.get("CKPT_TORCH_SHARE_IN_PLACE", "1") not in ("0", "false", "no")


def _eligible(tensor):
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
        return False
    storage = tensor.untyped_storage()
    if storage.nbytes() < MIN_BYTES:
        return False
    if not storage.resizable() or storage.is_shared():
        # Memory PyTorch does not own alone (NumPy's, a mapped file) or already shared with
        # other processes: moving it would part this tensor from the memory it aliases.
        return False
    try:
        if tensor.is_pinned():
            return False  # page-locked memory belongs to the CUDA driver: leave it be
    except RuntimeError:  # pragma: no cover (builds that cannot answer)
        return False
    return True


def _adopt(storage, key):
    """Moves ``storage`` into a named shared-memory file (in place) and registers it."""
    _, name, nbytes = storage._share_filename_cpu_()
    name = name.decode() if isinstance(name, bytes) else name
    file_bytes = os.stat("/dev/shm" + name).st_size
    header = file_bytes - nbytes  # PyTorch's refcount header before the data
    base = storage.data_ptr() - header
    if not 0 <= header <= 4096 or base % 4096:
        return None
    return _ckpt.adopt_shared_file(name, base, file_bytes, key)


def share(key, tensor):
    """Shares ``tensor``'s storage with the worker in place when it can; returns whether its
    bytes are now worker-shared (saved and loaded without a copy)."""
    if not enabled() or tensor.device.type != "cpu":
        return False
    storage = tensor.untyped_storage()
    if storage.data_ptr() in _adopted:
        return True
    if not _eligible(tensor):
        return False
    if is_shared(tensor):
        return True  # ckpt.empty memory
    try:
        registration = _adopt(storage, key)
    except Exception:  # noqa: BLE001 (PyTorch or the validation refused: stage it instead)
        return False
    if registration is None:
        return False
    _adopted[storage.data_ptr()] = (storage, registration)
    return True


def _only_ours(storage):
    """Whether nothing but the registration holds ``storage`` any more."""
    import torch

    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is None or use_count(storage._cdata) <= 1


def retain(tensors):
    """Drops the registrations of storages that none of ``tensors`` views and that nothing
    else holds any more (so a state dict saved in turn with another keeps its registrations:
    a storage moved once is never eligible again, being shared, and would be staged)."""
    keep = {t.untyped_storage().data_ptr() for t in tensors if t.device.type == "cpu"}
    for ptr in [p for p, (s, _) in _adopted.items() if p not in keep and _only_ours(s)]:
        del _adopted[ptr]


def release():
    """Drops every registration (the storages stay in PyTorch's shared memory)."""
    _adopted.clear()


def shared_bytes():
    """Bytes of the storages registered now."""
    return sum(s.nbytes() for s, _ in _adopted.values())
