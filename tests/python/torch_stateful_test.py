"""ckpt.torch with Stateful values (a module, an optimizer, an app state object, a locally
defined class) at the top level of the state dict, as DCP takes them: saved through their
state_dict(), loaded back into the caller's objects through load_state_dict() (issue 41, item
0). One rank in the test process (a 1-process gloo group), and an FSDP2 app state on 2 spawned
processes, against real daemons and against torch.distributed.checkpoint itself."""

import os
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import ckpt
import ckpt.torch
import rank_threads  # beside this file
import stateful_ranks  # beside this file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 2, torch_job="torch-stateful")


def fresh_path(cluster, name):
    return os.path.join(cluster.root, f"{name}-{uuid.uuid4().hex[:8]}")


def trained(seed=0):
    """A small model and its Adam optimizer after one step (so the optimizer holds state)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    step(model, optim, seed)
    return model, optim


def step(model, optim, seed):
    g = torch.Generator().manual_seed(100 + seed)
    model(torch.randn(5, 4, generator=g)).square().sum().backward()
    optim.step()
    optim.zero_grad()


def snapshot(model, optim):
    """Copies of every parameter and optimizer-state tensor (and the step count)."""
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    states = {i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
              for i, s in optim.state_dict()["state"].items()}
    return params, states


def assert_holds(model, optim, want):
    assert_same(snapshot(model, optim), want)


def assert_same(got, want):
    params, states = got
    want_params, want_states = want
    assert params.keys() == want_params.keys()
    for k in want_params:
        assert torch.equal(params[k], want_params[k]), f"model {k} differs"
    assert states.keys() == want_states.keys()
    for i in want_states:
        for k, v in want_states[i].items():
            assert torch.equal(states[i][k], v) if isinstance(v, torch.Tensor) else \
                states[i][k] == v, f"optimizer state {i}.{k} differs"


@pytest.mark.parametrize("trust_pickles", [False, True])
def test_a_module_and_an_optimizer_in_the_dict_are_loaded_back_into_the_callers_objects(
        cluster, trust_pickles):
    """Before: the module was pickled; loading raised PermissionDenied, or with trust_pickles
    replaced the dict entry and left the caller's model as it was."""
    model, optim = trained()
    saved = snapshot(model, optim)
    sd = {"model": model, "optim": optim, "step": 5}
    path = fresh_path(cluster, "module")
    ckpt.torch.save(sd, checkpoint_id=path)
    step(model, optim, 1)  # training goes on: parameters and Adam's moments move
    with torch.no_grad():
        for p in model.parameters():
            p.add_(7.0)
    sd["step"] = 6
    ckpt.torch.load(sd, checkpoint_id=path, trust_pickles=trust_pickles)
    assert sd["model"] is model and sd["optim"] is optim
    assert sd["step"] == 5
    assert_holds(model, optim, saved)


def test_a_locally_defined_stateful_class_is_saved_through_its_state_dict(cluster):
    """Before: the save failed with 'cannot be pickled' (the class is local to this test)."""

    class Loader:
        def __init__(self):
            self.position, self.buffer, self.loaded = 0, torch.zeros(6), []

        def state_dict(self):
            return {"position": self.position, "buffer": self.buffer, "name": "shard-a"}

        def load_state_dict(self, state):
            self.loaded.append(state)
            self.position = state["position"]
            self.buffer.copy_(state["buffer"])

    loader = Loader()
    loader.position, loader.buffer = 41, torch.arange(6, dtype=torch.float32)
    path = fresh_path(cluster, "local")
    ckpt.torch.save({"loader": loader}, checkpoint_id=path)
    loader.position = 99
    loader.buffer.fill_(-1.0)
    sd = {"loader": loader}
    ckpt.torch.load(sd, checkpoint_id=path)
    assert sd["loader"] is loader
    assert loader.position == 41
    assert torch.equal(loader.buffer, torch.arange(6, dtype=torch.float32))
    assert len(loader.loaded) == 1
    assert loader.loaded[0]["position"] == 41 and loader.loaded[0]["name"] == "shard-a"


def test_async_save_takes_the_stateful_state_dict_before_it_returns(cluster):
    calls = []

    class Holder:
        def __init__(self):
            self.w = torch.arange(8, dtype=torch.float32)

        def state_dict(self):
            calls.append("state_dict")
            return {"w": self.w}

        def load_state_dict(self, state):
            calls.append("load_state_dict")
            self.w.copy_(state["w"])

    holder = Holder()
    path = fresh_path(cluster, "async")
    future = ckpt.torch.async_save({"holder": holder}, checkpoint_id=path)
    assert calls == ["state_dict"]
    holder.w.add_(100.0)  # at once: the snapshot holds the values from before
    future.result(timeout=60)
    ckpt.torch.load({"holder": holder}, checkpoint_id=path)
    assert calls == ["state_dict", "state_dict", "load_state_dict"]
    assert torch.equal(holder.w, torch.arange(8, dtype=torch.float32))


