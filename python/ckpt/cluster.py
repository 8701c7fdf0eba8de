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

Loopback only (no certificates): see docs/python.md for many hosts (one coordinator, a worker
per GPU next to torchrun or under SLURM).
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


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
    directory). ``coordinator_args`` / ``worker_args``: extra daemon flags (e.g.
    ``["--arrival_deadline_ms=20000"]``). Logs go to ``log_dir`` (default: a directory next to
    the sockets, kept after stop when a daemon failed)."""

    def __init__(self, num_workers=1, root=None, *, bin_dir=None, coordinator=None,
                 first_local_rank=0, socket_dir=None, log_dir=None, coordinator_args=(),
                 worker_args=(), listen="127.0.0.1:0", start_timeout=60.0, stop_timeout=30.0,
                 export_env=True):
        self.num_workers = int(num_workers)
        self.root = os.path.realpath(os.fspath(root if root is not None else os.getcwd()))
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
            # Unix socket paths are limited to 107 bytes: keep them short, under /tmp.
            self.socket_dir = tempfile.mkdtemp(prefix="ckpt-", dir="/tmp")
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

    def _spawn(self, name, argv):
        log = open(os.path.join(self.log_dir, name + ".log"), "wb")
        self._logs.append(log)
        # Its own process group: a Ctrl-C meant for the trainer does not kill the daemons first.
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)

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
        if self._own_socket_dir and self.socket_dir and clean and \
                self.log_dir.startswith(self.socket_dir):
            shutil.rmtree(self.socket_dir, ignore_errors=True)

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
