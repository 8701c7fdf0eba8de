#!/usr/bin/env python3
"""Peer benchmark: PyTorch's Gloo backend doing what //exchange:exchange_benchmark measures.

Runs on the same machine, over 127.0.0.1, with N processes (one per rank):
  barrier_only   nothing between the barriers: the harness's own overhead
  broadcast      64 MiB from rank 0                      (bytes = payload)
  all_gather     64 MiB gathered, 64 MiB / N per rank     (bytes = gathered size; torch's Gloo
                 all_gather needs equal sizes, ours is the uneven all-gather-v)
  all_to_all     all_to_all_single moving the same wire bytes as the row->column reshard in
                 BM_OverlapAllToAll (each rank sends 64 MiB / N^2 to every peer)
  overlap_reshard  the row->column reshard itself, done the natural PyTorch way: a 64 MiB f32
                 matrix with 4096 columns; rank r holds row chunk r (torch.chunk over N) and
                 needs every row of column chunk r. Per call: pack the per-peer column slices
                 with one torch.cat (a fresh tensor), allocate the output, all_to_all_single with
                 split sizes; the rows arrive in peer = row-chunk order, so the received buffer
                 already is the output block (no assembly copy). Bytes = wire bytes, as ours.
Prints the median time and GB/s (GiB/s, as Google Benchmark's "G/s") per collective.

Usage: .venv/bin/python tools/bench/torch_gloo_peer.py [--ranks 2 4] [--mib 64] [--reps 20]
       [--no-trailing-barrier]
(.venv is the project's Python environment from tools/install_deps.sh: torch with Gloo.)
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, reps, trailing_barrier=True):
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        if trailing_barrier:
            dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(rank, world, port, nbytes, reps, trailing_barrier, results):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    buf = torch.full((nbytes,), rank, dtype=torch.uint8)
    part = nbytes // world
    mine = torch.full((part,), rank, dtype=torch.uint8)
    gathered = [torch.empty(part, dtype=torch.uint8) for _ in range(world)]
    per_peer = nbytes // (world * world)
    a2a_in = torch.full((per_peer * world,), rank, dtype=torch.uint8)
    a2a_out = torch.empty(per_peer * world, dtype=torch.uint8)
    # Row -> column reshard (same tensor as exchange/reshard_bench_plan.cc).
    cols = 4096
    rows = nbytes // 4 // cols
    row_chunks = torch.arange(rows).chunk(world)
    local = torch.full((len(row_chunks[rank]), cols), float(rank), dtype=torch.float32)
    col_sizes = [len(c) for c in torch.arange(cols).chunk(world)]
    col_sizes += [0] * (world - len(col_sizes))
    my_cols = col_sizes[rank]
    send_splits = [len(row_chunks[rank]) * c for c in col_sizes]
    recv_splits = [len(row_chunks[p]) * my_cols if p < len(row_chunks) else 0 for p in range(world)]

    def overlap_reshard():
        send = torch.cat(local.split(col_sizes, dim=1), dim=0).view(-1)
        out = torch.empty(sum(recv_splits), dtype=torch.float32)
        dist.all_to_all_single(out, send, recv_splits, send_splits)
        return out.view(rows, my_cols)

    # Check it once, outside the timing: row chunk p of the output came from rank p.
    check = overlap_reshard()
    for p, rc in enumerate(row_chunks):
        if len(rc) and my_cols and not bool((check[rc] == float(p)).all()):
            raise RuntimeError(f"rank {rank}: overlap_reshard rows of rank {p} are wrong")
    reshard_wire = sum(send_splits[p] for p in range(world) if p != rank) * 4
    wire = torch.tensor([reshard_wire], dtype=torch.int64)
    dist.all_reduce(wire)

    ops = {
        "barrier_only": (lambda: None, 0),
        "broadcast": (lambda: dist.broadcast(buf, 0), nbytes),
        "all_gather": (lambda: dist.all_gather(gathered, mine), part * world),
        "all_to_all": (lambda: dist.all_to_all_single(a2a_out, a2a_in),
                       per_peer * world * (world - 1)),
        "overlap_reshard": (overlap_reshard, int(wire.item())),
    }
    for name, (fn, moved) in ops.items():
        fn()  # warm-up
        t = timed(fn, reps, trailing_barrier)
        if rank == 0:
            results[(world, name)] = (t, moved)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-trailing-barrier", action="store_true",
                        help="time the op alone on rank 0 (as exchange_process_benchmark "
                             "--trailing_barrier=0)")
    args = parser.parse_args()
    nbytes = args.mib << 20
    print(f"torch {torch.__version__}, gloo available: {dist.is_gloo_available()}")
    with mp.Manager() as manager:
        results = manager.dict()
        for world in args.ranks:
            mp.spawn(worker, args=(world, free_port(), nbytes, args.reps, not args.no_trailing_barrier, results), nprocs=world)
        print(f"{'collective':<15} {'ranks':>5} {'median ms':>10} {'GiB/s':>8}")
        for (world, name), (t, moved) in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rate = moved / t / 2**30 if t > 0 else 0.0
            print(f"{name:<15} {world:>5} {t * 1e3:>10.1f} {rate:>8.2f}")


if __name__ == "__main__":
    main()
