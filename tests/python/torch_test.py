"""ckpt.torch with real PyTorch, real daemons (ckpt.LocalCluster) and real processes over gloo:
a 4-rank FSDP2 run saves, 2- and 3-rank runs resume bit-identically and keep training; DCP's
checkpoint of the same state loads into the same values; async_save snapshots; bad inputs are
refused naming the key."""

import json
import os
import re
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


def test_ranks_describe_their_dtensors_compactly_and_the_description_shrinks(cluster, saved):
    """FSDP2's DTensors reach the coordinator as placements over the mesh (issue 16), not as
    pieces; the resumes above load bit-identically from the pieces the coordinator expanded."""
    for rank in range(4):
        with open(os.path.join(saved, f"description-bytes.{rank}.json")) as f:
            sizes = json.load(f)
        print(f"rank {rank} description: {sizes}")
        assert sizes["compact_tensors"] > 0, sizes
        assert sizes["compact_bytes"] < sizes["full_bytes"], sizes
    sent = []  # what the workers sent with each full (not digest-only) join of the save job
    for name in os.listdir(cluster.log_dir):
        with open(os.path.join(cluster.log_dir, name), errors="replace") as f:
            sent += [line for line in f if "operation_joined" in line and "job=save4 " in line
                     and "by_digest=false" in line]
    assert len(sent) >= 4, sent
    assert all(int(re.search(r" compact=(\d+)", line).group(1)) > 0 for line in sent), sent
