"""Real DCP and Megatron torch_dist checkpoints for tests/dcp_interop_test.py, written and read
by torch and megatron-core themselves in several gloo processes on CPU.

    python tests/dcp_fixtures.py save-dtensor <dir>         (one rank; see run_ranks)
    python tests/dcp_fixtures.py load-dtensor <mesh> <dir>...  (one rank: loads each dir into
                                                 DTensors of another sharding, checks them)
    python tests/dcp_fixtures.py megatron-save <dir>       (one rank of dist_checkpointing.save)

Each rank learns its rank, the world size and a FileStore path from RANK, WORLD_SIZE and
STORE_FILE. megatron-core 0.16.1's save assumes CUDA in three places that do no work on CPU
tensors (a torch.cuda.synchronize after host copies, the device of a one-element reduction
tensor, a psutil memory reading that is only logged); those three are shimmed, everything else
is megatron-core's own code path (TorchDistSaveShardedStrategy, FileSystemWriterAsync,
metadata.json, common.pt).
"""

import multiprocessing
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def full_state():
    """The tensors every fixture holds, whole (deterministic)."""
    g = torch.Generator().manual_seed(15)
    return {
        "model.embed": torch.randn(13, 6, generator=g),
        "model.layers.0.w": torch.randn(8, 10, generator=g).to(torch.bfloat16),
        "model.layers.1.w": torch.randn(5, 3, generator=g).to(torch.float64),
        "model.norm": torch.randn(7, generator=g).to(torch.float16),
        "opt.count": torch.arange(5, dtype=torch.int64),
        "opt.flag": torch.tensor([True, False, True]),
        "model.f8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.25),
    }


NON_TENSOR = {"step": 11, "extra": {"lr": 0.5, "name": "run-15"}}

# How the saving job shards (mesh (2, 2)): uneven nested splits, both dims, replicated.
SAVE_PLACEMENTS = {
    "model.embed": [Shard(0), Shard(0)],
    "model.layers.0.w": [Shard(0), Shard(1)],
    "model.layers.1.w": [Replicate(), Shard(0)],
    "model.norm": [Replicate(), Shard(0)],
    "opt.count": [Shard(0), Replicate()],
    "opt.flag": [Replicate(), Replicate()],
}


def load_placements(ndim_mesh):
    """How a loading job of another shape shards (mesh (3,) or (3, 2))."""
    if ndim_mesh == 1:
        return {"model.embed": [Shard(1)], "model.layers.0.w": [Shard(1)],
                "model.layers.1.w": [Shard(0)], "model.norm": [Replicate()],
                "opt.count": [Shard(0)], "opt.flag": [Shard(0)]}
    return {"model.embed": [Shard(1), Shard(0)], "model.layers.0.w": [Replicate(), Shard(0)],
            "model.layers.1.w": [Shard(1), Shard(1)], "model.norm": [Shard(0), Replicate()],
            "opt.count": [Replicate(), Shard(0)], "opt.flag": [Shard(0), Shard(0)]}


def init():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + os.environ["STORE_FILE"],
                            rank=rank, world_size=world)
    return rank, world


def save_dtensor(out):
    init()
    import torch.distributed.checkpoint as dcp
    mesh = init_device_mesh("cpu", (2, 2))
    state = {}
    for key, tensor in full_state().items():
        if key in SAVE_PLACEMENTS:  # split locally (src_data_rank=None): no data moves
            state[key] = distribute_tensor(tensor, mesh, SAVE_PLACEMENTS[key], src_data_rank=None)
        else:
            state[key] = tensor  # a plain tensor: replicated, rank 0's is saved
    state.update({"step": NON_TENSOR["step"], "extra": dict(NON_TENSOR["extra"])})
    dcp.save(state, checkpoint_id=out)
    dist.destroy_process_group()


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def load_dtensor(mesh_text, paths):
    rank, _ = init()
    import torch.distributed.checkpoint as dcp
    shape = tuple(int(x) for x in mesh_text.split("x"))
    mesh = init_device_mesh("cpu", shape)
    placements = load_placements(len(shape))
    full = full_state()
    bad = []
    for path in paths:
        state = {}
        for key, tensor in full.items():
            empty = torch.zeros_like(tensor)
            state[key] = distribute_tensor(empty, mesh, placements[key], src_data_rank=None) \
                if key in placements else empty
        state.update({"step": 0, "extra": {"lr": 0.0, "name": ""}})
        dcp.load(state, checkpoint_id=path)
        for key, tensor in full.items():
            got = state[key]
            if key in placements:
                expected = distribute_tensor(tensor, mesh, placements[key], src_data_rank=None)
                got, tensor = got.to_local(), expected.to_local()
            if not same_bits(got, tensor):
                bad.append(f"{path}: {key}")
        if state["step"] != NON_TENSOR["step"] or state["extra"] != NON_TENSOR["extra"]:
            bad.append(f"{path}: non-tensor entries")
    dist.barrier()
    dist.destroy_process_group()
    if bad:
        print(f"rank {rank}: differs: {bad}", file=sys.stderr)
        return 1
    return 0


def megatron_state(rank, world):
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    full = full_state()
    return {
        "w": ShardedTensor.from_rank_offsets("decoder.w", full["model.embed"][:12]
                                             .chunk(world)[rank].clone(), (0, rank, world)),
        "b": ShardedTensor.from_rank_offsets("decoder.b", full["model.layers.0.w"][:, :5]
                                             .clone(), replica_id=rank),
        "rng": ShardedObject("rng_state", {"seed": 1234 + rank}, (world,), (rank,),
                             replica_id=0),
        "iteration": 7,
        "checkpoint_version": 3.0,
    }


def megatron_save(out):
    rank, world = init()
    os.makedirs(out, exist_ok=True)
    torch.cuda.synchronize = lambda *args, **kwargs: None  # CPU tensors: nothing to wait for
    torch.cuda.current_device = lambda: "cpu"  # its one-element reduction tensor, on gloo
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    filesystem_async._process_memory = lambda: 0  # only logged; psutil is not pinned
    # Its writer starts a multiprocessing manager; forked from a process running gloo's
    # threads that start sometimes hangs, so it is spawned.
    multiprocessing.set_start_method("spawn", force=True)
    dist_checkpointing.save(megatron_state(rank, world), out)
    dist.barrier()
    dist.destroy_process_group()


def main(argv):
    mode = argv[1]
    if mode == "save-dtensor":
        save_dtensor(argv[2])
    elif mode == "load-dtensor":
        return load_dtensor(argv[2], argv[3:])
    elif mode == "megatron-save":
        megatron_save(argv[2])
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Straight out: gloo's background threads sometimes abort the interpreter's teardown
    # ("terminate called without an active exception") after the work is done and checked.
    # (The test kills whatever helper processes a rank leaves behind.)
    os._exit(code)
