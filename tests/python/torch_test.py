"""ckpt.torch with real PyTorch, real daemons (ckpt.LocalCluster) and real processes over gloo:
a 4-rank FSDP2 run saves, 2- and 3-rank runs resume bit-identically and keep training; DCP's
checkpoint of the same state loads into the same values; async_save snapshots; bad inputs are
refused naming the key."""

import os
import uuid

import pytest
import torch.multiprocessing as mp

import ckpt
import ckpt.torch
import rank_threads  # beside this file
import torch_ranks  # noqa: E402 (beside this file)


def fresh_rendezvous(workdir, phase):
    """A file rendezvous no other spawn uses: a TCP port picked by binding port 0 can be taken
    by a concurrent test before rank 0 listens on it (EADDRINUSE)."""
    return f"file://{workdir}/{phase}.{uuid.uuid4().hex}.rendezvous"


def spawn(phase, world, workdir, job):
    try:
        mp.spawn(torch_ranks.run, args=(world, fresh_rendezvous(workdir, phase), job, phase, workdir), nprocs=world)
    except Exception:
        errors = sorted(f for f in os.listdir(workdir) if f.startswith(phase) and
                        f.endswith(".err"))
        details = "".join(open(os.path.join(workdir, f)).read() for f in errors)
        pytest.fail(f"phase {phase} on {world} ranks failed:\n{details}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 4)


@pytest.fixture(scope="module")
def saved(cluster):
    spawn("save", 4, cluster.root, "save4")
    return cluster.root


@pytest.mark.parametrize("world", [2, 3])
def test_resume_on_fewer_ranks_is_bit_identical_and_training_continues(saved, world):
    spawn("resume", world, saved, f"resume{world}")
