"""A ckpt deployment on this host in one line: a coordinator and ``num_workers`` workers.

    with ckpt.LocalCluster(num_workers=4, root="/data/ckpt") as cluster:
        ...  # trainers started here (torchrun, torch.multiprocessing) find their workers

The daemons are the built binaries ``ckpt_coordinator`` and ``ckpt_worker``, found in order:
``bin_dir``; $CKPT_COORDINATOR_BIN / $CKPT_WORKER_BIN; ``ckpt/bin/`` inside the installed
package (the wheel ships them there); Bazel runfiles; ``bazel-bin/`` of a source checkout; PATH.
The cluster is ready when ``__enter__`` returns: the coordinator wrote its address file and
every worker registered (its ready file). Leaving the block stops the workers, then the
coordinator, with SIGTERM (they deregister and exit cleanly), SIGKILL after ``stop_timeout``.

While the cluster runs, ``CKPT_WORKER_DIR`` (the workers' sockets are
``$CKPT_WORKER_DIR/worker-<local rank>.sock``) and ``CKPT_COORDINATOR_ADDRESS`` are set in
os.environ (unless ``export_env=False``), so trainer processes started from here connect to
the worker of their LOCAL_RANK with a plain ``ckpt.Client()``.

The daemons do not outlive the process that started them: each is started through a short
Python step that sets PR_SET_PDEATHSIG (SIGTERM: they deregister and exit cleanly) and checks
that its parent is still there before it execs the daemon. Linux sends that signal when the
*thread* that forked the child exits, so every daemon is forked by one thread that lives as long
as this process (``_Spawner``), whichever thread starts the cluster. A socket directory the
cluster made is removed when it stops cleanly; one whose owner was killed (SIGKILL, OOM) is
removed by the next LocalCluster started on the host by the same user (it records its owner's
pid and start time in ``owner``). Standalone daemons (started by hand, systemd, SLURM) are not
affected: they outlive coordinator restarts on purpose.

Loopback only (no certificates): see docs/python.md for many hosts (one coordinator, a worker
per GPU next to torchrun or under SLURM).
"""

