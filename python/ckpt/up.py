"""``python -m ckpt.up``: ckpt's daemons for this host in one line (``ckptctl up``-style).

    # one host: a coordinator and 4 workers, then the trainer; everything stops when it exits
    python -m ckpt.up --workers 4 --root /data/ckpt -- torchrun --nproc-per-node 4 train.py

    # or keep them up until Ctrl-C, and source the environment trainers need
    python -m ckpt.up --workers 4 --root /data/ckpt --env-file /tmp/ckpt.env &
    source /tmp/ckpt.env    # CKPT_WORKER_DIR, CKPT_COORDINATOR_ADDRESS

    # many hosts: one coordinator (head), and on every node a worker per GPU
    python -m ckpt.up --coordinator-only --listen 0.0.0.0:7400 --root /shared/ckpt \\
        --coordinator-arg=--tls_ca=ca.pem ...            # or --coordinator-arg=--insecure
    python -m ckpt.up --join head:7400 --workers 8 --worker-arg=--data_plane_address=$IP \\
        -- torchrun --nnodes 4 --nproc-per-node 8 ... train.py

Readiness is the daemons' own signal (the coordinator's address file, each worker's ready file
after it registered); SIGINT/SIGTERM stop the workers, then the coordinator, cleanly. The
daemons do not outlive this process even when it is killed (SIGKILL, OOM): they get SIGTERM
through PR_SET_PDEATHSIG, and the next LocalCluster on the host removes the socket directory
left behind (ckpt.cluster). Workers started by hand or by a service manager are not tied to
anything: they outlive coordinator restarts on purpose.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading

from ckpt.cluster import LocalCluster


def _parser():
    p = argparse.ArgumentParser(prog="python -m ckpt.up", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1, help="workers on this host (one per GPU)")
    p.add_argument("--root", default=os.getcwd(),
                   help="checkpoint root the coordinator accepts paths under (default: cwd)")
    p.add_argument("--join", metavar="HOST:PORT",
                   help="start only workers, registering with this running coordinator")
    p.add_argument("--coordinator-only", action="store_true", help="start only the coordinator")
    p.add_argument("--listen", default="127.0.0.1:0",
                   help="the coordinator's address (port 0: any free port)")
    p.add_argument("--first-local-rank", type=int, default=0)
    p.add_argument("--socket-dir", help="where the workers' sockets go (default: a new /tmp dir)")
    p.add_argument("--bin-dir", help="directory of ckpt_coordinator and ckpt_worker")
    p.add_argument("--env-file", help="write `export NAME=value` lines for trainers here")
    p.add_argument("--coordinator-arg", action="append", default=[],
                   help="extra coordinator flag (repeatable), e.g. --coordinator-arg=--insecure")
    p.add_argument("--worker-arg", action="append", default=[], help="extra worker flag")
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- COMMAND...: run it with the environment set, stop when it exits")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cluster = LocalCluster(
        num_workers=0 if args.coordinator_only else args.workers, root=args.root,
        bin_dir=args.bin_dir, coordinator=args.join, first_local_rank=args.first_local_rank,
        socket_dir=args.socket_dir, coordinator_args=args.coordinator_arg,
        worker_args=args.worker_arg, listen=args.listen, start_timeout=args.start_timeout)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with cluster:
        env_lines = "".join(f"export {k}={v}\n" for k, v in cluster.env.items() if v)
        if args.env_file:
            with open(args.env_file + ".tmp", "w") as f:
                f.write(env_lines)
            os.replace(args.env_file + ".tmp", args.env_file)  # complete when it appears
        print(f"ckpt up: coordinator {cluster.address}, {cluster.num_workers} workers "
              f"(sockets in {cluster.socket_dir}, logs in {cluster.log_dir})", flush=True)
        print(env_lines, end="", flush=True)
        if command:
            child = subprocess.Popen(command)
            while child.poll() is None and not stop.is_set():
                stop.wait(0.2)  # a signal or the command's end, whichever comes first
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            return child.wait()
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
