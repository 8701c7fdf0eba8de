"""Element types: torch / NumPy dtypes <-> the safetensors names ckpt stores."""

import numpy as _np

_NUMPY = {
    _np.dtype("bool"): "BOOL",
    _np.dtype("uint8"): "U8",
    _np.dtype("int8"): "I8",
    _np.dtype("int16"): "I16",
    _np.dtype("uint16"): "U16",
    _np.dtype("int32"): "I32",
    _np.dtype("uint32"): "U32",
    _np.dtype("int64"): "I64",
    _np.dtype("uint64"): "U64",
    _np.dtype("float16"): "F16",
    _np.dtype("float32"): "F32",
    _np.dtype("float64"): "F64",
    _np.dtype("complex64"): "C64",
}
_NUMPY_BY_NAME = {v: k for k, v in _NUMPY.items()}


def _torch_table():
    import torch

    table = {
        torch.bool: "BOOL",
        torch.uint8: "U8",
        torch.int8: "I8",
        torch.int16: "I16",
        torch.int32: "I32",
        torch.int64: "I64",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.float32: "F32",
        torch.float64: "F64",
        torch.complex64: "C64",
    }
    for attr, name in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
                       ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                       ("float8_e8m0fnu", "F8_E8M0")):
        if hasattr(torch, attr):
            table[getattr(torch, attr)] = name
    return table


_TORCH = None


def torch_table():
    global _TORCH
    if _TORCH is None:
        _TORCH = _torch_table()
    return _TORCH


def is_torch_dtype(dtype):
    try:
        import torch
    except ImportError:
        return False
    return isinstance(dtype, torch.dtype)


def name_of(dtype, key="tensor"):
    """The safetensors name of a torch or NumPy dtype; InvalidArgument naming `key` if none."""
    from ckpt.errors import InvalidArgument

    if is_torch_dtype(dtype):
        name = torch_table().get(dtype)
    else:
        try:
            name = _NUMPY.get(_np.dtype(dtype))
        except TypeError:
            name = None
    if name is None:
        raise InvalidArgument(f"tensor {key}: dtype {dtype} cannot be stored by ckpt", key=key)
    return name


def torch_dtype(name):
    """The torch dtype of a safetensors name."""
    for dtype, n in torch_table().items():
        if n == name:
            return dtype
    raise KeyError(name)


def numpy_dtype(name):
    return _NUMPY_BY_NAME[name]
