"""The disk's own limits for the Python benchmarks, measured in the same run as what they
compare: page-cache eviction of written files and dd write/read throughput with O_DIRECT."""
import os
import subprocess
import time


def evict(path):
    """Drops `path`'s files from the page cache (they are fsynced, so the pages are clean)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def dd_limits(directory, gb):
    """(write GB/s, read GB/s) of the disk under `directory` for a file of `gb` GB."""
    path = os.path.join(directory, "dd.bin")
    count = max(1, int(gb * 16))  # 64 MiB blocks

    def run(args):
        t = time.perf_counter()
        out = subprocess.run(["dd", *args, "bs=64M", f"count={count}", "status=none"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return count * (64 << 20) / (time.perf_counter() - t) / 1e9

    write = run(["if=/dev/zero", f"of={path}", "oflag=direct", "conv=fsync"])
    evict(path)
    read = run([f"if={path}", "of=/dev/null", "iflag=direct"])
    os.unlink(path)
    return write, read


# ---- The limits tools/bench/bandwidth.py measures in the same run as every path --------------


def _dd(args):
    """Seconds of one dd run (raises with dd's message on failure)."""
    t = time.perf_counter()
    out = subprocess.run(["dd", *args, "status=none"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("dd " + " ".join(args) + ": " + out.stderr.strip())
    return time.perf_counter() - t


def dd_write(path, nbytes, direct):
    """GB/s of dd writing nbytes (64 MiB blocks) to `path`, fsynced before dd exits: through the
    page cache (conv=fsync) or around it (oflag=direct conv=fsync). Leaves the file in place."""
    count = max(1, nbytes >> 26)
    flags = ["oflag=direct", "conv=fsync"] if direct else ["conv=fsync"]
    return count * (64 << 20) / _dd(["if=/dev/zero", f"of={path}", "bs=64M", f"count={count}",
                                     *flags]) / 1e9


def drop_caches():
    """Empties the whole page cache (sync, then 3 > /proc/sys/vm/drop_caches) where this process
    may: as root, or through `sudo -n`. Returns how it was done, or None where it may not."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches (root)"
    except OSError:
        pass
    try:
        out = subprocess.run(["sudo", "-n", "sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"],
                             capture_output=True, timeout=30)
        if out.returncode == 0:
            return "drop_caches (sudo)"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None


def cold_read(path, allow_drop=True):
    """(GB/s, how) of reading `path` whole from the disk: after dropping the page cache, through
    it (bs=64M), where that is allowed; otherwise with O_DIRECT (iflag=direct)."""
    nbytes = os.path.getsize(path)
    how = drop_caches() if allow_drop else None
    if how:
        return nbytes / _dd([f"if={path}", "of=/dev/null", "bs=64M"]) / 1e9, how
    evict(path)
    return nbytes / _dd([f"if={path}", "of=/dev/null", "bs=64M", "iflag=direct"]) / 1e9, "O_DIRECT"


def _copy_part(nbytes, fresh, barrier, out):
    src = bytearray(b"\x5a" * nbytes)
    dst = None if fresh else bytearray(nbytes)
    if dst is not None:
        memoryview(dst)[:] = src  # faults the destination in: the timed copy reuses it
    barrier.wait()
    t = time.perf_counter()
    if fresh:
        dst = bytearray(nbytes)  # calloc: newly mapped pages, faulted in by the copy
    memoryview(dst)[:] = src
    out.put(time.perf_counter() - t)


def memcpy_gbps(nbytes, procs=1, fresh=False, repeat=3):
    """GB/s of a memcpy of nbytes split over `procs` processes copying side by side (the best of
    `repeat`), into memory already touched or, with fresh, into newly allocated memory."""
    import multiprocessing
    mp = multiprocessing.get_context("fork")
    part = max(1, nbytes // procs)
    best = None
    for _ in range(repeat):
        barrier, out = mp.Barrier(procs), mp.Queue()
        ps = [mp.Process(target=_copy_part, args=(part, fresh, barrier, out))
              for _ in range(procs)]
        for p in ps:
            p.start()
        slowest = max(out.get(timeout=600) for _ in ps)
        for p in ps:
            p.join()
        best = slowest if best is None else min(best, slowest)
    return part * procs / best / 1e9
