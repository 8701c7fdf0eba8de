"""Ranks of one job as threads of the test process, each with its own ckpt.Client (and worker
session); the GIL is released while they wait for each other."""

import threading

import ckpt


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