import glob
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# The step each daemon is started through (argv: parent pid, daemon argv...): the parent-death
# signal set, a parent already gone noticed, then the daemon itself in this process.
_TIE_TO_PARENT = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.exit("ckpt: prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit("ckpt: the process starting this daemon exited first")
os.execv(sys.argv[2], sys.argv[2:])
"""

_SOCKET_DIR_PREFIX = "ckpt-"
_OWNER_FILE = "owner"


def _start_time(pid):
    """The start time (clock ticks since boot) of process `pid`, None when there is none or it
    is a zombie."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def _owner_alive(owner_file):
    """False when the process recorded in `owner_file` ("<pid> <start time>") is gone; True
    when it runs or the file cannot be read as such (nothing is removed on a doubt)."""
    try:
        with open(owner_file) as f:
            pid, started = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return True
    return _start_time(pid) == started


def remove_stale_socket_dirs(tmp="/tmp"):
    """Removes the socket directories of LocalClusters of this user whose owner process is
    gone (killed before it could stop them); returns their paths."""
    removed = []
    for owner_file in glob.glob(os.path.join(tmp, _SOCKET_DIR_PREFIX + "*", _OWNER_FILE)):
        directory = os.path.dirname(owner_file)
        try:
            if os.lstat(directory).st_uid != os.getuid() or os.path.islink(directory):
                continue
        except OSError:
            continue
        if not _owner_alive(owner_file):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


class _Spawner:
    """Forks every daemon from one daemon thread of this process (restarted in a forked
    child), so that the parent-death signal fires when the process ends and not when the
    thread that happened to start a cluster ends."""

    _lock = threading.Lock()
    _queue = None
    _pid = None

    @classmethod
    def popen(cls, argv, timeout, **kwargs):
        from ckpt.errors import DeadlineExceeded

        python = sys.executable or shutil.which("python3") or "python3"
        request = {"argv": [python, "-I", "-c", _TIE_TO_PARENT, str(os.getpid()), *argv],
                   "kwargs": kwargs, "done": threading.Event(), "lock": threading.Lock(),
                   "abandoned": False}
        cls._requests().put(request)
        if not request["done"].wait(timeout):
            with request["lock"]:
                if not request["done"].is_set():
                    request["abandoned"] = True  # the spawner kills it if it still starts
                    raise DeadlineExceeded(f"starting {argv[0]} took more than {timeout:.0f}s")
        if "error" in request:
            raise request["error"]
        return request["process"]

    @classmethod
    def _requests(cls):
        with cls._lock:
            if cls._pid != os.getpid():
                cls._queue, cls._pid = queue.Queue(), os.getpid()
                threading.Thread(target=cls._run, args=(cls._queue,), name="ckpt-spawner",
                                 daemon=True).start()
            return cls._queue

    @classmethod
    def _after_fork_in_child(cls):
        cls._lock, cls._queue, cls._pid = threading.Lock(), None, None

    @staticmethod
    def _run(requests):
        while True:
            request = requests.get()
            try:
                request["process"] = subprocess.Popen(request["argv"], **request["kwargs"])
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                request["error"] = e
            with request["lock"]:
                request["done"].set()
                abandoned = request["abandoned"] and "process" in request
            if abandoned:
                request["process"].kill()
                request["process"].wait()


os.register_at_fork(after_in_child=_Spawner._after_fork_in_child)


def _candidates(name, subdir, bin_dir):
    here = os.path.dirname(os.path.abspath(__file__))
    if bin_dir is not None:
        yield os.path.join(bin_dir, name)
        yield os.path.join(bin_dir, subdir, name)
    env = os.environ.get(f"CKPT_{subdir.upper()}_BIN")
    if env:
        yield env
    yield os.path.join(here, "bin", name)
    for root in (os.environ.get("RUNFILES_DIR"), os.environ.get("TEST_SRCDIR")):
        if root:
            yield os.path.join(root, "ckpt", subdir, name)
    yield os.path.join(here, "..", "..", "bazel-bin", subdir, name)
    found = shutil.which(name)
    if found:
        yield found


def find_binary(name, subdir, bin_dir=None):
    """The path of daemon ``name`` (ckpt_coordinator in coordinator/, ckpt_worker in
    worker/); ckpt.NotFound listing where it looked."""
    from ckpt.errors import NotFound

    tried = []
    for path in _candidates(name, subdir, bin_dir):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.realpath(path)
        tried.append(path)
    raise NotFound(f"cannot find the {name} binary (build it with `bazel build //{subdir}:{name}`"
                   f" or pass bin_dir=); looked at: {', '.join(tried)}")


class LocalCluster:
    """A coordinator (unless ``coordinator`` gives the address of a running one) and
    ``num_workers`` workers with local ranks ``first_local_rank``.. on this host.

    ``root``: the checkpoint root the coordinator accepts paths under (default: the working
    directory; or an object-store URL ``s3://bucket[/prefix]``). ``coordinator_args`` / ``worker_args``: extra daemon flags (e.g.
    ``["--arrival_deadline_ms=20000"]``). Logs go to ``log_dir`` (default: a directory next to
    the sockets, kept after stop when a daemon failed)."""

    def __init__(self, num_workers=1, root=None, *, bin_dir=None, coordinator=None,
                 first_local_rank=0, socket_dir=None, log_dir=None, coordinator_args=(),
                 worker_args=(), listen="127.0.0.1:0", start_timeout=60.0, stop_timeout=30.0,
                 export_env=True):
        self.num_workers = int(num_workers)
        from ckpt import _location

        root = os.fspath(root if root is not None else os.getcwd())
        # An object-store root (s3://bucket/prefix) is not on this filesystem: passed as given.
        self.root = root if _location.is_object_store_url(root) else os.path.realpath(root)
        self._bin_dir = bin_dir
        self._external_coordinator = coordinator
        self.address = coordinator
        self.first_local_rank = int(first_local_rank)
        self._own_socket_dir = socket_dir is None
        self.socket_dir = socket_dir
        self.log_dir = log_dir
        self._coordinator_args = list(coordinator_args)
        self._worker_args = list(worker_args)
        self._listen = listen
        self._start_timeout = float(start_timeout)
        self._stop_timeout = float(stop_timeout)
        self._export_env = export_env
        self._saved_env = {}
        self._coordinator = None
        self._workers = []
        self._logs = []
        self.exit_codes = {}

    # ---- addresses -----------------------------------------------------------------------
    def worker_socket(self, local_rank):
        return os.path.join(self.socket_dir, f"worker-{int(local_rank)}.sock")

    def worker_address(self, local_rank):
        """"unix:<socket>" of the worker serving ``local_rank``."""
        return "unix:" + self.worker_socket(local_rank)

    @property
    def env(self):
        """What trainers need: CKPT_WORKER_DIR and CKPT_COORDINATOR_ADDRESS."""
        env = {"CKPT_COORDINATOR_ADDRESS": self.address}
        if self.num_workers > 0:
            env["CKPT_WORKER_DIR"] = self.socket_dir
        return env

    # ---- start / stop --------------------------------------------------------------------
    def start(self):
        if self._own_socket_dir:
            remove_stale_socket_dirs()
            # Unix socket paths are limited to 107 bytes: keep them short, under /tmp.
            self.socket_dir = tempfile.mkdtemp(prefix=_SOCKET_DIR_PREFIX, dir="/tmp")
            self._write_owner()
        os.makedirs(self.socket_dir, exist_ok=True)
        self.log_dir = self.log_dir or os.path.join(self.socket_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        try:
            if self._external_coordinator is None:
                self._start_coordinator()
            self._start_workers()
        except BaseException:
            self.stop()
            raise
        if self._export_env:
            for k, v in self.env.items():
                self._saved_env[k] = os.environ.get(k)
                os.environ[k] = v
        return self

    def _write_owner(self):
        """Records this process (pid, start time) as the socket directory's owner."""
        path = os.path.join(self.socket_dir, _OWNER_FILE)
        with open(path + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
        os.replace(path + ".tmp", path)  # complete when it appears

    def _spawn(self, name, argv):
        log = open(os.path.join(self.log_dir, name + ".log"), "wb")
        self._logs.append(log)
        # Its own process group: a Ctrl-C meant for the trainer does not kill the daemons first;
        # tied to this process: it gets SIGTERM when this process ends (module docstring).
        return _Spawner.popen(argv, self._start_timeout, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=log, start_new_session=True)

    def _start_coordinator(self):
        binary = find_binary("ckpt_coordinator", "coordinator", self._bin_dir)
        address_file = os.path.join(self.socket_dir, "coordinator.address")
        argv = [binary, f"--listen={self._listen}", f"--address_file={address_file}",
                f"--checkpoint_root={self.root}",
                f"--state_dir={os.path.join(self.socket_dir, 'coordinator-state')}"]
        self._coordinator = self._spawn("coordinator", argv + self._coordinator_args)
        self._wait_for([address_file], [("coordinator", self._coordinator)])
        with open(address_file) as f:
            self.address = f.read().strip()

    def _start_workers(self):
        binary = find_binary("ckpt_worker", "worker", self._bin_dir)
        ready = []
        for i in range(self.num_workers):
            local_rank = self.first_local_rank + i
            ready_file = os.path.join(self.socket_dir, f"worker-{local_rank}.ready")
            argv = [binary, f"--coordinator={self.address}",
                    f"--listen={self.worker_address(local_rank)}",
                    f"--local_rank={local_rank}", f"--ready_file={ready_file}"]
            proc = self._spawn(f"worker-{local_rank}", argv + self._worker_args)
            self._workers.append((f"worker-{local_rank}", proc))
            ready.append(ready_file)
        self._wait_for(ready, self._workers)

    def _wait_for(self, files, processes):
        """Until every file exists (written atomically by the daemons once ready); a daemon
        that exits first, or the start timeout, is an error quoting its log."""
        from ckpt.errors import DeadlineExceeded, Unavailable

        deadline = time.monotonic() + self._start_timeout
        while not all(os.path.exists(f) for f in files):
            for name, proc in processes:
                if proc.poll() is not None:
                    raise Unavailable(f"{name} exited with status {proc.returncode} while "
                                      f"starting: {self._tail(name)}")
            if time.monotonic() > deadline:
                missing = [f for f in files if not os.path.exists(f)]
                raise DeadlineExceeded(f"the ckpt daemons did not become ready within "
                                       f"{self._start_timeout:.0f}s (missing {missing}); "
                                       f"logs in {self.log_dir}")
            time.sleep(0.01)  # polls a readiness file; not used to order anything

    def _tail(self, name, lines=5):
        try:
            with open(os.path.join(self.log_dir, name + ".log"), "rb") as f:
                return " | ".join(f.read().decode(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _terminate(self, procs):
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout
        for name, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self.exit_codes[name] = proc.returncode

    def stop(self):
        """Stops the workers, then the coordinator; restores the environment."""
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        self._terminate(self._workers)
        self._workers = []
        if self._coordinator is not None:
            self._terminate([("coordinator", self._coordinator)])
            self._coordinator = None
        for log in self._logs:
            log.close()
        self._logs = []
        clean = all(code == 0 for code in self.exit_codes.values())
        if self._own_socket_dir and self.socket_dir:
            logs_inside = os.path.commonpath([os.path.abspath(self.log_dir),
                                              self.socket_dir]) == self.socket_dir
            if clean or not logs_inside:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
            else:  # kept for its logs: no longer a stale directory to remove at a later start
                try:
                    os.unlink(os.path.join(self.socket_dir, _OWNER_FILE))
                except FileNotFoundError:
                    pass

    @property
    def running(self):
        return self._coordinator is not None or bool(self._workers)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return (f"LocalCluster(coordinator={self.address}, workers={self.num_workers}, "
                f"root={self.root}, sockets={self.socket_dir})")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use python -m ckpt.up")
