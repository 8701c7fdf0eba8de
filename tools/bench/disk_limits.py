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
