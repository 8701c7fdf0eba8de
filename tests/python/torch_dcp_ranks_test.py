"""ckpt.torch as a drop-in for torch.distributed.checkpoint on 2 spawned gloo processes (issue
41, items 1, 2 and 5), against real daemons and DCP itself: ShardedTensors saved into
directories made before the save and loaded as DTensors, plain tensors and ShardedTensors of
another sharding in both directions, bit for bit, with DCP's checkpoint of the same state
loading into the same values; several shards of one ShardedTensor on a rank, saved over an
existing checkpoint through FileSystemWriter; no_dist and process_group= saves by part of the
job."""

import os
import time
import uuid

import pytest
import torch.multiprocessing as mp

import dcp_compat_ranks  # beside this file
import rank_threads  # beside this file


DEADLINE_S = 300  # per phase; each takes ~40 s on 2 busy cores


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 2)


def spawn(cluster, phase, world=2):
    workdir = os.path.join(cluster.root, f"{phase}-{uuid.uuid4().hex[:8]}")
    os.makedirs(workdir)
    job = f"dcp-{phase}-{uuid.uuid4().hex[:6]}"
    rendezvous = f"file://{workdir}/{phase}.rendezvous"
    context = mp.spawn(dcp_compat_ranks.run, args=(world, rendezvous, job, phase, workdir),
                       nprocs=world, join=False)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:  # a rank waits for another that will not come
                for process in context.processes:
                    process.kill()
                pytest.fail(f"phase {phase} on {world} ranks still running after "
                            f"{DEADLINE_S} s:\n{_errors(workdir)}")
    except mp.ProcessRaisedException:
        pytest.fail(f"phase {phase} on {world} ranks failed:\n{_errors(workdir)}")


def _errors(workdir):
    errors = sorted(f for f in os.listdir(workdir) if f.endswith(".err"))
    return "".join(open(os.path.join(workdir, f)).read() for f in errors)


def test_sharded_tensors_load_as_dtensors_plain_and_resharded_as_with_dcp(cluster):
    """Before: RuntimeError 'untyped_storage ... not supported for ShardedTensor' from
    ckpt/_share.py after the ranks agreed (and AlreadyExists for the directories made first)."""
    spawn(cluster, "sharded")


def test_several_shards_of_a_sharded_tensor_on_one_rank_save_load_and_overwrite_as_dcp(cluster):
    """Before: refused ("this rank holds 2 shards of the ShardedTensor"), and a second save
    through FileSystemWriter into the same directory refused (AlreadyExists)."""
    spawn(cluster, "several")


def test_no_dist_and_a_process_group_save_and_load_with_part_of_the_job(cluster):
    spawn(cluster, "part")
