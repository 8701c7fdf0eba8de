"""Ranks of one job as threads of the test process, each with its own ckpt.Client (and worker
session); the GIL is released while they wait for each other."""

import os
import threading

import torch.distributed as dist

import ckpt
import ckpt.torch


def ranks(world, body, job, workers=None):
    """Runs body(client) for ranks 0..world-1 in threads and returns their results; re-raises
    the first failure. Rank r uses worker r (or r % workers)."""
    results, errors = [None] * world, [None] * world

    def run(rank):
        local_rank = rank if workers is None else rank % workers
        try:
            with ckpt.Client(job=job, rank=rank, world_size=world, local_rank=local_rank) as client:
                results[rank] = body(client)
        except BaseException as e:  # handed to the test thread
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


def local_cluster(tmp_path_factory, num_workers, torch_job=None, check_exits=True,
                  **cluster_args):
    """Yields a ckpt.LocalCluster of `num_workers` workers under a fresh directory, for a
    module-scoped pytest fixture. With `torch_job`, the test process is also a one-rank gloo
    process group of that CKPT_JOB (as ckpt.torch expects), and ckpt.torch's client is shut down
    before the workers. With `check_exits`, every daemon must have exited with code 0.
    `cluster_args` go to ckpt.LocalCluster (e.g. coordinator_args)."""
    root = tmp_path_factory.mktemp("ckpt")
    if torch_job is not None:
        os.environ["CKPT_JOB"] = torch_job
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with ckpt.LocalCluster(num_workers=num_workers, root=root, **cluster_args) as c:
        yield c
        if torch_job is not None:
            ckpt.torch.shutdown()
    if torch_job is not None:
        dist.destroy_process_group()
    if check_exits:
        assert all(code == 0 for code in c.exit_codes.values()), c.exit_codes
