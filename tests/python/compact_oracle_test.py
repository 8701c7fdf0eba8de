"""The coordinator's expansion of compact rank descriptions (issue 16: proto/compact_convert,
sharding/compact_layout) against PyTorch's own sharding, on the pinned torch.

* DTensor: for random (global shape, mesh shape, placements), every coordinate of a real
  DeviceMesh (a "fake" process group per rank, as torch's own tests use: no peers, no data) gets
  torch.distributed.tensor._utils.compute_local_shape_and_global_offset's local shape and global
  offset, and the piece ckpt.torch registers for it today (ckpt.layouts.resolve of the DTensor
  layout ckpt.torch builds, replica id (rid,) appended) -- the expansion must equal both.
* Flat (FSDP1 / ZeRO): part k of ``torch.flatten(t).chunk(parts)``, as FSDP1's FlatParamHandle
  shards, must be exactly the elements of the expanded flat range.
* Hostile descriptions are refused naming the tensor and the rank.
"""

import math
import random

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore

import ckpt
from ckpt import _ckpt
from ckpt.layouts import DTensor, resolve

MESHES = [(1,), (3,), (4,), (7,), (2, 2), (2, 3), (4, 2), (1, 5), (2, 2, 2), (3, 1, 2),
          (2, 3, 4), (8, 2)]


def random_problem(rng, mesh_shape):
    """(global shape, placements as ckpt's binding takes them, torch placements)."""
    ndim = rng.choice([0, 1, 1, 2, 2, 3])
    shape = [rng.choice([0, 1, 2, 3, 5, 7, 8, 12, 13, 17, 64]) for _ in range(ndim)]
    mine, theirs = [], []
    for _ in mesh_shape:
        if ndim == 0 or rng.random() < 0.3:
            mine.append(None)
            theirs.append(Replicate())
        else:
            dim = rng.randrange(min(ndim, 2)) if rng.random() < 0.6 else rng.randrange(ndim)
            mine.append(dim)
            theirs.append(Shard(dim))
    return shape, mine, theirs


def torch_pieces(mesh_shape, problems):
    """Per problem, per rank: (coordinate, local shape, global offset) from torch."""
    world = math.prod(mesh_shape)
    out = [[] for _ in problems]
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            mesh = DeviceMesh("cpu", torch.arange(world).view(mesh_shape), _init_backend=False)
            coordinate = list(mesh.get_coordinate())
            for pieces, (shape, _, placements) in zip(out, problems):
                local, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
                pieces.append((coordinate, list(local), list(offset)))
        finally:
            dist.destroy_process_group()
    return out


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
def test_expanded_dtensors_match_torch_and_what_ckpt_torch_registers(mesh_shape):
    rng = random.Random(sum((i + 1) * d for i, d in enumerate(mesh_shape)))
    problems = [random_problem(rng, mesh_shape) for _ in range(150)]
    empty = nested = 0
    for index, (problem, per_rank) in enumerate(zip(problems, torch_pieces(mesh_shape,
                                                                            problems))):
        shape, mine, theirs = problem
        rid = rng.randrange(3)
        for rank, (coordinate, local, offset) in enumerate(per_rank):
            offsets, lengths, flat, replica = _ckpt.expand_compact_dtensor(
                "w", shape, list(mesh_shape), coordinate, mine, [rid], rank)
            where = f"problem {index} {shape} {theirs} at {coordinate}"
            assert (lengths, offsets) == (local, offset), where
            assert flat is None, where
            assert replica == [c for c, p in zip(coordinate, mine) if p is None] + [rid], where
            today = resolve(DTensor(shape, mesh_shape, theirs, coordinate, replica_id=(rid,)))
            assert (tuple(offsets), tuple(lengths), tuple(replica)) == \
                (today.offsets, today.lengths, today.replica_id), where
            empty += 0 in local and 0 not in shape
        dims = [p for p in mine if p is not None]
        nested += len(dims) != len(set(dims))
    if math.prod(mesh_shape) > 2:  # the generator reached the hard cases
        assert empty > 0
    if len(mesh_shape) > 1 and math.prod(mesh_shape) > 1:
        assert nested > 0


@pytest.mark.parametrize("shape", [[0], [1], [7], [13, 5], [4, 4], [3, 0, 2], [2, 3, 7]])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8, 16])
def test_expanded_flat_parts_match_fsdp1s_chunks(shape, parts):
    numel = math.prod(shape)
    chunks = torch.flatten(torch.arange(numel)).chunk(parts)
    for part in range(parts):
        offsets, lengths, flat, replica = _ckpt.expand_compact_flat("f", shape, parts, part, [1],
                                                                    part)
        assert (offsets, lengths, replica) == ([0] * len(shape), shape, [1])
        want = chunks[part].tolist() if part < len(chunks) else []
        assert list(range(flat[0], flat[1])) == want, (shape, parts, part, flat)


@pytest.mark.parametrize("call,why", [
    (lambda: _ckpt.expand_compact_dtensor("w", [4], [2], [2], [0], [], 9), "coordinate (2,) is outside"),
    (lambda: _ckpt.expand_compact_dtensor("w", [4], [2], [0], [1], [], 9), "out of range"),
    (lambda: _ckpt.expand_compact_dtensor("w", [-4], [2], [0], [0], [], 9), "negative"),
    (lambda: _ckpt.expand_compact_dtensor("w", [4], [1 << 30, 1 << 30], [0, 0], [0, 0], [], 9),
     "device mesh"),
    (lambda: _ckpt.expand_compact_flat("w", [4], 2, 5, [], 9), "flat part 5 of 2"),
])
def test_hostile_descriptions_are_refused_naming_tensor_and_rank(call, why):
    with pytest.raises(ckpt.errors.InvalidArgument) as e:
        call()
    assert "tensor w of rank 9" in str(e.value) and why in str(e.value), str(e.value)
