"""Daemons started by ckpt.LocalCluster and `python -m ckpt.up` do not outlive their owner
(python/ckpt/cluster.py): killed with SIGKILL, the owner takes its coordinator and workers with
it (they get SIGTERM through PR_SET_PDEATHSIG), a cluster started from a short-lived thread
keeps its daemons after that thread ends, and socket directories are removed on stop and, for
an owner that was killed, at the next start."""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

import ckpt
from ckpt import cluster as cluster_module

GONE_DEADLINE_S = 60  # a worker's clean shutdown waits at most a few RPC deadlines


# Start time of a process (clock ticks since boot); None when gone or a zombie.
proc_start_time = cluster_module._start_time


def wait_until_gone(pids):
    """{pid: start time} -> those still running after the deadline (polls /proc: the processes
    are not our children, nothing notifies us of their end)."""
    deadline = time.monotonic() + GONE_DEADLINE_S
    alive = dict(pids)
    while alive and time.monotonic() < deadline:
        alive = {p: t for p, t in alive.items() if proc_start_time(p) == t}
        if alive:
            time.sleep(0.05)
    return alive


def kill_leftovers(pids):
    for pid, started in pids.items():
        if proc_start_time(pid) == started:
            os.kill(pid, signal.SIGKILL)


def read_line(proc, timeout):
    """The child's next stdout line, or a failure naming what it wrote to stderr."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"no line within {timeout}s; stderr: {proc.stderr.read().decode()[-2000:]}")
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"the child exited first: {proc.stderr.read().decode()[-2000:]}")
    return line


OWNER = """
import json, sys, threading, ckpt
c = ckpt.LocalCluster(num_workers=2, root=sys.argv[1]).start()
pids = [c._coordinator.pid] + [p.pid for _, p in c._workers]
print(json.dumps({"pids": pids, "socket_dir": c.socket_dir}), flush=True)
threading.Event().wait()
"""


def test_daemons_exit_when_their_owner_is_killed_and_its_directory_goes_at_the_next_start(
        tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = json.loads(read_line(owner, 120))
    pids = {p: proc_start_time(p) for p in started["pids"]}
    assert all(pids.values()) and len(pids) == 3
    try:
        owner.kill()  # SIGKILL: no stop(), no atexit
        owner.wait(timeout=60)
        alive = wait_until_gone(pids)
        assert not alive, f"daemons {sorted(alive)} outlived their owner"
    finally:
        kill_leftovers(pids)
    assert os.path.exists(os.path.join(started["socket_dir"], "owner"))
    with ckpt.LocalCluster(num_workers=0, root=tmp_path) as c:
        assert not os.path.exists(started["socket_dir"]), "the dead owner's directory stayed"
        assert os.path.isdir(c.socket_dir)
    assert not os.path.exists(c.socket_dir)


def test_up_daemons_exit_when_up_is_killed(tmp_path):
    env_file = tmp_path / "ckpt.env"
    up = subprocess.Popen([sys.executable, "-m", "ckpt.up", "--workers", "1", "--root",
                           str(tmp_path), "--env-file", str(env_file)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    read_line(up, 120)  # "ckpt up: coordinator ..." once every daemon is ready
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == up.pid:
                children[int(entry)] = proc_start_time(int(entry))
    assert len(children) == 2, children  # the coordinator and the worker
    try:
        up.kill()
        up.wait(timeout=60)
        alive = wait_until_gone(children)
        assert not alive, f"daemons {sorted(alive)} outlived ckpt.up"
    finally:
        kill_leftovers(children)


def test_a_cluster_started_by_a_thread_keeps_its_daemons_after_the_thread_ends(tmp_path):
    started, tids = [], []

    def start():
        tids.append(threading.get_native_id())
        started.append(ckpt.LocalCluster(num_workers=1, root=tmp_path).start())

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    c = started[0]
    try:
        # join() returns before the kernel thread is gone; once its task is gone, a death
        # signal tied to it would have been sent.
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/self/task/{tids[0]}") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not os.path.exists(f"/proc/self/task/{tids[0]}")
        with ckpt.Client(job="thread-owner", rank=0, world_size=1, local_rank=0) as client:
            state = client.state_dict()
            state.add("x", ckpt.empty(4))
            client.save(os.path.join(c.root, "after-thread"), state).wait(timeout=60)
        assert c._coordinator.poll() is None and c._workers[0][1].poll() is None
    finally:
        c.stop()
    assert c.exit_codes and all(code == 0 for code in c.exit_codes.values()), c.exit_codes


def test_only_directories_of_dead_owners_are_removed(tmp_path):
    # A process that lives until its start time is read (`true` may be a zombie by then, which
    # has no start time), then ends.
    dead = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    dead_started = proc_start_time(dead.pid)
    assert dead_started is not None
    dead.stdin.close()
    dead.wait()
    dirs = {}
    for name, owner in (("dead", f"{dead.pid} {dead_started}"),
                        ("alive", f"{os.getpid()} {proc_start_time(os.getpid())}"),
                        ("reused", f"{os.getpid()} 1"),  # our pid, another start time: dead
                        ("unreadable", "not a pid"), ("kept", None)):
        d = tmp_path / f"ckpt-{name}"
        d.mkdir()
        (d / "sock").write_text("")
        if owner is not None:
            (d / "owner").write_text(owner + "\n")
        dirs[name] = d
    removed = cluster_module.remove_stale_socket_dirs(str(tmp_path))
    assert sorted(removed) == sorted(str(dirs[n]) for n in ("dead", "reused"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-alive", "ckpt-kept", "ckpt-unreadable"]
