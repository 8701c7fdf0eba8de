#!/usr/bin/env python3
"""Every data path of ckpt against the machine's limit, measured in the same run (issue 40).

Run through tools/bench/bandwidth.sh, which builds the binaries (-c opt) first:

  tools/bench/bandwidth.sh [--size small|default] [--only save,load,...] [--repeat N]
                           [--dir DIR] [--no-drop-caches] [--keep]

First the limits, measured here: a memcpy into touched memory (and into fresh memory), dd write
with fsync (conv=fsync) and with O_DIRECT (oflag=direct), a cold read (after dropping the page
cache where this process may, else O_DIRECT), the read+write floor 1/(1/read + 1/write) and
loopback TCP at 1, 2 and 4 streams. Then the paths, each by the benchmark that already exists
for it (this script only drives them and reads their output):

  save, load, reshard, export, import   tools/demo.sh (its trainer examples/gpt_trainer.cc), then
                                        `ckptctl import` of the demo's export (safetensors)
  reshard                               tools/bench/reshard_benchmark.cc (in-process offline reshard)
  import                                tools/bench/dcp_import_bench.py (ckptctl import --from dcp)
  transfer                              tools/bench/transfer_bench.py (live transfer receive)
  replication                           tools/bench/memory_tier_bench.sh (memory tier saves)
  exchange                              tools/bench/exchange_process_benchmark.cc (overlap_into)
  torch                                 tools/bench/ckpt_torch_bench.py (ckpt.torch vs DCP)
  compression                           tools/bench/compression_bench.py, where it exists

Each row: path, bytes, seconds, GB/s, its limit, % of the limit, the issue's target and whether
it is met. Ends with a Markdown table for docs/BENCHMARKS.md. With --repeat N every selected
path runs N times: run 1 is cold (fresh daemons, binaries and files not yet in the page cache),
later runs warm.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import disk_limits  # noqa: E402
from transfer_bench import loopback_gbps  # noqa: E402

PATHS = ["save", "load", "reshard", "export", "import", "transfer", "replication", "exchange",
         "torch", "compression"]

# Sizes: small checks that every driver runs (seconds each); default measures.
SIZES = {
    "small": dict(limit_mb=64, memcpy_mb=32, loop_mb=256, demo="small", reshard_mb=64,
                  dcp_mb=64, transfer_elements=1 << 18, memtier_elements=1 << 18,
                  exchange_mib=8, exchange_reps=3, torch_gb=0.0625, torch_procs=2),
    "default": dict(limit_mb=1024, memcpy_mb=512, loop_mb=2048, demo="large", reshard_mb=1024,
                    dcp_mb=1024, transfer_elements=8 << 20, memtier_elements=1 << 25,
                    exchange_mib=64, exchange_reps=10, torch_gb=1.0, torch_procs=4),
}

# The targets: % of which limit.
TARGETS = {"memcpy": 80, "write": 90, "read": 90, "floor": 80, "loopback": 80}


class Table:
    """The rows of one run of this command, printed as they come and as Markdown at the end."""

    def __init__(self):
        self.rows = []

    def add(self, run, path, nbytes, seconds, limit_name, limit_gbps, target, note="",
            gbps=None, compare_bytes=None):
        """compare_bytes: what the limit is compared with when that is not nbytes (a load
        delivers replicated elements to several ranks but reads the checkpoint's bytes once)."""
        if gbps is None and nbytes and seconds:
            gbps = nbytes / seconds / 1e9
        moved = gbps if compare_bytes is None or not seconds else compare_bytes / seconds / 1e9
        pct = 100 * moved / limit_gbps if moved and limit_gbps else None
        met = "-" if target is None or pct is None else ("met" if pct >= target else "not met")
        row = dict(run=run, path=path, bytes=nbytes, seconds=seconds, gbps=gbps,
                   limit=limit_name, limit_gbps=limit_gbps, pct=pct, target=target, met=met,
                   note=note)
        self.rows.append(row)
        print("  " + self._line(row, plain=True), flush=True)

    def failed(self, run, path, why, met="FAILED"):
        """A row without figures: FAILED, or with met="-" a row that only points elsewhere."""
        self.rows.append(dict(run=run, path=path, bytes=None, seconds=None, gbps=None,
                              limit="-", limit_gbps=None, pct=None, target=None,
                              met=met, note=why))
        print(f"  {path}: {met}: {why}", flush=True)

    @staticmethod
    def _line(r, plain=False):
        def f(v, spec):
            return "-" if v is None else format(v, spec)
        cells = [str(r["run"]), r["path"], f(r["bytes"] and r["bytes"] / 1e6, ",.0f"),
                 f(r["seconds"], ".3f"), f(r["gbps"], ".2f"),
                 f"{r['limit']} {f(r['limit_gbps'], '.2f')}" if r["limit_gbps"] else "-",
                 f(r["pct"], ".0f"),
                 f(r["target"], "d"), r["met"], r["note"]]
        if plain:
            return (f"{cells[1]}: {cells[2]} MB in {cells[3]} s = {cells[4]} GB/s; "
                    f"{cells[5]} GB/s -> {cells[6]}% (target {cells[7]}%: {cells[8]}) "
                    f"{cells[9]}")
        return "| " + " | ".join(cells) + " |"

    def markdown(self):
        out = ["| run | path | MB | s | GB/s | limit (GB/s, same run) | % of limit | target % "
               "| met | note |", "|" + "---|" * 10]
        out += [self._line(r) for r in self.rows]
        return "\n".join(out)


def run(argv, log, env=None, timeout=1800, cwd=REPO):
    """Runs argv with its output in `log`; returns the output; raises naming the command."""
    with open(log, "w") as f:
        p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                           timeout=timeout)
    text = open(log).read()
    if p.returncode != 0:
        tail = " / ".join(text.strip().splitlines()[-3:])
        name = next((a for a in argv if not re.search(r"(python[\d.]*|bash)$", a)), argv[0])
        raise RuntimeError(f"{os.path.basename(name)} exited {p.returncode} (log {log}): {tail}")
    return text


