#!/usr/bin/env python3
"""ckpt against torch.distributed.checkpoint (DCP) on the same CUDA state, same run (issue 13).

NOT YET RUN: written on a machine without a GPU; tools/gpu_suite.sh runs it on one.

The state: TENSORS int32 CUDA tensors of BYTES / TENSORS bytes each, element i of tensor t
equal to i ^ (t * 0x01010101), on one GPU (one rank: one GPU cannot host more NCCL ranks).
  ckpt  a coordinator and a worker (--gpu 0) from BIN (a Bazel runfiles tree or the GPU
        bundle), and tools/bench/device_bench_trainer (the C++ client, CUDA IPC): Save timed
        until it returns (what training waits for) and until durable (WaitDurable), Load
        timed into zeroed tensors, every element checked. The Python client does not take CUDA
        tensors yet, so ckpt.torch is not what is measured here.
  DCP   the same tensors built in torch: dcp.save, dcp.async_save (until the call returns, and
        until its future resolves), dcp.load into zeroed tensors, every element checked.
Before every load the checkpoint's files are evicted from the page cache (posix_fadvise; both
systems fsync), so both read from the disk. The disk's own limit (dd, direct I/O) and the GPU
are printed with the table. REPS repetitions each; the table shows the median.

  python3 tools/bench/device_dcp_bench.py --bin gpu-bundle/runfiles/ckpt \\
      --trainer gpu-bundle/bin/device_bench_trainer --dir /var/tmp/dcpb --gb 8
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from disk_limits import dd_limits, evict  # noqa: E402


def wait_for_file(path, proc, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return open(path).read().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready within {timeout:.0f} s")


def bundle_env():
    """The environment of ckpt's binaries: CKPT_BUNDLE_LD_LIBRARY_PATH (tools/gpu_suite.sh sets
    it to the bundle's libraries, which torch in this process must not see) as their library
    path."""
    env = dict(os.environ)
    if os.environ.get("CKPT_BUNDLE_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["CKPT_BUNDLE_LD_LIBRARY_PATH"]
    return env


def run_ckpt(args, nbytes, work):
    """The ckpt side: daemons + the C++ trainer; returns its per-repetition JSON records."""
    env = bundle_env()
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    address_file = os.path.join(work, "coordinator.address")
    ready_file = os.path.join(work, "worker.ready")
    socket = os.path.join(work, "worker.sock")
    procs = []
    try:
        coordinator = subprocess.Popen(
            [os.path.join(args.bin, "coordinator/ckpt_coordinator"), "--listen=127.0.0.1:0",
             f"--address_file={address_file}", f"--state_dir={work}/coordinator-state",
             f"--checkpoint_root={work}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(logs, "coordinator.log"), "w"),
            env=env)
        procs.append(coordinator)
        address = wait_for_file(address_file, coordinator, "ckpt_coordinator")
        worker = subprocess.Popen(
            [os.path.join(args.bin, "worker/ckpt_worker"), f"--coordinator={address}",
             f"--listen=unix:{socket}", "--local_rank=0", "--gpu=0", f"--ready_file={ready_file}",
             f"--pinned_staging_bytes={args.pinned_bytes}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(logs, "worker.log"), "w"),
            env=env)
        procs.append(worker)
        wait_for_file(ready_file, worker, "ckpt_worker")
        out = subprocess.run(
            [args.trainer, "--worker", f"unix:{socket}", "--dir", os.path.join(work, "ckpt"),
             "--bytes", str(nbytes), "--tensors", str(args.tensors), "--reps", str(args.reps)],
            capture_output=True, text=True, env=env)
        sys.stderr.write(out.stderr)
        if out.returncode != 0:
            raise RuntimeError(f"device_bench_trainer failed ({out.returncode}): {out.stderr}")
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def run_dcp(args, nbytes, work):
    """The DCP side on the same tensors; returns per-repetition records like the trainer's."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{work}/pg", rank=0,
                            world_size=1)
    elements = nbytes // 4 // args.tensors
    index = torch.arange(elements, dtype=torch.int32, device="cuda")
    want = {f"t{t}": index ^ (t * 0x01010101) for t in range(args.tensors)}
    state = {k: v.clone() for k, v in want.items()}
    del index
    records = []

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t, result

    def load_and_check(path):
        for v in state.values():
            v.zero_()
        evict(path)
        seconds, _ = timed(lambda: dcp.load(state, checkpoint_id=path))
        for k, v in state.items():
            if not torch.equal(v, want[k]):
                raise RuntimeError(f"DCP: tensor {k} differs after the load")
        return seconds

    for rep in range(args.reps):
        path = os.path.join(work, f"dcp-{rep}")
        shutil.rmtree(path, ignore_errors=True)
        save_s, _ = timed(lambda: dcp.save(state, checkpoint_id=path))
        load_s = load_and_check(path)
        shutil.rmtree(path)
        start = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=path)
        async_block = time.perf_counter() - start
        future.result()
        async_total = time.perf_counter() - start
        shutil.rmtree(path)
        records.append({"rep": rep, "save_s": save_s, "load_s": load_s,
                        "async_blocking_s": async_block, "async_durable_s": async_total})
    dist.destroy_process_group()
    return records


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="directory holding coordinator/ and worker/")
    p.add_argument("--trainer", required=True, help="the device_bench_trainer binary")
    p.add_argument("--dir", default="/var/tmp/device_dcp_bench")
    p.add_argument("--gb", type=float, default=8.0)
    p.add_argument("--tensors", type=int, default=32)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--pinned_bytes", type=int, default=512 << 20)
    args = p.parse_args()
    nbytes = int(args.gb * (1 << 30)) // (4 * args.tensors) * (4 * args.tensors)
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(dir=args.dir)
    try:
        import torch
        gpu = torch.cuda.get_device_name(0)
        disk = dd_limits(work, min(args.gb, 4.0))
        ckpt = run_ckpt(args, nbytes, work)
        dcp = run_dcp(args, nbytes, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = lambda records, key: statistics.median(r[key] for r in records)
    gb = nbytes / 1e9
    print(f"state: {gb:.2f} GB int32 in {args.tensors} CUDA tensors on {gpu}, one rank; "
          f"torch {torch.__version__}; {args.reps} repetitions (median)")
    print(f"disk (dd, same run): write {disk[0]:.2f} GB/s, read {disk[1]:.2f} GB/s")
    print(f"{'':22s} {'ckpt (C++ client)':>20s} {'DCP':>20s} {'DCP time / ckpt':>16s}")
    rows = [("save (until durable)", med(ckpt, "save_durable_s"), med(dcp, "save_s")),
            ("save blocking", med(ckpt, "save_blocking_s"), med(dcp, "async_blocking_s")),
            ("async_save durable", med(ckpt, "save_durable_s"), med(dcp, "async_durable_s")),
            ("load", med(ckpt, "load_s"), med(dcp, "load_s"))]
    for what, c, d in rows:
        rate = lambda s: f"{s:7.2f} s {gb / s:6.2f} GB/s"
        print(f"{what:22s} {rate(c):>20s} {rate(d):>20s} {d / c:15.2f}x")
    print("save blocking: ckpt's Save returning (snapshot taken) against dcp.async_save "
          "returning; dcp.save blocks until durable")
    print(json.dumps({"bytes": nbytes, "ckpt": ckpt, "dcp": dcp, "disk_gbps": disk}))


if __name__ == "__main__":
    main()
