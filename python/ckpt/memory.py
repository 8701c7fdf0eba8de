"""Tensor memory shared with the local worker daemon.

``ckpt.empty`` / ``ckpt.empty_like`` allocate tensors in POSIX shared memory that the worker
maps too: a state dict holding them is saved and loaded with no copy in the trainer (the worker
reads them at the snapshot and writes them at a load in place). Any other CPU tensor or NumPy
array added to a state dict is copied into a shared staging buffer at each save (and back after
each load); ``SaveHandle.progress().staged_bytes`` reports that copy.

The memory is zero-filled. It stays alive as long as any tensor viewing it (or a state dict
holding it) does. Segments are named after this process's pid, so a forked child cannot hand its
parent's ckpt.empty memory to its own worker session (its tensors are staged instead).
"""

import math

from ckpt import _ckpt
from ckpt import dtypes as _dtypes


def _size(size):
    if len(size) == 1 and not isinstance(size[0], int):
        size = tuple(size[0])
    return tuple(int(d) for d in size)


def empty(*size, dtype=None):
    """A zero-filled CPU tensor in worker-shared memory.

    ``size`` as for torch.empty (``empty(2, 3)`` or ``empty((2, 3))``). ``dtype`` is a torch
    dtype (default: torch.get_default_dtype()) giving a torch.Tensor, or a NumPy dtype giving a
    numpy.ndarray."""
    shape = _size(size)
    if dtype is None or _dtypes.is_torch_dtype(dtype):
        import torch

        dtype = dtype or torch.get_default_dtype()
        name = _dtypes.name_of(dtype)
        nbytes = math.prod(shape) * _ckpt.dtype_size(name)
        raw = torch.from_numpy(_ckpt.allocate(nbytes, f"ckpt.empty({shape}, {dtype})"))
        return raw.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)
    import numpy as np

    name = _dtypes.name_of(dtype)
    nbytes = math.prod(shape) * _ckpt.dtype_size(name)
    raw = _ckpt.allocate(nbytes, f"ckpt.empty({shape}, {dtype})")
    return raw.view(np.dtype(dtype)).reshape(shape)


def empty_like(tensor, dtype=None):
    """``empty(tensor.shape, dtype=dtype or tensor.dtype)``: torch in, torch out; NumPy in,
    NumPy out."""
    return empty(tuple(tensor.shape), dtype=dtype if dtype is not None else tensor.dtype)


def data_pointer(tensor):
    """(address, nbytes) of a CPU tensor or array, or (0, nbytes) when not contiguous."""
    if _dtypes.is_torch_dtype(getattr(tensor, "dtype", None)):
        nbytes = tensor.numel() * tensor.element_size()
        return (tensor.data_ptr() if tensor.is_contiguous() else 0), nbytes
    nbytes = tensor.nbytes
    contiguous = tensor.flags["C_CONTIGUOUS"]
    return (tensor.__array_interface__["data"][0] if contiguous else 0), nbytes


def is_shared(tensor):
    """True when ``tensor``'s bytes lie in ckpt.empty memory (saved and loaded in place)."""
    ptr, nbytes = data_pointer(tensor)
    return ptr != 0 and nbytes > 0 and _ckpt.is_shared(ptr, nbytes)