def measure_limits(work, s, allow_drop):
    """The machine's limits for this run, printed as they are taken."""
    lim = {}
    mb = s["memcpy_mb"] << 20
    procs = os.cpu_count() or 1
    one, many = disk_limits.memcpy_gbps(mb, 1), disk_limits.memcpy_gbps(mb, procs)
    lim["memcpy"] = max(one, many)
    lim["memcpy_fresh"] = disk_limits.memcpy_gbps(mb, 1, fresh=True)
    print(f"memcpy into touched memory: {one:.2f} GB/s (1 process), {many:.2f} GB/s "
          f"({procs} processes); into fresh memory: {lim['memcpy_fresh']:.2f} GB/s", flush=True)
    path = os.path.join(work, "limit.bin")
    nbytes = s["limit_mb"] << 20
    lim["write_direct"] = disk_limits.dd_write(path, nbytes, direct=True)
    lim["write_fsync"] = disk_limits.dd_write(path, nbytes, direct=False)
    lim["write"] = max(lim["write_direct"], lim["write_fsync"])
    lim["read"], lim["read_how"] = disk_limits.cold_read(path, allow_drop)
    os.unlink(path)
    lim["floor"] = 1 / (1 / lim["read"] + 1 / lim["write"])
    print(f"dd write {nbytes >> 20} MiB: {lim['write_direct']:.2f} GB/s O_DIRECT, "
          f"{lim['write_fsync']:.2f} GB/s buffered + fsync; cold read {lim['read']:.2f} GB/s "
          f"({lim['read_how']}); read+write floor {lim['floor']:.2f} GB/s", flush=True)
    for n in (1, 2, 4):
        lim[f"loop{n}"] = loopback_gbps(n, s["loop_mb"] << 20)
    print("loopback TCP: " + ", ".join(f"{n} stream{'s' if n > 1 else ''} "
                                       f"{lim[f'loop{n}']:.2f} GB/s" for n in (1, 2, 4)),
          flush=True)
    return lim


