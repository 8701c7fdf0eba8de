#!/usr/bin/env python3
"""Live transfer throughput against the loopback TCP limit, same run (issue 17).

Starts a ckpt_coordinator and 7 ckpt_workers on loopback (hostA: workers 0-3, hostB: 4-6),
a source job of 8 transfer_probe ranks (TP=4 x DP=2, two per source worker) and a destination
job of 6 ranks (TP=2 x 3 replicas, two per destination worker), all over one int32 tensor of
4 x ELEMENTS. The source publishes REPS versions; after each, the destination receives it.
Per receive it reports the wall time from the moment the test asks the destination ranks to
receive (a ready file) to the last rank's Receive returning, and the throughput of the bytes
delivered into destination tensors (each destination rank's region: 3 x the state). The
source workers send over Gloo/TCP; the loopback limit is measured in the same run by this
script (one TCP stream, sendall/recv_into of 4 MiB buffers between two processes, and as many
parallel streams as serving workers).

Usage: bazel build -c opt //coordinator:ckpt_coordinator //worker:ckpt_worker
         //tests:transfer_probe && python3 tools/bench/transfer_bench.py [--elements N]
       (BIN=bazel-out/k8-opt/bin by default; WORKER_ARGS: extra worker flags, e.g.
       --communicator_cache_entries=0 to join a new communicator for every receive)
"""
import argparse
import multiprocessing
import os
import socket
import subprocess
import tempfile
import time

CHUNK = 4 << 20


def _sink(port, total, ready):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(1)
    ready.set()
    conn, _ = server.accept()
    buf = bytearray(CHUNK)
    got = 0
    while got < total:
        n = conn.recv_into(buf)
        if n == 0:
            break
        got += n
    conn.sendall(b"k")
    conn.close()


def _source(port, total):
    s = socket.create_connection(("127.0.0.1", port))
    data = bytes(CHUNK)
    sent = 0
    while sent < total:
        s.sendall(data)
        sent += CHUNK
    s.recv(1)
    s.close()


def loopback_gbps(streams, total_bytes):
    """GB/s of `streams` parallel loopback TCP streams moving total_bytes together."""
    per = total_bytes // streams
    ports = []
    for _ in range(streams):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        ports.append(probe.getsockname()[1])
        probe.close()
    sinks = []
    for port in ports:
        ready = multiprocessing.Event()
        p = multiprocessing.Process(target=_sink, args=(port, per, ready))
        p.start()
        ready.wait()
        sinks.append(p)
    start = time.perf_counter()
    sources = [multiprocessing.Process(target=_source, args=(port, per)) for port in ports]
    for p in sources:
        p.start()
    for p in sources + sinks:
        p.join()
    return per * streams / (time.perf_counter() - start) / 1e9