def test_a_stateful_below_the_top_level_is_refused_naming_its_key(cluster):
    model, optim = trained()
    path = fresh_path(cluster, "nested")
    with pytest.raises(ckpt.InvalidArgument, match="app.model is or holds a Sequential") as e:
        ckpt.torch.save({"app": {"model": model, "step": 1}}, checkpoint_id=path)
    assert e.value.key == "app.model"
    scheduler = torch.optim.lr_scheduler.StepLR(optim, step_size=2)
    with pytest.raises(ckpt.InvalidArgument, match="schedulers is or holds a StepLR"):
        ckpt.torch.save({"schedulers": [scheduler]}, checkpoint_id=path)
    assert not os.path.exists(path)
    ckpt.torch.save({"app": {"step": 1}}, checkpoint_id=path)
    with pytest.raises(ckpt.InvalidArgument, match="app.step is or holds a Sequential"):
        ckpt.torch.load({"app": {"step": model}}, checkpoint_id=path)


def test_a_failing_state_dict_is_named_by_its_key(cluster):
    class Broken:
        def state_dict(self):
            raise RuntimeError("dataloader workers gone")

        def load_state_dict(self, state):
            raise AssertionError("not reached")

    with pytest.raises(ckpt.InvalidArgument,
                       match="value loader .Broken.: its state_dict.. raised RuntimeError: "
                             "dataloader workers gone"):
        ckpt.torch.save({"loader": Broken()}, checkpoint_id=fresh_path(cluster, "broken"))


def test_a_fresh_optimizer_without_state_is_refused_with_a_hint_not_loaded_empty(cluster):
    """DCP loads nothing into an optimizer whose state is not initialized (its empty `state`
    holds no leaves) and hands it back empty; ckpt.torch says so."""
    model, optim = trained()
    path = fresh_path(cluster, "fresh-optim")
    ckpt.torch.save({"optim": optim}, checkpoint_id=path)
    fresh = torch.optim.Adam(model.parameters(), lr=0.1)
    with pytest.raises(ckpt.NotFound, match=r"optim.state is not in the checkpoint: it is empty "
                                            r"here, the checkpoint holds optim.state.0.exp_avg"):
        ckpt.torch.load({"optim": fresh}, checkpoint_id=path)


def test_dcp_and_ckpt_load_the_same_stateful_dict_into_the_same_values(cluster, tmp_path):
    model, optim = trained()
    saved = snapshot(model, optim)
    sd = {"model": model, "optim": optim, "step": 3}
    ckpt_path = fresh_path(cluster, "agree")
    ckpt.torch.save(sd, checkpoint_id=ckpt_path)
    dcp.save(sd, checkpoint_id=str(tmp_path / "dcp"))
    results = []
    for load in (ckpt.torch.load, dcp.load):
        other_model, other_optim = trained(seed=1)  # other values, the same structure
        other = {"model": other_model, "optim": other_optim, "step": 0}
        load(other, checkpoint_id=ckpt_path if load is ckpt.torch.load else str(tmp_path / "dcp"))
        assert other["step"] == 3
        results.append(snapshot(other_model, other_optim))
    for got in results:
        assert_same(got, saved)


def spawn(phase, world, workdir, job):
    rendezvous = f"file://{workdir}/{phase}.{uuid.uuid4().hex}.rendezvous"
    try:
        mp.spawn(stateful_ranks.run, args=(world, rendezvous, job, phase, workdir), nprocs=world)
    except Exception:
        errors = sorted(f for f in os.listdir(workdir) if f.startswith(phase) and
                        f.endswith(".err"))
        details = "".join(open(os.path.join(workdir, f)).read() for f in errors)
        pytest.fail(f"phase {phase} on {world} ranks failed:\n{details}")


def test_fsdp2_app_state_fsdp2_and_ddp_modules_round_trip_on_two_ranks_as_with_dcp(cluster):
    """torchtitan's shape: an app state object whose state_dict() is get_state_dict() of an
    FSDP2 model and its AdamW (DTensors, nested optimizer state), and the FSDP2 module itself
    in the dict; saved, async-saved and overwritten, loaded back in place; DCP's checkpoint of
    the same dict loads into the same values; a DDP module and its Adam likewise."""
    workdir = os.path.join(cluster.root, f"fsdp2-{uuid.uuid4().hex[:8]}")
    os.makedirs(workdir)
    spawn("fsdp2", 2, workdir, f"stateful-fsdp2-{uuid.uuid4().hex[:6]}")
