"""Per-rank bodies of torch_stateful_test.py's multi-process case: each runs in a process
torch.multiprocessing spawned, over gloo on the CPU, as torchrun would start it, and puts Stateful
objects (a torchtitan-like app state over an FSDP2 model and its AdamW, the FSDP2 module
itself, a DDP module and its optimizer) straight into the state dict."""

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import torch_ranks  # beside this file: TinyModel, setup, train_step, full


class AppState(Stateful):
    """As torchtitan's checkpoint wrappers: the model's and optimizer's DCP state dicts
    (DTensors, nested optimizer state), set back through set_state_dict; counts the loads."""

    def __init__(self, model, optim):
        self.model, self.optim, self.loads = model, optim, 0

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optim)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optim, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])
        self.loads += 1


def run(rank, world, rendezvous, job, phase, workdir):
    """Runs `phase` on this rank; writes <workdir>/<phase>.r<rank>.err on failure."""
    torch_ranks.run_phase(PHASES, rank, world, rendezvous, job, phase, workdir)


_assert_same = torch_ranks._assert_same  # nested dicts, lists and tensors, exactly


def _overwrite(model, optim):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1000.0)
        for per_param in optim.state.values():
            for v in per_param.values():
                v.add_(1000.0)


def phase_fsdp2(rank, world, rendezvous, job, workdir):
    import ckpt.torch

    model, optim = torch_ranks.setup(rank, world, rendezvous, job)
    for step in range(2):
        torch_ranks.train_step(model, optim, step)
    app = AppState(model, optim)
    reference = torch_ranks.full(app.state_dict())
    path = lambda name: os.path.join(workdir, name)  # noqa: E731

    ckpt.torch.save({"app": app, "step": 2}, checkpoint_id=path("ckpt"))
    dcp.save({"app": app, "step": 2}, checkpoint_id=path("dcp"))
    future = ckpt.torch.async_save({"app": app}, checkpoint_id=path("ckpt-async"))
    _overwrite(model, optim)  # at once: the async checkpoint holds the values from before
    future.result(timeout=120)
    # The FSDP2 module itself, straight in the dict (its state_dict(): DTensor shards).
    module_reference = torch_ranks.full(model.state_dict())
    ckpt.torch.save({"model": model}, checkpoint_id=path("ckpt-module"))

    _overwrite(model, optim)
    sd = {"app": app, "step": 0}
    ckpt.torch.load(sd, checkpoint_id=path("ckpt"))
    assert sd["app"] is app and app.loads == 1 and sd["step"] == 2
    _assert_same(torch_ranks.full(app.state_dict()), reference, "ckpt")

    _overwrite(model, optim)
    ckpt.torch.load({"app": app}, checkpoint_id=path("ckpt-async"))
    assert app.loads == 2
    _assert_same(torch_ranks.full(app.state_dict()), reference, "async")

    _overwrite(model, optim)
    ckpt.torch.load({"model": model}, checkpoint_id=path("ckpt-module"))
    _assert_same(torch_ranks.full(model.state_dict()), module_reference, "module")

    # DCP's own checkpoint of the same dict, loaded by DCP into a fresh model and optimizer,
    # holds the same values as ckpt's loaded into another fresh pair.
    loaded = []
    for load, where in ((dcp.load, "dcp"), (ckpt.torch.load, "ckpt")):
        torch.manual_seed(rank + 7)  # other initial values than the saved ones
        fresh_model, fresh_optim = _fresh(world)
        fresh = AppState(fresh_model, fresh_optim)
        fresh_sd = {"app": fresh, "step": -1}
        load(fresh_sd, checkpoint_id=path(where))
        assert fresh.loads == 1 and fresh_sd["step"] == 2, where
        loaded.append(torch_ranks.full(fresh.state_dict()))
        losses = [torch_ranks.train_step(fresh_model, fresh_optim, 2 + i) for i in range(2)]
        assert all(torch.isfinite(torch.tensor(losses))), where
    _assert_same(loaded[0], reference, "dcp")
    _assert_same(loaded[1], loaded[0], "ckpt-vs-dcp")
    _ddp_round_trip(rank, path("ckpt-ddp"))


def _ddp_round_trip(rank, path):
    """A DDP module and its Adam straight in the dict (replicated plain tensors)."""
    import ckpt.torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(3)
    ddp = DistributedDataParallel(torch.nn.Linear(4, 3))
    optim = torch.optim.Adam(ddp.parameters(), lr=0.1)
    ddp(torch.randn(5, 4, generator=torch.Generator().manual_seed(rank))).sum().backward()
    optim.step()
    reference = torch_ranks.full({"model": ddp.state_dict(), "optim": optim.state_dict()})
    ckpt.torch.save({"model": ddp, "optim": optim}, checkpoint_id=path)
    _overwrite(ddp, optim)
    sd = {"model": ddp, "optim": optim}
    ckpt.torch.load(sd, checkpoint_id=path)
    assert sd["model"] is ddp and sd["optim"] is optim
    _assert_same(torch_ranks.full({"model": ddp.state_dict(), "optim": optim.state_dict()}),
                 reference, "ddp")


def _fresh(world):
    """Another FSDP2 TinyModel and AdamW on the same mesh, not trained."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = torch_ranks.TinyModel()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model.embed, model.hidden, model.out):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


PHASES = {"fsdp2": phase_fsdp2}
