"""ckpt.torch on one rank (a 1-process gloo group, real daemons): non-tensor values, and every
bad input refused with an exception naming the key."""

import os

import pytest
import torch

import ckpt
import ckpt.torch
import rank_threads  # beside this file


class Opaque:
    """A user class: its pickle names this module, so loading it needs trust_pickles."""

    def __init__(self, x):
        self.x = x


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 1, torch_job="torch-errors")


def model_state():
    return {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(4)}


@pytest.fixture(scope="module")
def saved(cluster):
    path = os.path.join(cluster.root, "saved")
    sd = {"model": model_state(), "step": 12, "lr": 0.5, "name": "run-a",
          "sched": {"last_epoch": 3, "milestones": [1, 2], "gamma": None}}
    ckpt.torch.save(sd, checkpoint_id=path)
    return path


def test_non_tensor_values_are_loaded_on_every_rank_in_place(saved):
    sd = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}, "step": 0, "lr": 0.0,
          "name": "", "sched": {"last_epoch": 0, "milestones": [], "gamma": 1.0}}
    ckpt.torch.load(sd, checkpoint_id=saved)
    assert torch.equal(sd["model"]["w"], model_state()["w"])
    assert sd["step"] == 12 and sd["lr"] == 0.5 and sd["name"] == "run-a"
    assert sd["sched"] == {"last_epoch": 3, "milestones": [1, 2], "gamma": None}


def test_a_key_missing_from_the_checkpoint_is_named(saved):
    sd = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4), "extra": torch.zeros(2)}}
    with pytest.raises(ckpt.NotFound, match="model.extra") as e:
        ckpt.torch.load(sd, checkpoint_id=saved, strict=False)
    assert e.value.key == "model.extra"


def test_shape_and_dtype_mismatches_are_named(saved):
    with pytest.raises(ckpt.InvalidArgument, match=r"model\.w: the checkpoint holds shape"):
        ckpt.torch.load({"model": {"w": torch.zeros(4, 3)}}, checkpoint_id=saved, strict=False)
    with pytest.raises(ckpt.InvalidArgument, match=r"model\.b: the checkpoint holds F32"):
        ckpt.torch.load({"model": {"b": torch.zeros(4, dtype=torch.float64)}},
                        checkpoint_id=saved, strict=False)
    with pytest.raises(ckpt.InvalidArgument, match="key step is a tensor here"):
        ckpt.torch.load({"step": torch.zeros(())}, checkpoint_id=saved, strict=False)


def test_a_checkpoint_key_no_rank_holds_is_named_unless_not_strict(saved):
    sd = {"model": {"w": torch.zeros(3, 4)}}
    with pytest.raises(ckpt.InvalidArgument, match="holds key lr that no rank"):
        ckpt.torch.load(sd, checkpoint_id=saved, strict=True)
    ckpt.torch.load(sd, checkpoint_id=saved)  # DCP's partial load: the default
    assert torch.equal(sd["model"]["w"], model_state()["w"])


def test_device_tensors_and_partial_placements_are_refused_naming_the_key(cluster):
    path = os.path.join(cluster.root, "refused")
    with pytest.raises(ckpt.Unimplemented, match="tensor model.w is on meta"):
        ckpt.torch.save({"model": {"w": torch.empty(2, device="meta")}}, checkpoint_id=path)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    mesh = init_device_mesh("cpu", (1,))
    partial = DTensor.from_local(torch.ones(2), mesh, [Partial()])
    with pytest.raises(ckpt.InvalidArgument, match="tensor grad_sum: DTensor placement"):
        ckpt.torch.save({"grad_sum": partial}, checkpoint_id=path)
    assert not os.path.exists(path)


def test_save_creates_missing_parent_directories_as_dcp_does(cluster):
    path = os.path.join(cluster.root, "runs", "a", "step1")
    ckpt.torch.save({"x": torch.ones(2)}, checkpoint_id=path)
    assert ckpt.read_manifest(path)["tensors"]["x"] == ("F32", [2])


def test_groups_pass_through_save_and_load_and_bad_ones_name_the_rank(cluster):
    path = os.path.join(cluster.root, "grouped")
    ckpt.torch.save({"x": torch.arange(4.0)}, checkpoint_id=path, groups="read-groups:1")
    out = {"x": torch.zeros(4)}
    ckpt.torch.load(out, checkpoint_id=path, groups=[[0]])
    assert torch.equal(out["x"], torch.arange(4.0))
    with pytest.raises(ckpt.InvalidArgument, match="process group 0 names rank 1"):
        ckpt.torch.save({"x": torch.ones(2)}, checkpoint_id=path + "-bad", groups=[[0, 1]])


def test_an_existing_checkpoint_is_not_overwritten(saved):
    with pytest.raises(ckpt.AlreadyExists):
        ckpt.torch.save({"x": torch.ones(1)}, checkpoint_id=saved)
    assert ckpt.read_manifest(saved)["tensors"]["model.w"] == ("F32", [3, 4])


def test_objects_need_trust_to_unpickle_beyond_plain_data(cluster):
    path = os.path.join(cluster.root, "opaque")
    ckpt.torch.save({"obj": Opaque(5)}, checkpoint_id=path)
    sd = {"obj": None}
    with pytest.raises(ckpt.PermissionDenied, match="obj in the checkpoint( /.*)? needs"):
        ckpt.torch.load(sd, checkpoint_id=path)
    ckpt.torch.load(sd, checkpoint_id=path, trust_pickles=True)
    assert isinstance(sd["obj"], Opaque) and sd["obj"].x == 5


def test_a_corrupted_value_is_data_loss(cluster):
    path = os.path.join(cluster.root, "corrupt")
    ckpt.torch.save({"note": "x" * 100}, checkpoint_id=path)
    data = os.path.join(path, "data")
    (name,) = os.listdir(data)
    with open(os.path.join(data, name), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(ckpt.DataLoss):
        ckpt.torch.load({"note": ""}, checkpoint_id=path)


def test_async_save_returns_a_future_of_the_commit(cluster):
    path = os.path.join(cluster.root, "async")
    t = torch.arange(1000.0)
    future = ckpt.torch.async_save({"t": t}, checkpoint_id=path)
    t.fill_(-1)
    handle = future.result(timeout=60)
    assert handle.progress().phase == "done"
    out = {"t": torch.zeros(1000)}
    ckpt.torch.load(out, checkpoint_id=path)
    assert torch.equal(out["t"], torch.arange(1000.0))


def test_repeated_saves_reuse_staging_and_store_each_saves_values(cluster):
    t = torch.arange(64.0)
    sd = {"t": t, "step": 1}
    ckpt.torch.save(sd, checkpoint_id=os.path.join(cluster.root, "repeat-1"))
    cached = lambda: ckpt.torch._SaveCache.slots["in_place"][2]  # blocking saves' state dict
    first = cached()
    t.mul_(-1)
    sd["step"] = 2
    ckpt.torch.save(sd, checkpoint_id=os.path.join(cluster.root, "repeat-2"))
    assert cached() is first  # same tensors: same staging buffers
    sd["t2"] = torch.ones(3)  # another state: new buffers
    ckpt.torch.save(sd, checkpoint_id=os.path.join(cluster.root, "repeat-3"))
    assert cached() is not first
    for name, sign, step in (("repeat-1", 1, 1), ("repeat-2", -1, 2)):
        out = {"t": torch.zeros(64), "step": 0}
        ckpt.torch.load(out, checkpoint_id=os.path.join(cluster.root, name), strict=False)
        assert torch.equal(out["t"], sign * torch.arange(64.0)) and out["step"] == step, name
