"""ckpt.torch on one rank (a 1-process gloo group, real daemons): large CPU tensors are moved
into worker-shared memory in place at the first save or load, so later saves and loads copy
nothing in the trainer; snapshot semantics, in-place loads and views are kept."""

import os

import pytest
import torch

import ckpt
import ckpt.torch
import rank_threads  # beside this file
from ckpt import _share

BIG = (1 << 20) // 4 * 2  # fp32 elements: 2 MiB, above the sharing threshold


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 1, torch_job="torch-share")


def test_large_tensors_are_saved_and_loaded_in_place_and_views_follow(cluster):
    big = torch.arange(BIG, dtype=torch.float32)
    view = big[10:20]  # another view of the same storage, made before the move
    small = torch.arange(4, dtype=torch.float32)
    sd = {"big": big, "small": small}
    handle = ckpt.torch.save(sd, checkpoint_id=os.path.join(cluster.root, "inplace"))
    assert ckpt.is_shared(big) and not ckpt.is_shared(small)
    assert handle.staged_bytes == small.numel() * 4  # only the small tensor was copied
    assert view[0].item() == 10.0
    view[0] = -5.0  # the view still aliases the tensor
    assert big[10].item() == -5.0
    big.zero_()
    small.zero_()
    ckpt.torch.load(sd, checkpoint_id=os.path.join(cluster.root, "inplace"))
    assert torch.equal(big, torch.arange(BIG, dtype=torch.float32))
    assert torch.equal(small, torch.arange(4, dtype=torch.float32))
    assert view[0].item() == 10.0  # loaded into the very memory the view sees


def test_async_save_of_shared_tensors_keeps_the_snapshot(cluster):
    big = torch.full((BIG,), 3.0)
    sd = {"big": big}
    ckpt.torch.save(sd, checkpoint_id=os.path.join(cluster.root, "first"))  # now shared
    future = ckpt.torch.async_save(sd, checkpoint_id=os.path.join(cluster.root, "snap"))
    big.fill_(-1.0)  # at once, before the save is durable
    future.result()
    out = {"big": torch.zeros(BIG)}
    ckpt.torch.load(out, checkpoint_id=os.path.join(cluster.root, "snap"))
    assert torch.equal(out["big"], torch.full((BIG,), 3.0))


def test_sharing_in_place_can_be_turned_off(cluster, monkeypatch):
    monkeypatch.setenv("CKPT_TORCH_SHARE_IN_PLACE", "0")
    big = torch.ones(BIG)
    handle = ckpt.torch.save({"big": big}, checkpoint_id=os.path.join(cluster.root, "off"))
    assert not ckpt.is_shared(big)
    assert handle.staged_bytes == BIG * 4


def test_memory_torch_does_not_own_alone_is_staged_and_keeps_aliasing(cluster):
    import numpy as np

    array = np.arange(BIG, dtype=np.float32)
    tensor = torch.from_numpy(array)  # NumPy's memory: moving it would part the two
    handle = ckpt.torch.save({"t": tensor}, checkpoint_id=os.path.join(cluster.root, "numpy"))
    assert not ckpt.is_shared(tensor) and handle.staged_bytes == BIG * 4
    tensor.zero_()
    ckpt.torch.load({"t": tensor}, checkpoint_id=os.path.join(cluster.root, "numpy"))
    assert array[7] == 7.0  # loaded through the tensor into the array it still aliases


def test_shutdown_drops_the_registrations_and_keeps_the_values(cluster):
    big = torch.arange(BIG, dtype=torch.float32)
    ckpt.torch.save({"big": big}, checkpoint_id=os.path.join(cluster.root, "before-shutdown"))
    assert ckpt.is_shared(big) and _share.shared_bytes() > 0
    ckpt.torch.shutdown()
    assert not ckpt.is_shared(big) and _share.shared_bytes() == 0
    assert torch.equal(big, torch.arange(BIG, dtype=torch.float32))
    out = {"big": torch.zeros(BIG)}  # the next call connects again
    ckpt.torch.load(out, checkpoint_id=os.path.join(cluster.root, "before-shutdown"))
    assert torch.equal(out["big"], big)


def test_state_dicts_saved_in_turn_both_stay_in_place(cluster):
    a, b = torch.ones(BIG), torch.full((BIG,), 2.0)
    for i in range(2):
        for name, t in (("a", a), ("b", b)):
            handle = ckpt.torch.save({name: t},
                                     checkpoint_id=os.path.join(cluster.root, f"turn-{name}{i}"))
            assert ckpt.is_shared(t) and handle.staged_bytes == 0, (name, i)
