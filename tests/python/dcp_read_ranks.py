"""Per-rank bodies of dcp_read_test.py: each runs in a process torch.multiprocessing spawned,
over gloo on the CPU, meeting through a file rendezvous. Phase "save" writes a checkpoint with
torch.distributed.checkpoint itself on 2 ranks; phase "load" reads it with ckpt.torch.load on 3
ranks into another sharding and checks every element bit for bit."""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import torch_ranks  # beside this file


def expected():
    """The full values every phase agrees on (the same on every rank)."""
    g = torch.Generator().manual_seed(41)
    return {
        "w": torch.randn(7, 5, generator=g),
        "emb": torch.randn(6, 4, generator=g).to(torch.bfloat16),
        "bias": torch.randn(5, generator=g, dtype=torch.float64),
        "rows": torch.randn(7, 3, generator=g),
    }


def _join(rank, world, rendezvous, job):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), CKPT_JOB=job)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def phase_save(rank, world, rendezvous, job, workdir):
    """DCP's own save: rows of w and columns of emb over 2 ranks, bias plain, values below."""
    mesh = _join(rank, world, rendezvous, job)
    full = expected()
    sd = {
        "model": {
            "w": distribute_tensor(full["w"], mesh, [Shard(0)]),
            "emb": distribute_tensor(full["emb"], mesh, [Shard(1)]),
            "bias": full["bias"].clone(),
            "rows": distribute_tensor(full["rows"], mesh, [Shard(1)]),
        },
        "step": 7,
        "extra": {"note": "from dcp", "lrs": [0.1, 0.01]},
        "param_groups": [{"lr": 0.25, "params": ["model.w"]}],
    }
    dcp.save(sd, checkpoint_id=os.path.join(workdir, "dcp"))


def _bits(t):
    """The tensor's bytes, for a bit-for-bit comparison (NaN payloads and -0.0 included)."""
    return t.contiguous().view(torch.uint8)


def phase_load(rank, world, rendezvous, job, workdir):
    """ckpt.torch.load on 3 ranks: w by columns (uneven: 2, 2, 1), emb replicated, rows (saved
    as a DTensor by columns) into a ShardedTensor by rows (3, 3, 1), into the caller's own
    tensors (same objects, same memory), values replaced in their containers."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    import ckpt.torch

    mesh = _join(rank, world, rendezvous, job)
    full = expected()
    w = distribute_tensor(torch.zeros(7, 5), mesh, [Shard(1)])
    emb = distribute_tensor(torch.zeros(6, 4, dtype=torch.bfloat16), mesh, [Replicate()])
    bias = torch.zeros(5, dtype=torch.float64)
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    rows = sharded_tensor.zeros(spec, 7, 3)
    pointers = (w.to_local().data_ptr(), emb.to_local().data_ptr(), bias.data_ptr())
    extra = {"note": "unset", "lrs": []}
    sd = {"model": {"w": w, "emb": emb, "bias": bias, "rows": rows}, "step": 0, "extra": extra,
          "param_groups": [{"lr": 0.0, "params": []}]}
    ckpt.torch.load(sd, checkpoint_id=os.path.join(workdir, "dcp"))
    model = sd["model"]
    assert model["w"] is w and model["emb"] is emb and model["bias"] is bias
    assert pointers == (w.to_local().data_ptr(), emb.to_local().data_ptr(), bias.data_ptr())
    columns = [(0, 2), (2, 2), (4, 1)][rank]
    want_w = full["w"].narrow(1, *columns)
    assert torch.equal(_bits(w.to_local()), _bits(want_w)), f"rank {rank}: w's columns differ"
    assert torch.equal(_bits(emb.to_local()), _bits(full["emb"])), f"rank {rank}: emb differs"
    assert torch.equal(_bits(bias), _bits(full["bias"])), f"rank {rank}: bias differs"
    assert torch.equal(_bits(w.full_tensor()), _bits(full["w"]))
    assert model["rows"] is rows
    (shard,) = rows.local_shards()
    want_rows = full["rows"].narrow(0, [0, 3, 6][rank], [3, 3, 1][rank])
    assert torch.equal(_bits(shard.tensor), _bits(want_rows)), f"rank {rank}: rows differ"
    assert sd["step"] == 7
    assert sd["extra"] is extra and extra == {"note": "from dcp", "lrs": [0.1, 0.01]}
    assert sd["param_groups"] == [{"lr": 0.25, "params": ["model.w"]}]


PHASES = {"save": phase_save, "load": phase_load}


def run(rank, world, rendezvous, job, phase, workdir):
    """Runs `phase` on this rank; writes <workdir>/<phase>.r<rank>.err on failure."""
    torch_ranks.run_phase(PHASES, rank, world, rendezvous, job, phase, workdir)
