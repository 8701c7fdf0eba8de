"""Per-rank bodies of torch_dcp_ranks_test.py: each runs in a process torch.multiprocessing
spawned, over gloo on the CPU, as torchrun would start it. ShardedTensors (FSDP1's
SHARDED_STATE_DICT form), with one or several shards per rank, saved by ckpt.torch and by DCP
into directories made before the save, loaded back as DTensors, plain tensors and
ShardedTensors of another sharding, and saved again over a checkpoint through FileSystemWriter;
no_dist and process_group= saves of part of the job."""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import empty as sharded_empty
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import torch_ranks  # beside this file: run_phase

SHAPE = (7, 5)  # uneven over 2 ranks in both dimensions


def run(rank, world, rendezvous, job, phase, workdir):
    """Runs `phase` on this rank; writes <workdir>/<phase>.r<rank>.err on failure."""
    torch_ranks.run_phase(PHASES, rank, world, rendezvous, job, phase, workdir)


def _init(rank, world, rendezvous, job):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), CKPT_JOB=job)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)


def _full(dtype=torch.float32):
    values = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float64).reshape(SHAPE)
    return (values * 1.25 - 11).to(dtype) if dtype.is_floating_point else values.to(dtype) * -3


def _sharded(dim, full, world):
    """A ShardedTensor of `full` chunked along `dim` over the ranks (ChunkShardingSpec)."""
    spec = ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in range(world)])
    st = sharded_empty(spec, *full.shape, dtype=full.dtype)
    for shard in st.local_shards():
        shard.tensor.copy_(full[_box(shard.metadata)])
    return st


def _box(meta):
    return tuple(slice(o, o + n) for o, n in zip(meta.shard_offsets, meta.shard_sizes))


def _assert_sharded_holds(st, full, where):
    for shard in st.local_shards():
        assert torch.equal(shard.tensor, full[_box(shard.metadata)]), f"{where}: shard differs"


def _targets(mesh, world):
    """Zeroed state dicts of each form to load the saved ShardedTensors into."""
    zeros, izeros = torch.zeros(SHAPE), torch.zeros(SHAPE, dtype=torch.int64)
    return {
        "dtensor": {"st": distribute_tensor(zeros, mesh, [Shard(1)]),
                    "ist": distribute_tensor(izeros, mesh, [Replicate()]), "step": 0},
        "plain": {"st": zeros.clone(), "ist": izeros.clone(), "step": 0},
        "sharded": {"st": _sharded(1, zeros, world), "ist": _sharded(0, izeros, world),
                    "step": 0},
    }


def _check(sd, form, where):
    full, ifull = _full(), _full(torch.int64)
    assert sd["step"] == 3, where
    if form == "sharded":
        _assert_sharded_holds(sd["st"], full, where)
        _assert_sharded_holds(sd["ist"], ifull, where)
        return
    got = sd["st"].full_tensor() if form == "dtensor" else sd["st"]
    igot = sd["ist"].full_tensor() if form == "dtensor" else sd["ist"]
    assert got.dtype == full.dtype and torch.equal(got, full), f"{where}: st differs"
    assert igot.dtype == ifull.dtype and torch.equal(igot, ifull), f"{where}: ist differs"


def _empty_dir(rank, workdir, name):
    """Rank 0 makes the checkpoint directory before the save, as DCP's callers do."""
    path = os.path.join(workdir, name)
    if rank == 0:
        os.makedirs(path)
    dist.barrier()
    return path


def phase_sharded(rank, world, rendezvous, job, workdir):
    import ckpt.torch

    _init(rank, world, rendezvous, job)
    mesh = init_device_mesh("cpu", (world,))
    saved = {"st": _sharded(0, _full(), world), "ist": _sharded(1, _full(torch.int64), world),
             "step": 3}
    ckpt_path = _empty_dir(rank, workdir, "ckpt-sharded")
    dcp_path = _empty_dir(rank, workdir, "dcp-sharded")
    ckpt.torch.save(saved, checkpoint_id=ckpt_path)
    dcp.save(saved, checkpoint_id=dcp_path)
    for form in ("dtensor", "plain", "sharded"):
        from_ckpt = _targets(mesh, world)[form]
        ckpt.torch.load(from_ckpt, checkpoint_id=ckpt_path)
        _check(from_ckpt, form, f"ckpt -> {form}")
        from_dcp = _targets(mesh, world)[form]
        dcp.load(from_dcp, checkpoint_id=dcp_path)
        _check(from_dcp, form, f"dcp -> {form}")

    # The other way: DTensors and plain tensors saved by ckpt load into ShardedTensors.
    dtensors = {"st": distribute_tensor(_full(), mesh, [Shard(0)]), "ist": _full(torch.int64),
                "step": 3}
    other = os.path.join(workdir, "ckpt-dtensor")
    ckpt.torch.save(dtensors, checkpoint_id=other)
    into = _targets(mesh, world)["sharded"]
    ckpt.torch.load(into, checkpoint_id=other)
    _check(into, "sharded", "ckpt dtensor -> sharded")


def _spec_sharded(spec, full):
    """A ShardedTensor of `full` with sharding `spec` (any number of shards per rank)."""
    st = sharded_empty(spec, *full.shape, dtype=full.dtype)
    for shard in st.local_shards():
        shard.tensor.copy_(full[_box(shard.metadata)])
    return st


