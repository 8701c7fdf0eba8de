"""Nested state dicts (model + optimizer, as torch.distributed.checkpoint.state_dict returns
them) as flat lists of leaves with dotted keys, the way DCP flattens them."""

from collections.abc import Mapping


def _is_tensor(v):
    import torch

    return isinstance(v, torch.Tensor)


def _holds_tensors(v):
    if _is_tensor(v):
        return True
    if isinstance(v, Mapping):
        return any(_holds_tensors(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(_holds_tensors(x) for x in v)
    return False


class Leaf:
    """One value of a state dict: its dotted key, the container holding it and its index there
    (so a load can replace a non-tensor value in place)."""

    __slots__ = ("key", "container", "index", "value")

    def __init__(self, key, container, index, value):
        self.key, self.container, self.index, self.value = key, container, index, value

    @property
    def is_tensor(self):
        return _is_tensor(self.value)


def flatten(state_dict):
    """Leaves in traversal order. Mappings are walked (keys joined with "."); lists and tuples
    are walked by index when they hold tensors, otherwise they are one value. Two leaves with
    the same dotted key are ckpt.InvalidArgument naming it."""
    from ckpt.errors import InvalidArgument

    if not isinstance(state_dict, Mapping):
        raise InvalidArgument(f"a state dict must be a mapping, not {type(state_dict).__name__}")
    leaves, seen = [], set()

    def walk(container, index, value, path):
        if isinstance(value, Mapping) and (value or not path):
            for k, v in value.items():
                walk(value, k, v, path + [str(k)])
            return
        if isinstance(value, (list, tuple)) and _holds_tensors(value):
            for i, v in enumerate(value):
                walk(value, i, v, path + [str(i)])
            return
        key = ".".join(path)
        if key in seen:
            raise InvalidArgument(f"state-dict key {key} occurs twice after flattening nested "
                                  "containers with '.'", key=key)
        seen.add(key)
        leaves.append(Leaf(key, container, index, value))

    walk(None, None, state_dict, [])
    return leaves


def assign(leaf, value):
    """Replaces a non-tensor leaf's value in its container (dicts and lists)."""
    from ckpt.errors import InvalidArgument

    if isinstance(leaf.container, tuple):
        if leaf.container[leaf.index] != value:
            raise InvalidArgument(f"state-dict key {leaf.key} lies in a tuple; its loaded value "
                                  "cannot be assigned in place", key=leaf.key)
        return
    leaf.container[leaf.index] = value
