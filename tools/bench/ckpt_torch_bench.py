#!/usr/bin/env python3
"""ckpt.torch against torch.distributed.checkpoint (DCP) on FSDP2-sharded state, same run.

Starts a ckpt LocalCluster (a coordinator and one worker per process) and PROCS processes
(gloo on the CPU, torchrun-style). Each builds a stack of Linear layers sharded with
fully_shard (about GB of fp32 parameters in all; each rank holds 1/PROCS), then, per repetition
and alternating which system goes first:
  save   ckpt.torch.save / dcp.save into a fresh directory (both fsync their files);
  load   ckpt.torch.load / dcp.load back into the same state dict in place, after the
         checkpoint's files were evicted from the page cache (posix_fadvise DONTNEED), so both
         read from the disk;
  async  ckpt.torch.async_save / dcp.async_save: the time until the call returns (what
         training waits for) and until the checkpoint is durable.
Times are the wall time of the collective (barrier before, barrier after); with several
repetitions the first save (one-time costs) and the later ones are also shown apart. CPU
seconds per save and load: the trainers' (process time, summed over ranks) and the ckpt
daemons' (from /proc, coordinator and workers; zero for DCP's own work). The disk's own
limit is measured in the same run with dd (write with oflag=direct conv=fsync, read with
iflag=direct) on a file of the state's size.

  bazel build //python:ckpt //coordinator:ckpt_coordinator //worker:ckpt_worker
  PYTHONPATH=python .venv/bin/python tools/bench/ckpt_torch_bench.py --dir /var/tmp/ckb --gb 2
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disk_limits import dd_limits, evict  # noqa: E402


def rank_main(rank, world, port, args, result_file):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), CKPT_JOB="bench")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ckpt.torch

    dist.init_process_group("gloo", rank=rank, world_size=world)
    layers = max(1, round(args.gb * (1 << 30) / 4 / (args.hidden * args.hidden)))
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(args.hidden, args.hidden, bias=False)
                                      for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.to_local().copy_(torch.arange(p.to_local().numel(), dtype=torch.float32)
                               .view_as(p.to_local()) * (i + 1) + rank)
    sd = get_model_state_dict(model)
    sums = {k: float(v.to_local().sum()) for k, v in sd.items()}
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())  # global (DTensor)

    cpu = {}  # (system, what) -> [this rank's CPU seconds, the daemons' CPU seconds] per rep

    def timed(fn, account=None):
        dist.barrier()
        t, c, d = time.perf_counter(), time.process_time(), daemon_cpu(args.daemon_pids)
        out = fn()
        dist.barrier()
        if account is not None:
            cpu.setdefault(account, []).append(
                [time.process_time() - c, daemon_cpu(args.daemon_pids) - d])
        return time.perf_counter() - t, out

    def clear():
        with torch.no_grad():
            for v in sd.values():
                v.to_local().zero_()

    def check(what):
        bad = [k for k, v in sd.items() if float(v.to_local().sum()) != sums[k]]
        if bad:
            raise AssertionError(f"{what}: {bad[0]} differs after the load")

    systems = {
        "ckpt": (lambda p: ckpt.torch.save(sd, checkpoint_id=p),
                 lambda p: ckpt.torch.load(sd, checkpoint_id=p),
                 lambda p: ckpt.torch.async_save(sd, checkpoint_id=p)),
        "dcp": (lambda p: dcp.save(sd, checkpoint_id=p),
                lambda p: dcp.load(sd, checkpoint_id=p),
                lambda p: dcp.async_save(sd, checkpoint_id=p)),
    }
    results = {name: {"save": [], "load": [], "async_block": [], "async_total": []}
               for name in systems}
    for rep in range(args.reps):
        order = list(systems) if rep % 2 == 0 else list(reversed(systems))
        for name in order:
            save, load, async_save = systems[name]
            path = os.path.join(args.dir, f"{name}-{rep}")
            dt, _ = timed(lambda: save(path), (name, "save"))
            results[name]["save"].append(dt)
            if rank == 0:
                evict(path)
            clear()
            dt, _ = timed(lambda: load(path), (name, "load"))
            results[name]["load"].append(dt)
            check(f"{name} load")
            apath = path + "-async"
            dist.barrier()
            t = time.perf_counter()
            future = async_save(apath)
            block = time.perf_counter() - t
            future = getattr(future, "upload_completion", future)
            future.result()
            dist.barrier()
            results[name]["async_block"].append(block)
            results[name]["async_total"].append(time.perf_counter() - t)
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
                shutil.rmtree(apath, ignore_errors=True)
            dist.barrier()
    for (name, what), reps in cpu.items():
        results[name][what + "_cpu"] = reps
    gathered = [None] * world
    dist.all_gather_object(gathered, results, group=None)
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump({"per_rank": gathered, "bytes": nbytes, "layers": layers}, f)
    ckpt.torch.shutdown()
    dist.destroy_process_group()


def daemon_cpu(pids):
    """CPU seconds (user + system) the daemons (coordinator, workers) used so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def summarize_cpu(data, args):
    """CPU seconds per collective: the trainers' (summed over ranks) and the daemons'."""
    print("CPU seconds per collective (median): trainers (all ranks) + ckpt daemons")
    for what in ("save", "load"):
        cells = []
        for name in ("ckpt", "dcp"):
            reps = range(args.reps)
            trainers = statistics.median(sum(r[name][what + "_cpu"][i][0]
                                             for r in data["per_rank"]) for i in reps)
            daemons = statistics.median(data["per_rank"][0][name][what + "_cpu"][i][1]
                                        for i in reps)
            cells.append(f"{name} {trainers:6.2f} + {daemons:5.2f}")
        print(f"{what:12s} " + "   ".join(cells))