def _several_shards_specs():
    """Shardings of SHAPE placing several shards on one rank, as PyTorch's own DCP tests do
    (test_file_system_checkpoint_cpu's different_shard_plan and switch_between tests)."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata

    rows = EnumerableShardingSpec(shards=[
        ShardMetadata(shard_offsets=[0, 0], shard_sizes=[2, 5], placement="rank:0/cpu"),
        ShardMetadata(shard_offsets=[2, 0], shard_sizes=[1, 5], placement="rank:1/cpu"),
        ShardMetadata(shard_offsets=[3, 0], shard_sizes=[3, 5], placement="rank:0/cpu"),
        ShardMetadata(shard_offsets=[6, 0], shard_sizes=[1, 5], placement="rank:1/cpu")])
    return {"chunks": ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu",
                                                            "rank:1/cpu", "rank:0/cpu"]),
            "rows": rows}


def phase_several(rank, world, rendezvous, job, workdir):
    """Several shards of one ShardedTensor on a rank (before: refused, "this rank holds 2
    shards"): saved by ckpt.torch and by DCP, each loaded into another several-shards sharding,
    plain tensors and DTensors, bit for bit; then saved again over the same directory through
    DCP's FileSystemWriter (overwrite, its default) with another sharding and other values."""
    import ckpt.torch

    _init(rank, world, rendezvous, job)
    mesh = init_device_mesh("cpu", (world,))
    specs = _several_shards_specs()
    full, ifull = _full(), _full(torch.int64)
    saved = {"st": _spec_sharded(specs["chunks"], full),
             "ist": _spec_sharded(specs["rows"], ifull), "step": 3}
    assert len(saved["st"].local_shards()) == 2, "the test needs two shards on each rank"
    ckpt_path = _empty_dir(rank, workdir, "ckpt-several")
    dcp_path = _empty_dir(rank, workdir, "dcp-several")
    ckpt.torch.save(saved, checkpoint_id=ckpt_path)
    dcp.save(saved, checkpoint_id=dcp_path)
    zeros, izeros = torch.zeros(SHAPE), torch.zeros(SHAPE, dtype=torch.int64)
    for load, path in ((ckpt.torch.load, ckpt_path), (dcp.load, dcp_path)):
        into = {"st": _spec_sharded(specs["rows"], zeros),
                "ist": _spec_sharded(specs["chunks"], izeros), "step": 0}
        load(into, checkpoint_id=path)
        _check(into, "sharded", f"{load.__module__} several -> several")
        plain = {"st": zeros.clone(), "ist": izeros.clone(), "step": 0}
        load(plain, checkpoint_id=path)
        _check(plain, "plain", f"{load.__module__} several -> plain")
        dtensors = {"st": distribute_tensor(zeros, mesh, [Shard(0)]),
                    "ist": distribute_tensor(izeros, mesh, [Shard(1)]), "step": 0}
        load(dtensors, checkpoint_id=path)
        _check(dtensors, "dtensor", f"{load.__module__} several -> dtensor")
    # Saved again over the same directory, as the switch_between tests do (FileSystemWriter
    # overwrites by default): the new values, and only them, come back.
    again = {"st": _spec_sharded(specs["rows"], full * 3), "ist": ifull * 5, "step": 4}
    ckpt.torch.save_state_dict(again, dcp.FileSystemWriter(ckpt_path))
    back = {"st": _spec_sharded(specs["chunks"], zeros), "ist": izeros.clone(), "step": 0}
    ckpt.torch.load_state_dict(back, dcp.FileSystemReader(ckpt_path))
    _assert_sharded_holds(back["st"], full * 3, "overwritten st")
    assert torch.equal(back["ist"], ifull * 5) and back["step"] == 4, "overwritten ist, step"
    dist.barrier()
    if rank == 0:
        assert sorted(os.listdir(ckpt_path)) == ["data", "manifest.pb"]
        assert not [n for n in os.listdir(workdir) if n.startswith(".")]


def phase_part(rank, world, rendezvous, job, workdir):
    """no_dist: rank 0 saves alone, rank 1 loads alone; process_group=: a group of rank 1 only
    saves and loads while rank 0 does not take part."""
    import ckpt.torch

    _init(rank, world, rendezvous, job)
    alone = os.path.join(workdir, "ckpt-no-dist")
    only_one = dist.new_group([1])
    if rank == 0:
        ckpt.torch.save({"w": _full(), "step": 3}, checkpoint_id=alone, no_dist=True)
    dist.barrier()
    if rank == 1:
        sd = {"w": torch.zeros(SHAPE), "step": 0}
        ckpt.torch.load(sd, checkpoint_id=alone, no_dist=True)
        assert sd["step"] == 3 and torch.equal(sd["w"], _full())
        grouped = os.path.join(workdir, "ckpt-group")
        ckpt.torch.save({"w": _full(torch.int64)}, checkpoint_id=grouped,
                        process_group=only_one)
        back = {"w": torch.zeros(SHAPE, dtype=torch.int64)}
        ckpt.torch.load(back, checkpoint_id=grouped, process_group=only_one)
        assert torch.equal(back["w"], _full(torch.int64))
    dist.barrier()


PHASES = {"sharded": phase_sharded, "several": phase_several, "part": phase_part}
