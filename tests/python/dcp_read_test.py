"""ckpt.torch.load of checkpoints torch.distributed.checkpoint wrote (issue 41, item 4): a
directory holding DCP's .metadata and .distcp files (dcp.save, format_utils.torch_save_to_dcp)
is loaded in place, resharded, values bit for bit; a damaged or hostile .metadata is a ckpt
error naming the file. Reading a DCP checkpoint needs no ckpt daemon, so none is started."""

import dataclasses
import os
import pickle
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import format_utils

import ckpt
import ckpt.torch
import dcp_read_ranks  # beside this file


@dataclasses.dataclass
class Schedule:
    """A non-tensor value of a class (not plain data)."""
    warmup: int


def spawn(phase, world, workdir):
    rendezvous = f"file://{workdir}/{phase}.{uuid.uuid4().hex}.rendezvous"
    job = f"dcp-read-{uuid.uuid4().hex[:6]}"
    try:
        mp.spawn(dcp_read_ranks.run, args=(world, rendezvous, job, phase, workdir), nprocs=world)
    except Exception:
        errors = sorted(f for f in os.listdir(workdir) if f.startswith(phase) and
                        f.endswith(".err"))
        details = "".join(open(os.path.join(workdir, f)).read() for f in errors)
        pytest.fail(f"phase {phase} on {world} ranks failed:\n{details}")


def test_dcp_save_on_two_ranks_loads_into_three_ranks_other_sharding_bit_for_bit(tmp_path):
    """DTensor rows -> columns, DTensor columns -> replicated, a plain tensor, an int, nested
    values and an optimizer's param_groups list (flattened by DCP) (before: NotFound, 'no
    committed checkpoint')."""
    spawn("save", 2, str(tmp_path))
    assert any(f.endswith(".distcp") for f in os.listdir(tmp_path / "dcp"))
    spawn("load", 3, str(tmp_path))


def test_torch_save_to_dcp_output_loads_in_place(tmp_path):
    """format_utils.torch_save_to_dcp (a torch.save file -> DCP, one process) is read by
    ckpt.torch.load without a process group."""
    g = torch.Generator().manual_seed(3)
    saved = {"layer": {"weight": torch.randn(4, 3, generator=g),
                       "steps": torch.arange(5, dtype=torch.int64)},
             "epoch": 12, "name": "converted"}
    torch.save(saved, tmp_path / "model.pt")
    format_utils.torch_save_to_dcp(str(tmp_path / "model.pt"), str(tmp_path / "dcp"))
    weight, steps = torch.zeros(4, 3), torch.zeros(5, dtype=torch.int64)
    sd = {"layer": {"weight": weight, "steps": steps}, "epoch": 0, "name": ""}
    ckpt.torch.load(sd, checkpoint_id=str(tmp_path / "dcp"))
    assert sd["layer"]["weight"] is weight and torch.equal(weight, saved["layer"]["weight"])
    assert torch.equal(steps, saved["layer"]["steps"])
    assert sd["epoch"] == 12 and sd["name"] == "converted"


def test_a_stateful_module_loads_from_a_dcp_checkpoint_into_the_callers_module(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    dcp.save({"model": model, "step": 4}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    other = torch.nn.Linear(3, 2)
    with torch.no_grad():
        other.weight.fill_(-1.0)
    sd = {"model": other, "step": 0}
    ckpt.torch.load(sd, checkpoint_id=str(tmp_path / "dcp"))
    assert sd["model"] is other and sd["step"] == 4
    for k, v in want.items():
        assert torch.equal(other.state_dict()[k], v), k


def test_a_missing_key_an_extra_key_and_a_wrong_shape_are_named(tmp_path):
    path = str(tmp_path / "dcp")
    dcp.save({"a": torch.ones(3), "b": torch.ones(2)}, checkpoint_id=path, no_dist=True)
    with pytest.raises(ckpt.NotFound, match=r"state-dict key c is not in the DCP checkpoint"):
        ckpt.torch.load({"a": torch.zeros(3), "b": torch.zeros(2), "c": torch.zeros(1)},
                        checkpoint_id=path)
    with pytest.raises(ckpt.InvalidArgument, match=r"holds key b that no rank's state dict"):
        ckpt.torch.load({"a": torch.zeros(3)}, checkpoint_id=path, strict=True)
    subset = {"a": torch.zeros(3)}  # a subset of the checkpoint's keys, as DCP loads it
    ckpt.torch.load(subset, checkpoint_id=path, strict=False)
    assert torch.equal(subset["a"], torch.ones(3))
    with pytest.raises(ckpt.InvalidArgument, match=r"tensor a: the DCP checkpoint .* holds "
                                                   r"shape \(3,\), the state dict \(4,\)"):
        ckpt.torch.load({"a": torch.zeros(4), "b": torch.zeros(2)}, checkpoint_id=path)


def test_a_non_plain_value_needs_trust_pickles(tmp_path):
    path = str(tmp_path / "dcp")
    dcp.save({"schedule": Schedule(5)}, checkpoint_id=path, no_dist=True)
    with pytest.raises(ckpt.PermissionDenied, match=r"schedule .*needs .*Schedule"):
        ckpt.torch.load({"schedule": None}, checkpoint_id=path)
    sd = {"schedule": None}
    ckpt.torch.load(sd, checkpoint_id=path, trust_pickles=True)
    assert sd["schedule"] == Schedule(5)


def test_a_truncated_metadata_is_data_loss_naming_the_file(tmp_path):
    path = str(tmp_path / "dcp")
    dcp.save({"a": torch.ones(3)}, checkpoint_id=path, no_dist=True)
    metadata = os.path.join(path, ".metadata")
    with open(metadata, "r+b") as f:
        f.truncate(os.path.getsize(metadata) // 2)
    with pytest.raises(ckpt.DataLoss, match=rf"{path}/\.metadata: not a DCP metadata pickle"):
        ckpt.torch.load({"a": torch.zeros(3)}, checkpoint_id=path)


class _Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_metadata_naming_code_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "dcp"
    dcp.save({"a": torch.ones(3)}, checkpoint_id=str(path), no_dist=True)
    (path / ".metadata").write_bytes(pickle.dumps(_Hostile()))
    with pytest.raises(ckpt.DataLoss, match=r"\.metadata: refusing to unpickle posix.system"):
        ckpt.torch.load({"a": torch.zeros(3)}, checkpoint_id=str(path))


def test_a_damaged_distcp_file_is_data_loss_naming_it(tmp_path):
    path = tmp_path / "dcp"
    dcp.save({"a": torch.ones(300)}, checkpoint_id=str(path), no_dist=True)
    (data,) = [p for p in path.iterdir() if p.suffix == ".distcp"]
    raw = bytearray(data.read_bytes())
    raw[0:4] = b"XXXX"  # no longer a torch.save archive
    data.write_bytes(bytes(raw))
    with pytest.raises(ckpt.DataLoss, match=rf"{data}: a at offsets \[0\] .* is not a "
                                            r"torch.save archive"):
        ckpt.torch.load({"a": torch.zeros(300)}, checkpoint_id=str(path))
    data.write_bytes(bytes(raw[:100]))
    with pytest.raises(ckpt.DataLoss, match=rf"{data} is truncated: a spans bytes"):
        ckpt.torch.load({"a": torch.zeros(300)}, checkpoint_id=str(path))
