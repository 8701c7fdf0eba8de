#!/usr/bin/env python3
"""Peer measurement for tools/bench/io_benchmark: torch.save / torch.load of the same tensors.

Builds the same state dict as io_benchmark (N BF16 tensors of [elems/1024, 1024], SIZE_MB in
total), then times torch.save into one file (flushed and fsynced, like our committed save) and
torch.load of it after evicting the file from the page cache (posix_fadvise DONTNEED), so both
sides read from storage. Prints GB/s in the same shape as io_benchmark.

  .venv/bin/python tools/bench/torch_peer.py --dir /tmp/ckpt_bench --size_mb 2048
"""
import argparse
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/ckpt_bench")
    ap.add_argument("--size_mb", type=int, default=2048)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    per_tensor = (args.size_mb << 20) // args.tensors // 4096 * 4096
    elems = per_tensor // 2
    state = {}
    for t in range(args.tensors):
        x = torch.arange(elems, dtype=torch.int64).mul_(0x9E3779B1).remainder_(65521)
        state[f"layers.{t}.weight"] = x.to(torch.bfloat16).reshape(elems // 1024, 1024)
    total = per_tensor * args.tensors
    path = os.path.join(args.dir, "torch_peer.pt")

    saves, loads = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        saves.append(time.perf_counter() - t0)

        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        t0 = time.perf_counter()
        loaded = torch.load(path)
        loads.append(time.perf_counter() - t0)
        assert all(torch.equal(loaded[k], v) for k, v in state.items())
        del loaded
    os.remove(path)

    gb = total / 1e9
    print(f"torch_peer: torch {torch.__version__}, {gb:.2f} GB in {args.tensors} BF16 tensors, "
          f"median of {args.repeat} runs")
    print(f"{'measurement':34s} {'GB/s':>10s} {'seconds':>10s}")
    for name, ts in (("torch.save (fsynced)", saves), ("torch.load (cold cache)", loads)):
        m = statistics.median(ts)
        print(f"{name:34s} {gb / m:10.3f} {m:10.3f}")


if __name__ == "__main__":
    main()
