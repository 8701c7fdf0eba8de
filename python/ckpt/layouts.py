"""Where a rank's piece of a tensor sits in the global tensor.

* ``Box(global_shape, offsets)``: an N-d box starting at ``offsets``; its lengths are the local
  tensor's shape (Megatron's ShardedTensor ``global_offset``); ``Box(..., lengths=,
  flat=(start, stop))`` narrows the box to a range of its row-major flattening (Megatron's
  ``flattened_range``).
* ``Flat(global_shape, start, stop)``: elements ``[start, stop)`` of the whole tensor's
  row-major flattening (ZeRO/FSDP1 flat parameters, Megatron's ShardedFlatTensor).
* ``Replicated(replica_id)``: the whole tensor (global shape = the local tensor's shape).
* ``DTensor(global_shape, mesh_shape, placements, coordinate)``: PyTorch DTensor placements
  (``Shard(dim)`` / ``Replicate()`` per mesh dimension) over a device mesh, this rank at
  ``coordinate``; the piece follows torch.chunk exactly as DTensor computes it.

Every layout takes ``replica_id`` as Megatron uses it (an int or a tuple of ints): all zeros
marks the main replica, the copy that is written; each element must be held by exactly one
main replica across the job. For ``DTensor`` the id is appended to the mesh's own (the
coordinates along its ``Replicate()`` dims): use it to tell apart copies of a whole mesh.
The regions are computed by ckpt's C++ sharding rules (``ckpt.resolve``), not in Python.
"""

from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

from ckpt import _ckpt


def _ids(replica_id):
    if replica_id is None:
        return []
    if isinstance(replica_id, int):
        return [replica_id]
    return [int(r) for r in replica_id]


def _shape(shape):
    return [int(d) for d in shape]


@dataclass(frozen=True)
class Shard:
    """Split tensor dim ``dim`` over a mesh dimension (torch.chunk)."""

    dim: int


@dataclass(frozen=True)
class Replicate:
    """The whole tensor (along this mesh dimension) on every coordinate."""


@dataclass(frozen=True)
class Box:
    """An N-d box at ``offsets``. Its lengths are the local tensor's shape unless given; with
    ``flat=(start, stop)`` the local tensor holds that range of the box's row-major flattening
    (Megatron's ``flattened_range``), and ``lengths`` must be given."""

    global_shape: Sequence[int]
    offsets: Sequence[int]
    lengths: Optional[Sequence[int]] = None
    flat: Optional[Tuple[int, int]] = None
    replica_id: object = 0

    def _native(self, key, local_shape):
        from ckpt.errors import InvalidArgument

        if self.flat is not None and self.lengths is None:
            raise InvalidArgument(f"tensor {key}: Box(flat=...) needs the box's lengths", key=key)
        lengths = _shape(self.lengths if self.lengths is not None else local_shape)
        flat = None if self.flat is None else (int(self.flat[0]), int(self.flat[1]))
        native = _ckpt.box_layout(_shape(self.offsets), lengths, flat)
        return _shape(self.global_shape), native, _ids(self.replica_id)


@dataclass(frozen=True)
class Flat:
    global_shape: Sequence[int]
    start: int
    stop: int
    replica_id: object = 0

    def _native(self, key, local_shape):
        return _shape(self.global_shape), _ckpt.flat_layout(int(self.start), int(self.stop)), _ids(
            self.replica_id)


@dataclass(frozen=True)
class Replicated:
    replica_id: object = 0

    def _native(self, key, local_shape):
        shape = _shape(local_shape)
        return shape, _ckpt.box_layout([0] * len(shape), shape), _ids(self.replica_id)


def _placement(p):
    """Shard(dim) -> dim, Replicate() -> None; also accepts torch's placement objects."""
    if isinstance(p, Shard):
        return int(p.dim)
    if isinstance(p, Replicate):
        return None
    name = type(p).__name__
    if name == "Shard" and hasattr(p, "dim"):
        return int(p.dim)
    if name == "Replicate":
        return None
    raise ValueError(f"placement {p!r} is not Shard(dim) or Replicate()")


@dataclass(frozen=True)
class DTensor:
    global_shape: Sequence[int]
    mesh_shape: Sequence[int]
    placements: Sequence[object]
    coordinate: Sequence[int]
    replica_id: object = field(default=())

    def mesh_rank(self):
        """Row-major index of ``coordinate`` in the mesh."""
        rank = 0
        for c, n in zip(self.coordinate, self.mesh_shape):
            rank = rank * int(n) + int(c)
        return rank

    def _native(self, key, local_shape):
        from ckpt.errors import InvalidArgument

        if len(self.coordinate) != len(self.mesh_shape):
            raise InvalidArgument(
                f"tensor {key}: coordinate {tuple(self.coordinate)} does not match mesh shape "
                f"{tuple(self.mesh_shape)}", key=key)
        try:
            placements = [_placement(p) for p in self.placements]
        except ValueError as e:
            raise InvalidArgument(f"tensor {key}: {e}", key=key) from None
        native = _ckpt.mesh_layout(_shape(self.mesh_shape), placements, self.mesh_rank())
        return _shape(self.global_shape), native, _ids(self.replica_id)


@dataclass(frozen=True)
class Region:
    """A resolved piece: box ``offsets``/``lengths``, optional ``flat`` range, replica id."""

    offsets: Tuple[int, ...]
    lengths: Tuple[int, ...]
    flat: Optional[Tuple[int, int]]
    replica_id: Tuple[int, ...]

    @property
    def numel(self):
        if self.flat is not None:
            return self.flat[1] - self.flat[0]
        n = 1
        for d in self.lengths:
            n *= d
        return n

    @property
    def is_main_replica(self):
        return all(r == 0 for r in self.replica_id)


def resolve(layout, local_shape=(), rank=0, key="tensor"):
    """The region and replica id ``layout`` gives rank ``rank`` (ckpt's C++ sharding rules).

    ``local_shape`` is the local tensor's shape (Box and Replicated take their lengths from
    it); ``rank`` matters only for a DTensor layout without a coordinate."""
    global_shape, native, replica = layout._native(key, local_shape)
    offsets, lengths, flat, replica_id = _ckpt.resolve_layout(key, global_shape, native, replica,
                                                              int(rank))
    return Region(tuple(offsets), tuple(lengths), tuple(flat) if flat is not None else None,
                  tuple(replica_id))