def summarize(data, disk, args):
    gb = data["bytes"] / 1e9
    rows = []
    for what in ("save", "load", "async_block", "async_total"):
        line = {}
        for name in ("ckpt", "dcp"):
            # The collective's time: what the slowest rank saw (blocking time: the slowest too).
            per_rep = [max(r[name][what][i] for r in data["per_rank"]) for i in range(args.reps)]
            line[name] = statistics.median(per_rep)
        rows.append((what, line))
    print(f"state: {gb:.2f} GB fp32 in {data['layers']} Linear({args.hidden}, {args.hidden}) "
          f"layers, fully_shard over {args.procs} processes; {args.reps} repetitions (median)")
    print(f"disk (dd, same run): write {disk[0]:.2f} GB/s, read {disk[1]:.2f} GB/s")
    if args.reps > 1:
        # The first save pays one-time costs (ckpt: moving large tensors into shared memory
        # and the workers' first touch of it); later saves are what a training run repeats.
        for label, picked in (("save_first", [0]), ("save_later", range(1, args.reps))):
            line = {name: statistics.median(max(r[name]["save"][i] for r in data["per_rank"])
                                            for i in picked) for name in ("ckpt", "dcp")}
            rows.insert(len(rows) - 3, (label, line))
    print(f"{'':12s} {'ckpt.torch':>18s} {'DCP':>18s} {'ckpt/DCP speed':>15s}")
    for what, line in rows:
        c, d = line["ckpt"], line["dcp"]
        rate = lambda s: f"{s:6.2f} s {gb / s:5.2f} GB/s"
        print(f"{what:12s} {rate(c):>18s} {rate(d):>18s} {d / c:14.2f}x")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="/var/tmp/ckpt_torch_bench")
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--log-dir", default=None,
                   help="keep the daemons' logs here (per-phase seconds of each save and load)")
    args = p.parse_args()
    import torch.multiprocessing as mp

    import ckpt

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    args.dir = os.path.realpath(args.dir)
    disk = dd_limits(args.dir, args.gb)
    result_file = os.path.join(args.dir, "results.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ckpt.LocalCluster(num_workers=args.procs, root=args.dir, log_dir=args.log_dir) as c:
        args.daemon_pids = [p.pid for _, p in c._workers] + [c._coordinator.pid]
        mp.spawn(rank_main, args=(args.procs, port, args, result_file), nprocs=args.procs)
    with open(result_file) as f:
        data = json.load(f)
    summarize(data, disk, args)
    summarize_cpu(data, args)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