def wait_for(predicate, what, timeout=600):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(0.01)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=8 << 20, help="columns (int32) per row")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--budget", type=int, default=0, help="bytes in flight per rank (0: default)")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--algorithm", default="",
                        help="exchange algorithm of the receives (default: broadcast)")
    args = parser.parse_args()
    binary = os.environ.get("BIN", "bazel-out/k8-opt/bin")
    work = tempfile.mkdtemp(prefix="ckpt-transfer-bench.")
    state_bytes = 4 * args.elements * 4
    procs = []

    def spawn(argv, name):
        out = open(os.path.join(work, name + ".out"), "w")
        err = open(os.path.join(work, name + ".err"), "w")
        procs.append(subprocess.Popen(argv, stdout=out, stderr=err))
        return procs[-1]

    try:
        spawn([binary + "/coordinator/ckpt_coordinator", "--listen=127.0.0.1:0",
               "--address_file=" + work + "/addr", "--checkpoint_root=" + work,
               "--log_level=warn"], "coordinator")
        wait_for(lambda: read(work + "/addr"), "the coordinator")
        addr = read(work + "/addr").strip()
        for w in range(7):
            spawn([binary + "/worker/ckpt_worker", "--coordinator=" + addr,
                   "--listen=unix:%s/w%d.sock" % (work, w), "--local_rank=%d" % w,
                   "--host=" + ("hostA" if w < 4 else "hostB"), "--data_plane_address=127.0.0.1",
                   "--ready_file=%s/w%d.ready" % (work, w),
                   "--log_level=" + os.environ.get("WORKER_LOG_LEVEL", "warn"),
                   "--memory_tier_bytes=%d" % (state_bytes * 3)]
                  + os.environ.get("WORKER_ARGS", "").split(), "w%d" % w)
        for w in range(7):
            wait_for(lambda: read("%s/w%d.ready" % (work, w)), "worker %d" % w)
        shape = ["--global_rows", "4", "--elements", str(args.elements), "--step_dir", work,
                 "--name", "bench"]
        probe = binary + "/tests/transfer_probe"
        sources, dests = [], []
        for r in range(8):
            sources.append(spawn([probe, "--worker", "unix:%s/w%d.sock" % (work, r // 2),
                                  "--job", "trainer", "--rank", str(r), "--world_size", "8",
                                  "--mode", "publish", "--tp", "4", "--versions", str(args.reps)]
                                 + shape, "src%d" % r))
        for r in range(6):
            extra = ["--budget", str(args.budget)] + (["--verify", "1"] if args.verify else [])
            if args.algorithm:
                extra += ["--algorithm", args.algorithm]
            dests.append(spawn([probe, "--worker", "unix:%s/w%d.sock" % (work, 4 + r // 2),
                                "--job", "infer", "--rank", str(r), "--world_size", "6",
                                "--mode", "receive", "--tp", "2", "--receives", str(args.reps)]
                               + shape + extra, "dst%d" % r))
        delivered = 3 * state_bytes
        results = []
        for k in range(1, args.reps + 1):
            if k > 1:
                open("%s/publish.%d" % (work, k), "w").close()
            wait_for(lambda: all("durable %d 0 " % k in read("%s/src%d.out" % (work, r))
                                 for r in range(8)), "publish %d" % k)
            start = time.perf_counter()
            open("%s/receive.%d" % (work, k), "w").close()
            wait_for(lambda: all("received %d " % k in read("%s/dst%d.out" % (work, r))
                                 for r in range(6)), "receive %d" % k)
            seconds = time.perf_counter() - start
            # The probe checks every element after Receive returned (untimed).
            wait_for(lambda: all(("holds " in read("%s/dst%d.out" % (work, r)).split(
                "received %d " % k)[-1] or "mixed" in read("%s/dst%d.out" % (work, r)))
                                 for r in range(6)), "check %d" % k)
            ok = all("received %d 0 " % k in read("%s/dst%d.out" % (work, r)) and
                     "holds %d\n" % k in read("%s/dst%d.out" % (work, r)) for r in range(6))
            results.append((k, seconds, ok))
            print("receive %d: %.3f s, %.2f GB/s delivered, bit-exact=%s" %
                  (k, seconds, delivered / seconds / 1e9, ok), flush=True)
        for p in procs[-14:]:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    one = loopback_gbps(1, 2 << 30)
    two = loopback_gbps(2, 2 << 30)
    best = min(s for _, s, ok in results if ok)
    rate = delivered / best / 1e9
    print("state %.0f MiB (TP=4 x DP=2 -> TP=2 x 3), %.0f MiB delivered per receive" %
          (state_bytes / 2**20, delivered / 2**20))
    print("loopback TCP: 1 stream %.2f GB/s, 2 streams %.2f GB/s" % (one, two))
    print("best receive %.3f s = %.2f GB/s = %.0f%% of 1 stream, %.0f%% of 2 streams" %
          (best, rate, 100 * rate / one, 100 * rate / two))
    print("logs in", work)


if __name__ == "__main__":
    main()