class Paths:
    """The drivers of the existing benchmarks, one method per group of paths."""

    def __init__(self, args, s, lim, table, run_no, work):
        self.a, self.s, self.lim, self.t, self.run, self.work = args, s, lim, table, run_no, work
        self.bin = args.bin

    def add(self, path, nbytes, seconds, limit, note="", at_least=0.0, **kw):
        """A row against one of this run's limits (limit: a key of TARGETS, or loopN), or
        against at_least where a benchmark measured more than that in the same run."""
        key = "loopback" if limit.startswith("loop") else limit
        name = {"write": "dd write", "read": "cold read", "floor": "read+write",
                "memcpy": "memcpy"}.get(limit, f"loopback x{limit[4:]}")
        self.t.add(self.run, path, nbytes, seconds, name, max(self.lim[limit], at_least),
                   TARGETS[key], note, **kw)

    def demo(self, only):
        """tools/demo.sh: save (stall and durable), loads, offline and cluster reshards, export;
        then `ckptctl import` of its safetensors export."""
        wd = os.path.join(self.work, "demo")
        run(["bash", os.path.join(REPO, "tools", "demo.sh"), "--size", self.s["demo"],
             "--bin-dir", self.bin, "--workdir", wd, "--keep"],
            os.path.join(self.work, "demo.log"))
        table = json.load(open(os.path.join(wd, "results", "table.json")))
        files = table["file_bytes"]
        by = {r["step"].strip(): r for r in table["rows"]}

        # The demo measures its own limits minutes after this script's (dd on the checkpoint's
        # size right after its save, memcpy at its end): a row is never against less.
        own = {k: table["limits"].get(v) or 0.0 for k, v in
               (("memcpy", "memcpy"), ("write", "write"), ("read", "read"),
                ("floor", "read+write"))}

        def row(step, path, limit, note="", disk=None):
            r = by[step]
            if not r["ok"]:
                return self.t.failed(self.run, path, f"demo step {step!r} failed")
            self.add(path, r["bytes"], r["seconds"], limit,
                     (note + "; " if note else "") + f"demo's own limit {own[limit]:.2f} GB/s",
                     at_least=own[limit], compare_bytes=disk)
        if "save" in only:
            row("of which until Save() returned", "save: snapshot (trainer's stall), demo 4 ranks",
                "memcpy", "slowest rank's Save() call")
            row("save    4 ranks TP2xDP2, cluster", "save: to durable, demo 4 ranks", "write")
            row("save    ckptctl save -> committed", "save: ckptctl save -> committed", "write",
                "includes the wait for the trainers' next Poll")
        if "load" in only:
            for step in ("load    4 ranks TP4xDP1, cluster", "load    3 ranks uneven, cluster",
                         "load    4 ranks TP2xDP2, cluster"):
                row(step, "load: demo " + step[8:].split(",")[0], "read",
                    "% of the checkpoint's file bytes; delivered bytes shown", files)
        if "reshard" in only:
            for step in ("reshard offline -> TP4xDP1", "reshard offline -> uneven3",
                         "reshard cluster -> TP4xDP1"):
                row(step, "reshard: ckptctl " + step[8:], "floor")
        if "export" in only:
            row("export  -> safetensors", "export: ckptctl export -> safetensors", "floor")
        if "import" in only:
            self.import_safetensors(wd)
        if not self.a.keep:
            shutil.rmtree(wd, ignore_errors=True)

    def import_safetensors(self, wd):
        src = os.path.join(wd, "export")
        files = [os.path.join(r, n) for r, _, ns in os.walk(src) for n in ns]
        nbytes = sum(os.path.getsize(f) for f in files)
        disk_limits.evict(src)
        t = time.perf_counter()
        run([os.path.join(self.bin, "tools", "ckptctl"), "import", src,
             os.path.join(wd, "imported")], os.path.join(self.work, "import-safetensors.log"))
        self.add("import: ckptctl import (safetensors, the demo's export)", nbytes,
                 time.perf_counter() - t, "floor", "whole command")

    def reshard_benchmark(self):
        out = run([os.path.join(self.bin, "tools", "bench", "reshard_benchmark"),
                   "--dir=" + os.path.join(self.work, "rb"), f"--size_mb={self.s['reshard_mb']}"],
                  os.path.join(self.work, "reshard_benchmark.log"))
        for m in re.finditer(r"^\| (reshard TP2xDP2 -> [^|]*?)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)",
                             out, re.M):
            self.add(f"reshard: in-process {m.group(1)} (reshard_benchmark)",
                     float(m.group(2)) * 1e6, float(m.group(3)), "floor", "buffered I/O")

    def dcp_import(self):
        out = run([self.a.python, os.path.join(HERE, "dcp_import_bench.py"),
                   "--dir", os.path.join(self.work, "dcp"), "--size_mb", str(self.s["dcp_mb"]),
                   "--repeat", "1", "--ckptctl", os.path.join(self.bin, "tools", "ckptctl")],
                  os.path.join(self.work, "dcp_import_bench.log"))
        j = json.loads(out.strip().splitlines()[-1])
        gbps = j["import_gbps"][0]
        self.add("import: ckptctl import --from dcp", j["bytes"], j["bytes"] / gbps / 1e9,
                 "floor", f"peer dcp.load {j['dcp_load_gbps'][0]:.2f} GB/s")
        if not self.a.keep:
            shutil.rmtree(os.path.join(self.work, "dcp"), ignore_errors=True)

    def transfer(self):
        env = dict(os.environ, BIN=self.bin)
        out = run([sys.executable, os.path.join(HERE, "transfer_bench.py"), "--elements",
                   str(self.s["transfer_elements"]), "--reps", "3"],
                  os.path.join(self.work, "transfer_bench.log"), env=env)
        per = int(re.search(r"(\d+) MiB delivered per receive", out).group(1)) << 20
        own = re.search(r"loopback TCP: 1 stream [\d.]+ GB/s, 2 streams ([\d.]+) GB/s", out)
        own = float(own.group(1)) if own else 0.0
        recv = [(int(k), float(s), ok == "True") for k, s, ok in re.findall(
            r"receive (\d+): ([\d.]+) s, [\d.]+ GB/s delivered, bit-exact=(\w+)", out)]
        for k, secs, ok in recv:
            if not ok:
                self.t.failed(self.run, f"transfer: receive {k}", "not bit-exact")
                continue
            self.add(f"transfer: receive {k} ({'first' if k == 1 else 'repeat'}), "
                     "TP4xDP2 -> TP2x3", per, secs, "loop2",
                     f"bytes delivered into destination tensors; 2 serving workers; its own "
                     f"loopback (2 streams, right after) {own:.2f} GB/s", at_least=own)

    def replication(self):
        e = self.s["memtier_elements"]
        env = dict(os.environ, BIN=self.bin)
        d = os.path.join(self.work, "memtier")
        out = run(["bash", os.path.join(HERE, "memory_tier_bench.sh"), str(e), d],
                  os.path.join(self.work, "memory_tier_bench.log"), env=env)
        nbytes = 16 * e
        v = {k: float(x) for k, x in re.findall(r"(\w+_s)=([\d.]+)", out)}
        mem = re.search(r"memory save:\s+blocking_s=([\d.]+) durable_s=([\d.]+)", out)
        store = re.search(r"storage save: blocking_s=([\d.]+) durable_s=([\d.]+)", out)
        self.add("replication: memory save -> replicated on the other host", nbytes,
                 float(mem.group(2)), "loop4", "4 workers, each to a peer on the other host")
        self.add("replication: memory load (holders read, exchanged)", nbytes,
                 float(re.search(r"memory load:\s+load_s=([\d.]+)", out).group(1)), "loop4")
        own = re.search(r"write_GBps=([\d.]+)", out)
        own = float(own.group(1)) if own else 0.0
        self.add("save: to durable, trainer_probe 4 ranks (storage)", nbytes,
                 float(store.group(2)), "write",
                 f"storage save blocking {float(store.group(1)):.3f} s; its own dd write "
                 f"{own:.2f} GB/s", at_least=own)
        # Where the script measures it: the replication alone (snapshotted -> durable of the
        # slowest rank) against its own loopback at 4 streams on the same bytes.
        repl = re.search(r"replication: \d+ MiB in ([\d.]+) s = [\d.]+ GB/s; loopback TCP, 4 "
                         r"streams, same bytes: ([\d.]+) GB/s", out)
        if repl:
            self.add("replication: snapshotted -> replicated (memory_tier_bench)", nbytes,
                     float(repl.group(1)), "loop4",
                     f"its own loopback, 4 streams: {float(repl.group(2)):.2f} GB/s",
                     at_least=float(repl.group(2)))
        if "persisted_s" in v:
            self.add("replication: memory save -> persisted to storage", nbytes,
                     v["persisted_s"], "write", "Save call -> committed on disk")
        if not self.a.keep:
            shutil.rmtree(d, ignore_errors=True)

    def exchange(self):
        out = run([os.path.join(self.bin, "tools", "bench", "exchange_process_benchmark"),
                   "--ranks=2,4", f"--mib={self.s['exchange_mib']}",
                   f"--reps={self.s['exchange_reps']}"],
                  os.path.join(self.work, "exchange_process_benchmark.log"))
        # Its own loopback figure (C++, one stream, the same payload): where it is above this
        # script's (Python processes) at the rank count, it is the limit.
        own = re.search(r"^loopback_tcp\s+-\s+[\d.]+\s+([\d.]+)", out, re.M)
        own = float(own.group(1)) * (1 << 30) / 1e9 if own else 0.0
        for n, ms, gib in re.findall(r"^overlap_into\s+(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M):
            secs = float(ms) / 1e3
            nbytes = float(gib) * (1 << 30) * secs
            stream = f"loop{min(int(n), 4)}"
            self.add(f"exchange load: overlap_into, {n} ranks", nbytes, secs, stream,
                     f"wire bytes summed over ranks, median; its own loopback (C++, 1 stream) "
                     f"{own:.2f} GB/s", at_least=own)

    def torch(self):
        pyroot = os.path.join(self.work, "py")
        shutil.rmtree(pyroot, ignore_errors=True)
        shutil.copytree(os.path.join(REPO, "python", "ckpt"), os.path.join(pyroot, "ckpt"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(os.path.join(self.bin, "python", "ckpt", "_ckpt.so"),
                    os.path.join(pyroot, "ckpt"))
        env = dict(os.environ, PYTHONPATH=pyroot,
                   CKPT_COORDINATOR_BIN=os.path.join(self.bin, "coordinator", "ckpt_coordinator"),
                   CKPT_WORKER_BIN=os.path.join(self.bin, "worker", "ckpt_worker"))
        out = run([self.a.python, os.path.join(HERE, "ckpt_torch_bench.py"), "--dir",
                   os.path.join(self.work, "torch"), "--gb", str(self.s["torch_gb"]), "--procs",
                   str(self.s["torch_procs"]), "--reps", "2"],
                  os.path.join(self.work, "ckpt_torch_bench.log"), env=env)
        gb = float(re.search(r"state: ([\d.]+) GB", out).group(1)) * 1e9
        for what, target in (("save_first", 100), ("save_later", 100), ("load", 120),
                             ("async_block", None)):
            m = re.search(rf"^{what}\s+([\d.]+) s\s+([\d.]+) GB/s\s+([\d.]+) s\s+([\d.]+) GB/s",
                          out, re.M)
            if m:
                c, d = float(m.group(1)), float(m.group(3))
                self.t.add(self.run, f"torch: ckpt.torch {what} vs DCP", gb, c, "DCP",
                           gb / d / 1e9, target, "no compression; target: the issue's ratio")

    def compression(self):
        script = os.path.join(HERE, "compression_bench.py")
        if not os.path.exists(script):
            self.t.failed(self.run, "compression", "not built yet (no "
                          "tools/bench/compression_bench.py)", met="-")
            return
        out = run([self.a.python, script, "--bin",
                   os.path.join(self.bin, "tools", "bench", "compression_bench")] +
                  (["--repeats", "1"] if self.a.size == "small" else []),
                  os.path.join(self.work, "compression_bench.log"))
        print("\n".join("    " + x for x in out.strip().splitlines()[-30:]))
        self.t.failed(self.run, "compression", "see compression_bench.py's own output above",
                      met="-")


BINARIES = ["coordinator/ckpt_coordinator", "worker/ckpt_worker", "tools/ckptctl",
            "examples/gpt_trainer", "examples/gpt_tool", "tools/bench/reshard_benchmark",
            "tests/transfer_probe", "tests/trainer_probe",
            "tools/bench/exchange_process_benchmark", "tools/bench/compression_bench",
            "python/ckpt/_ckpt.so"]


def private_copy(bin_dir, work):
    """A copy of the binaries (ckptctl's runfiles as links): a concurrent `bazel build` may
    replace the build's files while this runs. Missing ones are left out (their rows fail)."""
    dst = os.path.join(work, "bin")
    for rel in BINARIES:
        src = os.path.join(bin_dir, rel)
        if os.path.exists(src):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy(src, os.path.join(dst, rel))
    runfiles = os.path.join(bin_dir, "tools", "ckptctl.runfiles")
    if os.path.isdir(runfiles):
        shutil.copytree(runfiles, os.path.join(dst, "tools", "ckptctl.runfiles"), symlinks=True,
                        dirs_exist_ok=True)
    return dst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="default")
    ap.add_argument("--only", default=",".join(PATHS),
                    help="comma-separated subset of: " + ",".join(PATHS))
    ap.add_argument("--repeat", type=int, default=1, help="runs of every path (1: cold only)")
    ap.add_argument("--bin", default=os.path.join(REPO, "bazel-out", "k8-opt", "bin"))
    ap.add_argument("--dir", default=None, help="where files go (default: a new dir in /tmp)")
    ap.add_argument("--python", default=os.path.join(REPO, ".venv", "bin", "python"),
                    help="the Python with torch, for the DCP and ckpt.torch benchmarks")
    ap.add_argument("--no-drop-caches", action="store_true",
                    help="cold reads with O_DIRECT, never dropping the whole page cache")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    only = [p for p in a.only.split(",") if p]
    unknown = [p for p in only if p not in PATHS]
    if unknown:
        ap.error(f"unknown path {unknown[0]!r}; known: {','.join(PATHS)}")
    a.bin = os.path.abspath(a.bin)
    s = SIZES[a.size]
    work = a.dir or tempfile.mkdtemp(prefix="ckpt-bandwidth.", dir="/tmp")
    os.makedirs(work, exist_ok=True)
    built = a.bin
    stamps = [os.path.getmtime(os.path.join(built, b)) for b in BINARIES
              if os.path.exists(os.path.join(built, b))]
    if stamps:
        built += time.strftime(" (newest %Y-%m-%d %H:%M UTC)", time.gmtime(max(stamps)))
    a.bin = private_copy(a.bin, work)
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    print(f"ckpt bandwidth, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, main {rev}, "
          f"size {a.size}, binaries of {built}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, files in {work}", flush=True)
    table = Table()
    load_avgs = []
    for r in range(1, a.repeat + 1):
        label = f"{r} ({'cold' if r == 1 else 'warm'})"
        print(f"\n== run {label} ==", flush=True)
        rwork = os.path.join(work, f"run{r}")
        os.makedirs(rwork, exist_ok=True)
        lim = measure_limits(rwork, s, not a.no_drop_caches)
        p = Paths(a, s, lim, table, r, rwork)
        steps = [("demo", lambda: p.demo(only),
                  {"save", "load", "reshard", "export", "import"}),
                 ("reshard_benchmark", p.reshard_benchmark, {"reshard"}),
                 ("dcp_import_bench", p.dcp_import, {"import"}),
                 ("transfer_bench", p.transfer, {"transfer"}),
                 ("memory_tier_bench", p.replication, {"replication"}),
                 ("exchange_process_benchmark", p.exchange, {"exchange"}),
                 ("ckpt_torch_bench", p.torch, {"torch"}),
                 ("compression_bench", p.compression, {"compression"})]
        for name, fn, covers in steps:
            if not covers & set(only):
                continue
            print(f"-- {name} ({time.strftime('%H:%M:%S')}, load average "
                  f"{os.getloadavg()[0]:.2f})", flush=True)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one failed benchmark fails only its rows
                table.failed(r, name, str(e)[:300])
            load_avgs.append(os.getloadavg()[0])
        print(f"limits of run {r}: " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                                   for k, v in lim.items()}))
    print(f"\nload average (1 min) after each benchmark: "
          f"{' '.join(f'{x:.2f}' for x in load_avgs)} on {os.cpu_count()} CPUs\n")
    print(table.markdown())
    if not a.keep and not a.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r["met"] == "FAILED" and r["path"] != "compression" for r in table.rows) \
        else 0


if __name__ == "__main__":
    sys.exit(main())
