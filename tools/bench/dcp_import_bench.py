#!/usr/bin/env python3
"""DCP import speed: `ckptctl import --from dcp` of a >= 2 GB DCP checkpoint, next to the disk's
read bandwidth and DCP's own dcp.load of the same checkpoint into plain tensors, all measured
in one run on the same files.

  bazel build //tools:ckptctl
  .venv/bin/python tools/bench/dcp_import_bench.py --dir /tmp/ckpt_bench_dcp --size_mb 2304

1. dcp.save (FileSystemWriter, 4 writer threads -> 4 .distcp files) of --tensors fp32/bf16
   tensors (one item each), unless the directory already holds that checkpoint.
2. Disk bandwidth: every .distcp file read with dd (bs=16M, O_DIRECT: straight from the
   disk, no page cache), and as many bytes written with dd (O_DIRECT, fsynced): an import
   reads the DCP bytes and writes as many, so its floor on one disk is read + write time.
3. ckptctl import --from dcp (wall clock of the whole command: Python start, metadata, reading
   and torch.load of every item, writing and fsyncing the ckpt data files, commit), after
   evicting the source files from the page cache (posix_fadvise DONTNEED), --repeat times.
4. dcp.load into preallocated plain tensors (one process, no_dist), after the same eviction.
Prints one line per measurement and a JSON summary.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def state_dict(size_mb, tensors):
    per_tensor = (size_mb << 20) // tensors // 4096 * 4096
    state = {}
    for t in range(tensors):
        dtype = torch.float32 if t % 2 == 0 else torch.bfloat16
        elems = per_tensor // (4 if dtype == torch.float32 else 2)
        x = torch.arange(elems, dtype=torch.int64).mul_(0x9E3779B1).remainder_(65521)
        state[f"layers.{t}.weight"] = x.to(dtype).reshape(elems // 1024, 1024)
    return state


def evict(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_of(path):
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".distcp"))


def du(paths):
    return sum(os.path.getsize(p) for p in paths)


def ensure_checkpoint(path, size_mb, tensors):
    marker = os.path.join(path, f".bench-{size_mb}-{tensors}")
    if os.path.exists(marker):
        return
    shutil.rmtree(path, ignore_errors=True)
    state = state_dict(size_mb, tensors)
    dcp.save(state, storage_writer=FileSystemWriter(path, thread_count=4), no_dist=True)
    open(marker, "w").close()


def dd_read(paths):
    start = time.perf_counter()
    for p in paths:
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=16M", "iflag=direct"], check=True,
                       capture_output=True)
    return time.perf_counter() - start


def dd_write(path, total):
    count = max(1, total // (16 << 20))
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}",
                    "oflag=direct", "conv=fsync"], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    os.unlink(path)
    return count * (16 << 20) / seconds / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/ckpt_bench_dcp")
    ap.add_argument("--size_mb", type=int, default=2304)
    ap.add_argument("--tensors", type=int, default=24)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ckptctl", default=os.path.join(REPO, "bazel-bin", "tools", "ckptctl"))
    args = ap.parse_args()

    src = os.path.join(args.dir, "dcp")
    dst = os.path.join(args.dir, "imported")
    os.makedirs(args.dir, exist_ok=True)
    ensure_checkpoint(src, args.size_mb, args.tensors)
    paths = files_of(src)
    total = du(paths)
    print(f"DCP checkpoint {src}: {len(paths)} files, {total / 1e9:.3f} GB")

    disk = total / dd_read(paths) / 1e9
    write = dd_write(os.path.join(args.dir, "dd-write.tmp"), total)
    floor = 1 / (1 / disk + 1 / write)  # GB of DCP per second when reading and writing it
    print(f"dd (O_DIRECT) read: {disk:.3f} GB/s, write: {write:.3f} GB/s; read+write of the "
          f"same bytes: {floor:.3f} GB/s")

    imports = []
    for _ in range(args.repeat):
        shutil.rmtree(dst, ignore_errors=True)
        evict(paths)
        start = time.perf_counter()
        subprocess.run([args.ckptctl, "import", "--from", "dcp", src, dst, "--workers",
                        str(args.workers)], check=True, capture_output=True)
        seconds = time.perf_counter() - start
        imports.append(total / seconds / 1e9)
        print(f"ckptctl import --from dcp ({args.workers} workers): {seconds:.2f} s, "
              f"{imports[-1]:.3f} GB/s of DCP read (and as much written, fsynced)")

    loads = []
    template = state_dict(args.size_mb, args.tensors)
    target = {k: torch.empty_like(v) for k, v in template.items()}
    del template
    for _ in range(args.repeat):
        evict(paths)
        start = time.perf_counter()
        dcp.load(target, checkpoint_id=src, no_dist=True)
        seconds = time.perf_counter() - start
        loads.append(total / seconds / 1e9)
        print(f"dcp.load into plain tensors: {seconds:.2f} s, {loads[-1]:.3f} GB/s")

    summary = {"bytes": total, "files": len(paths), "disk_read_gbps": round(disk, 3),
               "disk_write_gbps": round(write, 3), "read_plus_write_gbps": round(floor, 3),
               "import_gbps": [round(x, 3) for x in imports],
               "import_fraction_of_disk_read": round(max(imports) / disk, 3),
               "import_fraction_of_read_plus_write": round(max(imports) / floor, 3),
               "dcp_load_gbps": [round(x, 3) for x in loads],
               "import_vs_dcp_load": round(max(imports) / max(loads), 3),
               "workers": args.workers, "cpus": os.cpu_count()}
    print(json.dumps(summary))
    shutil.rmtree(dst, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
