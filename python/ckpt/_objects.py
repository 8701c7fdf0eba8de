"""Non-tensor state-dict values (ints, floats, strings, small picklable objects such as an LR
scheduler's state): pickled, stored as a 1-d uint8 tensor under their key, and read back with
an unpickler that only builds plain data unless the caller trusts the checkpoint."""

import hashlib
import io
import pickle

# Globals a plain-data pickle may name: builtin containers and scalars.
_SAFE = {
    ("builtins", n)
    for n in ("set", "frozenset", "complex", "slice", "range", "bytearray", "dict", "list",
              "tuple", "int", "float", "str", "bytes", "bool")
} | {("collections", n) for n in ("OrderedDict", "defaultdict", "deque")}


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, data, key):
        super().__init__(io.BytesIO(data))
        self._key = key

    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        from ckpt.errors import PermissionDenied

        raise PermissionDenied(
            f"state-dict value {self._key} in the checkpoint needs {module}.{name} to unpickle; "
            "only plain data is built by default (pass trust_pickles=True to load it from a "
            "checkpoint you trust)", key=self._key)


def encode(value):
    """(bytes, sha256 hex) of a value."""
    data = pickle.dumps(value, protocol=4)
    return data, hashlib.sha256(data).hexdigest()


def decode(data, key, digest, trusted):
    """The value; ckpt.DataLoss naming `key` when the bytes do not match the recorded digest."""
    from ckpt.errors import DataLoss

    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise DataLoss(f"state-dict value {key}: its stored bytes do not match the checksum "
                       "recorded at save", key=key)
    if trusted:
        return pickle.loads(data)
    return _PlainUnpickler(data, key).load()
