"""ckpt's DTensor shard computation (sharding/dtensor) against PyTorch's own.

The pinned torch (python/requirements.lock) is imported, never copied: for random meshes and
placements, torch.distributed.tensor._utils.compute_local_shape_and_global_offset runs on a
real DeviceMesh for every rank of it (a "fake" process group per rank, as torch's own tests
use, so no data moves and no peers are needed), and the same layouts go to
`ckptctl plan dtensor`. Local shapes and global offsets must be identical on every rank,
including uneven splits, empty shards (offset = the dim's global size), zero-sized dims,
several mesh dims sharding one tensor dim, and negative dims (given to ckpt as written, to
torch normalized as DTensor's user-facing APIs do). Replica ids are checked against the
DeviceMesh's own coordinates of each rank.
"""

import json
import math
import os
import random
import subprocess

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.testing._internal.distributed.fake_pg import FakeStore

CKPTCTL = os.environ["CKPTCTL"]

MESHES = [(1,), (2,), (3,), (4,), (5,), (8,), (1, 1), (2, 2), (2, 3), (3, 2), (4, 2), (1, 4),
          (2, 2, 2), (3, 1, 2), (2, 3, 4), (1, 2, 1, 3), (16,), (4, 4)]


def run_ckptctl(lines):
    text = "".join(json.dumps(line) + "\n" for line in lines)
    done = subprocess.run([CKPTCTL, "plan", "dtensor"], input=text.encode(), capture_output=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(out)["shards"] for out in done.stdout.decode().splitlines()]


def random_layout(rng, mesh_shape):
    """(global_shape, ckpt placements as text, torch placements)."""
    ndim = rng.choice([0, 1, 1, 2, 2, 3, 4])
    # Small and awkward sizes: 0, 1, primes, less than the mesh dims (empty shards), even.
    shape = [rng.choice([0, 1, 2, 3, 5, 7, 8, 12, 13, 16, 31, 64]) for _ in range(ndim)]
    texts, placements = [], []
    for _ in mesh_shape:
        if ndim == 0 or rng.random() < 0.3:
            texts.append("Replicate()")
            placements.append(Replicate())
            continue
        # Few tensor dims, so several mesh dims often shard the same one (nesting).
        dim = rng.randrange(min(ndim, 2)) if rng.random() < 0.6 else rng.randrange(ndim)
        written = dim - ndim if rng.random() < 0.2 else dim
        texts.append(f"Shard({written})")
        placements.append(Shard(dim))
    return shape, texts, placements


def torch_shards(mesh_shape, problems):
    """For each problem, [(local_shape, global_offset, replica_id)] per rank, from torch."""
    world = math.prod(mesh_shape)
    results = [[] for _ in problems]
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            mesh = DeviceMesh("cpu", torch.arange(world).view(mesh_shape), _init_backend=False)
            coordinate = mesh.get_coordinate()
            for out, (shape, _, placements) in zip(results, problems):
                local, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
                replica = [c for c, p in zip(coordinate, placements) if isinstance(p, Replicate)]
                out.append((list(local), list(offset), replica))
        finally:
            dist.destroy_process_group()
    return results


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
def test_local_shapes_and_offsets_match_torch_on_random_layouts(mesh_shape):
    rng = random.Random(hash(mesh_shape) & 0xFFFF)
    problems = [random_layout(rng, mesh_shape) for _ in range(300)]
    lines = [{"global_shape": s, "mesh_shape": list(mesh_shape), "placements": t}
             for s, t, _ in problems]
    got = run_ckptctl(lines)
    expected = torch_shards(mesh_shape, problems)
    nested = uneven = empty = 0
    for index, (problem, mine, theirs) in enumerate(zip(problems, got, expected)):
        assert [tuple(map(tuple, s)) for s in mine] == \
               [tuple(map(tuple, s)) for s in theirs], f"problem {index}: {lines[index]}"
        dims = [p.dim for p in problem[2] if isinstance(p, Shard)]
        nested += len(dims) != len(set(dims))
        empty += any(0 in s[0] and 0 not in problem[0] for s in theirs)
        uneven += len({tuple(s[0]) for s in theirs}) > 1
    if math.prod(mesh_shape) > 1:  # the generator reached the hard cases
        assert empty > 0 and uneven > 0
    if len(mesh_shape) > 1:
        assert nested > 0


def test_listed_ranks_match_the_full_listing():
    line = {"global_shape": [13, 5], "mesh_shape": [3, 4], "placements": ["Shard(0)", "Shard(0)"]}
    everything = run_ckptctl([line])[0]
    picked = run_ckptctl([dict(line, ranks=[11, 0, 7])])[0]
    assert picked == [everything[11], everything[0], everything[7]]


@pytest.mark.parametrize("line,message", [
    ({"global_shape": [4], "mesh_shape": [2], "placements": ["S(0)"]}, "placements[0]"),
    ({"global_shape": [4], "mesh_shape": [2], "placements": ["Shard(1)"]}, "out of range"),
    ({"global_shape": [4], "mesh_shape": [2, 2], "placements": ["Shard(0)"]}, "placements"),
    ({"global_shape": [4], "mesh_shape": [0], "placements": ["Replicate()"]}, "mesh_shape"),
    ({"global_shape": [4], "mesh_shape": [2], "placements": ["Replicate()"], "ranks": [2]},
     "ranks[0]"),
    ({"mesh_shape": [2], "placements": ["Replicate()"]}, "global_shape: missing"),
    # Huge and hostile: refused before anything is allocated, never a crash.
    ({"global_shape": [4], "mesh_shape": [1048577], "placements": ["Shard(0)"]},
     "more than the limit of 1048576 ranks"),
    ({"global_shape": [2**63 - 1, 2**63 - 1], "mesh_shape": [2], "placements": ["Shard(0)"]},
     "more than 2^62 elements"),
])
def test_bad_lines_are_refused_naming_the_field(line, message):
    done = subprocess.run([CKPTCTL, "plan", "dtensor"], input=(json.dumps(line) + "\n").encode(),
                          capture_output=True, timeout=60)
    assert done.returncode == 1
    assert "line 1:" in done.stderr.decode() and message in done.stderr.decode()
    assert done.stdout == b""


@pytest.mark.parametrize("text,message", [
    ('{"global_shape":' + "[" * 100000 + "]" * 100000 + "}", "nested deeper than the limit"),
    ("not json", "not valid JSON"),
], ids=["nesting-100000-deep", "not-json"])  # short ids: pytest exports the id to the child's env
def test_hostile_lines_are_refused_in_one_line(text, message):
    done = subprocess.run([CKPTCTL, "plan", "dtensor"], input=(text + "\n").encode(),
                          capture_output=True, timeout=60)
    assert done.returncode == 1
    err = done.stderr.decode()
    assert "line 1:" in err and message in err and err.count("\n") == 1
    assert done.stdout == b""
