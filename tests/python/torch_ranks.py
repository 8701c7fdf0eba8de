"""Per-rank bodies of the multi-process ckpt.torch tests (python/tests/torch_test.py): each
runs in a process torch.multiprocessing spawned, over gloo on the CPU, the way torchrun would
start it (RANK, WORLD_SIZE, LOCAL_RANK in the environment), meeting through a file rendezvous."""

import json
import os
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class TinyModel(torch.nn.Module):
    """Uneven sizes (7, 10, 13 rows) so 2-, 3- and 4-way shards are uneven."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(13, 10)
        self.hidden = torch.nn.Linear(10, 7)
        self.norm = torch.nn.LayerNorm(7)
        self.out = torch.nn.Linear(7, 13)

    def forward(self, tokens):
        return self.out(self.norm(torch.relu(self.hidden(self.embed(tokens)))))


def setup(rank, world, rendezvous, job):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), CKPT_JOB=job)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = TinyModel()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model.embed, model.hidden, model.out):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optim


def train_step(model, optim, step):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, 13, (8, 5), generator=g)
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 13), tokens.view(-1))
    loss.backward()
    optim.step()
    optim.zero_grad()
    return loss.item()


def state(model, optim, step):
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd, "step": step, "note": f"tiny-{step}"}


def full(value):
    """A state-dict value as a plain CPU tensor (DTensors gathered) or the value itself."""
    if hasattr(value, "full_tensor"):
        return value.full_tensor().clone()
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, list):
        return [full(v) for v in value]
    return value


def fresh_state(model, optim):
    """A DCP-shaped state dict with optimizer states allocated (zeros), ready to load into."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optim)
    sd = state(model, optim, -1)
    sd["note"] = "unset"
    return sd


def run(rank, world, rendezvous, job, phase, workdir):
    """Runs `phase` on this rank; writes <workdir>/<phase>.r<rank>.err on failure."""
    run_phase(PHASES, rank, world, rendezvous, job, phase, workdir)


def run_phase(phases, rank, world, rendezvous, job, phase, workdir):
    """Runs `phases[phase]` on this rank; writes <workdir>/<phase>.r<rank>.err on failure, and
    shuts ckpt.torch and the process group down either way."""
    try:
        phases[phase](rank, world, rendezvous, job, workdir)
    except BaseException:
        with open(os.path.join(workdir, f"{phase}.r{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        import ckpt.torch

        ckpt.torch.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()


def phase_save(rank, world, rendezvous, job, workdir):
    """Trains 3 steps on 4 ranks; saves with ckpt and with DCP; records the full values; then
    async_save and overwrite every tensor at once (the checkpoint must hold the old values)."""
    import ckpt.torch

    model, optim = setup(rank, world, rendezvous, job)
    for step in range(3):
        train_step(model, optim, step)
    sd = state(model, optim, 3)
    ckpt.torch.save(sd, checkpoint_id=os.path.join(workdir, "ckpt-step3"))
    # The description this rank's worker sent with the save: compact DTensors (issue 16).
    sizes = ckpt.torch._SaveCache.slots["in_place"][2].description_bytes()
    with open(os.path.join(workdir, f"description-bytes.{rank}.json"), "w") as f:
        json.dump(sizes, f)
    dcp.save(sd, checkpoint_id=os.path.join(workdir, "dcp-step3"))
    reference = full(sd)
    if rank == 0:
        torch.save(reference, os.path.join(workdir, "reference.pt"))
    future = ckpt.torch.async_save(sd, checkpoint_id=os.path.join(workdir, "ckpt-async"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1000.0)
        for per_param in optim.state.values():
            for v in per_param.values():
                v.add_(1000.0)
    future.result(timeout=120)
    # The snapshot is old, the live state new.
    assert not torch.equal(full(state(model, optim, 3))["model"]["out.weight"],
                           reference["model"]["out.weight"])


def _assert_same(got, want, where):
    if isinstance(want, dict):
        assert set(got) == set(want), (where, sorted(got), sorted(want))
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}.{i}")
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got, want)
        assert torch.equal(got, want), f"{where}: values differ"
    else:
        assert got == want, (where, got, want)


def _comparable(full_state):
    """Drops param_groups' 'params' (FQN lists, equal by construction) for the comparisons."""
    return full_state


def phase_resume(rank, world, rendezvous, job, workdir):
    """Loads the 4-rank checkpoint on `world` ranks: every parameter and optimizer state,
    gathered, is bit-identical to the saved one; the async checkpoint holds the pre-overwrite
    values; DCP's checkpoint of the same state loads into the same values; training goes on."""
    import ckpt.torch

    reference = torch.load(os.path.join(workdir, "reference.pt"), weights_only=False)
    model, optim = setup(rank, world, rendezvous, job)
    sd = fresh_state(model, optim)
    ckpt.torch.load(sd, checkpoint_id=os.path.join(workdir, "ckpt-step3"))
    _assert_same(full(sd), reference, "ckpt")
    assert sd["step"] == 3 and sd["note"] == "tiny-3"

    async_sd = fresh_state(model, optim)
    ckpt.torch.load(async_sd, checkpoint_id=os.path.join(workdir, "ckpt-async"))
    _assert_same(full(async_sd), reference, "async")

    # DCP's own round trip of the same state, and ckpt's, give the same values.
    dcp_sd = fresh_state(model, optim)
    dcp.load(dcp_sd, checkpoint_id=os.path.join(workdir, "dcp-step3"))
    _assert_same(full(dcp_sd), full(sd), "dcp-vs-ckpt")

    # Training continues from the loaded state.
    set_state_dict(model, optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    before = full(model.out.weight)
    losses = [train_step(model, optim, 3 + i) for i in range(2)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(full(model.out.weight), before)


PHASES = {"save": phase_save, "resume": phase_resume}
