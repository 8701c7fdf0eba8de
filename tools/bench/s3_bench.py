#!/usr/bin/env python3
"""The object store's benchmark of record (issue 43, "Measure"): ckpt's save and load through
s3:// against the server's own limit and against the PyTorch peer, all in one run, on a real
one-node Swift with s3api started here (storage/s3/testing/swift_server.py).

  .venv/bin/python tools/bench/s3_bench.py [--gib 1] [--repeat 2] [--shards 8]
                                           [--bin DIR] [--no-loopback] [--keep]

boto3 and s3fs are not in the project's pinned venv (.venv), and this script does not add them
there. On its first run it makes a venv of its own, once, with the main venv's python and
--system-site-packages, plus a .pth naming the main venv's site-packages (so torch, numpy and
safetensors stay visible; the venv's own boto3/s3fs come first):
  ~/.cache/ckpt-bench-venvs/s3   (pip install boto3==1.43.117 s3fs==2026.9.0 from PyPI)
and re-executes itself there; later runs reuse it. Without --bin it first builds ckptctl with
`bazel build -c opt //tools:ckptctl` and uses bazel-out/k8-opt/bin.

Steps:
 1. Swift in a temp dir (stopped at exit), one bucket; a real sharded checkpoint of --gib GiB:
    --shards safetensors files (random float32 tensors, 2 per shard) written with
    safetensors.numpy, then `ckptctl import` of their model.safetensors.index.json (one data
    file per shard). The source files stay in the page cache, as DCP's tensors stay in memory.
 2. Limits of this machine, same run: dd write of 1 GiB (oflag=direct conv=fsync) in the temp
    dir and, unless --no-loopback, loopback TCP with 4 streams.
 3. --repeat times (run 1 "cold": a fresh server and fresh keys; later runs "warm"):
    ckpt      save `ckptctl copy DIR s3://bucket/ckpt-N`, load `ckptctl copy s3://... DIR2`
              (defaults: 4 data files at once; 8 MiB parts, 4 parts in flight per file on
              save; one 8 MiB ranged GET per file in flight on load; Content-MD5 on every PUT,
              XXH3 of every byte both ways; the load's files are fsynced and committed)
    boto3     the limit: upload_file/download_file of the same data files, one after another,
              TransferConfig(multipart_chunksize=8 MiB, max_concurrency=4); no checksums
              (when_required); the downloaded files are fsynced (inside the timing)
    DCP-s3fs  the peer: torch.distributed.checkpoint save/load (no_dist, one process) through
              FsspecWriter/FsspecReader on s3://bucket/dcp-N (s3fs pointed at the endpoint),
              of a state dict of the same tensors (thread_count=4), loaded into preallocated
              tensors
 4. One table: path | run | GB | seconds | GB/s | % of boto3 | x DCP-s3fs | CPU seconds of
    this process and its children (ckptctl) / of the Swift servers (/proc), with `uptime`.
"""
import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VENV = os.path.expanduser("~/.cache/ckpt-bench-venvs/s3")
PINS = ["boto3==1.43.117", "s3fs==2026.9.0"]  # s3fs matches the main venv's fsspec 2026.9.0
MIB = 1 << 20
BUCKET = "s3bench"


def ensure_venv():
    """Re-executes this script in VENV (made once) unless boto3 and s3fs import here."""
    try:
        import boto3  # noqa: F401
        import s3fs  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python")
    if os.environ.get("CKPT_S3_BENCH_VENV") == "1":
        sys.exit(f"s3_bench: boto3/s3fs still missing in {VENV}; remove it and rerun")
    if not os.path.exists(py):
        main_py = os.path.join(REPO, ".venv", "bin", "python")
        print(f"s3_bench: making {VENV} (once): {main_py} -m venv --system-site-packages; "
              f"pip install {' '.join(PINS)}", flush=True)
        subprocess.run([main_py, "-m", "venv", "--system-site-packages", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", *PINS], check=True)
    # A venv made from a venv's python sees the base's site-packages, not the main venv's:
    # a .pth (after this venv's own) adds the main venv's, for torch, numpy and safetensors.
    main_site = sh([os.path.join(REPO, ".venv", "bin", "python"), "-c",
                    "import site; print(site.getsitepackages()[0])"]).strip()
    own_site = sh([py, "-c", "import site; print(site.getsitepackages()[0])"]).strip()
    with open(os.path.join(own_site, "ckpt-main-venv.pth"), "w") as f:
        f.write(main_site + "\n")
    os.environ["CKPT_S3_BENCH_VENV"] = "1"
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


class Meter:
    """Wall seconds, this process's and its children's CPU seconds, and the Swift servers' CPU
    seconds (from /proc) of one timed step: `with meter: ...`, then meter.last."""

    def __init__(self, pids):
        self.pids, self.last = pids, None

    def _cpu(self):
        import resource
        own = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                    resource.getrusage(resource.RUSAGE_CHILDREN)))
        swift = 0.0
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            swift += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return time.perf_counter(), own, swift

    def __enter__(self):
        self.t0 = self._cpu()

    def __exit__(self, *exc):
        self.last = tuple(b - a for a, b in zip(self.t0, self._cpu()))


def sh(argv, **kw):
    """Runs argv; raises naming the command and its last output lines on failure."""
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        tail = " / ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(argv[:3])} ... exited {p.returncode}: {tail}")
    return p.stdout


def start_swift(work):
    d = os.path.join(work, "swift")
    os.makedirs(d)
    script = os.path.join(REPO, "storage", "s3", "testing", "swift_server.py")
    out = sh(["/usr/bin/python3", script, "start", "--dir", d])
    atexit.register(lambda: subprocess.run(["/usr/bin/python3", script, "stop", "--dir", d],
                                           capture_output=True))
    return json.loads(out.strip().splitlines()[-1])


def make_checkpoint(work, ckptctl, gib, shards):
    """(checkpoint dir, its data files, {name: numpy array}) of about gib GiB in `shards` data
    files, through ckptctl import of a sharded safetensors model."""
    import numpy as np
    from safetensors.numpy import save_file
    src = os.path.join(work, "hf")
    os.makedirs(src)
    rng = np.random.default_rng(43)
    per_tensor = int(gib * (1 << 30)) // (2 * shards) // (4 * 1024) * 1024  # float32 elements
    arrays, weight_map = {}, {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        t = {f"layers.{s}.{k}.weight": rng.standard_normal(per_tensor, dtype=np.float32)
             .reshape(-1, 1024) for k in ("attn", "mlp")}
        save_file(t, os.path.join(src, name))
        arrays.update(t)
        weight_map.update({k: name for k in t})
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    ckpt = os.path.join(work, "ckpt")
    sh([ckptctl, "import", os.path.join(src, "model.safetensors.index.json"), ckpt])
    files = sorted(os.path.join(r, n) for r, _, ns in os.walk(os.path.join(ckpt, "data"))
                   for n in ns)
    return ckpt, files, arrays


def boto3_client(server):
    import boto3
    from botocore.config import Config
    return boto3.client(
        "s3", endpoint_url=server["endpoint"], region_name=server["region"],
        aws_access_key_id=server["access_key_id"],
        aws_secret_access_key=server["secret_access_key"],
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required", max_pool_connections=16))


PART_MIB = 8  # --part-mib: boto3's multipart_chunksize and ckpt's CKPT_S3_PART_SIZE alike


def boto3_round(m, client, files, prefix, out_dir):
    """(save, load) Meter figures of upload_file then download_file (fsynced) of every file in turn."""
    from boto3.s3.transfer import TransferConfig
    cfg = TransferConfig(multipart_threshold=PART_MIB * MIB, multipart_chunksize=PART_MIB * MIB,
                         max_concurrency=4)
    with m:
        for f in files:
            client.upload_file(f, BUCKET, f"{prefix}/{os.path.basename(f)}", Config=cfg)
    save = m.last
    os.makedirs(out_dir)
    with m:
        for f in files:
            dest = os.path.join(out_dir, os.path.basename(f))
            client.download_file(BUCKET, f"{prefix}/{os.path.basename(f)}", dest, Config=cfg)
            fd = os.open(dest, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return save, m.last


def add_content_md5(request, **_):
    """Swift's s3api refuses a DeleteObjects without Content-MD5, which botocore >= 1.36 no
    longer sends (it sends a CRC32); s3fs's rename (copy + delete), which DCP's commit of
    .metadata uses, needs it."""
    import base64
    import hashlib
    body = request.body if isinstance(request.body, bytes) else request.body.encode()
    request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


def dcp_round(m, server, arrays, url):
    """(save, load) Meter figures of DCP through FsspecWriter/FsspecReader on s3fs, one process."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from aiobotocore.session import AioSession
    session = AioSession()
    session.register("before-sign.s3.DeleteObjects", add_content_md5)
    kw = dict(key=server["access_key_id"], secret=server["secret_access_key"],
              endpoint_url=server["endpoint"], skip_instance_cache=True, session=session,
              client_kwargs={"region_name": server["region"]},
              config_kwargs={"s3": {"addressing_style": "path"},
                             "request_checksum_calculation": "when_required",
                             "response_checksum_validation": "when_required"})
    state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    with m:
        dcp.save(state, storage_writer=FsspecWriter(url, thread_count=4, **kw), no_dist=True)
    save = m.last
    into = {k: torch.empty_like(v) for k, v in state.items()}
    with m:
        dcp.load(into, storage_reader=FsspecReader(url, **kw), no_dist=True)
    load = m.last
    bad = [k for k in state if not torch.equal(state[k], into[k])]
    if bad:
        raise RuntimeError(f"DCP-s3fs load of {url} differs in {bad[:3]}")
    return save, load


def ckpt_round(m, ckptctl, env, ckpt, url, out_dir):
    with m:
        sh([ckptctl, "copy", ckpt, url], env=env)
    save = m.last
    with m:
        sh([ckptctl, "copy", url, out_dir], env=env)
    return save, m.last


def limits(work, loopback):
    sys.path.insert(0, HERE)
    import disk_limits
    path = os.path.join(work, "dd.bin")
    out = {"dd": disk_limits.dd_write(path, 1 << 30, direct=True)}
    os.unlink(path)
    if loopback:
        from transfer_bench import loopback_gbps
        out["loop4"] = loopback_gbps(4, 1 << 30)
    return out


def table(rows, nbytes):
    """Markdown: each ckpt and DCP row against boto3's figure and DCP's of the same run."""
    by = {(r[0], r[1], r[2]): r[3][0] for r in rows}
    out = ["| path | run | GB | seconds | GB/s | % of boto3 (the limit) | × DCP-s3fs "
           "| CPU s: client / Swift |", "|---|---|---|---|---|---|---|---|"]
    for path, op, run, (secs, client_cpu, swift_cpu) in rows:
        gbps = nbytes / secs / 1e9
        lim = nbytes / by[("boto3", op, run)] / 1e9
        peer = nbytes / by[("DCP-s3fs", op, run)] / 1e9
        pct = "-" if path == "boto3" else f"{100 * gbps / lim:.0f}%"
        x = f"{gbps / peer:.2f}×" if path == "ckpt" else "-"
        out.append(f"| {path} {op} | {run} | {nbytes / 1e9:.2f} | {secs:.2f} | {gbps:.3f} "
                   f"| {pct} | {x} | {client_cpu:.1f} / {swift_cpu:.1f} |")
    return "\n".join(out)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="checkpoint size in GiB (default 1)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of every path (1st is cold)")
    ap.add_argument("--shards", type=int, default=8, help="data files of the checkpoint")
    ap.add_argument("--bin", help="bazel-bin style dir holding tools/ckptctl (skips the build)")
    ap.add_argument("--no-loopback", action="store_true", help="skip the loopback TCP limit")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (printed)")
    ap.add_argument("--part-mib", type=int, default=8,
                    help="multipart part size in MiB for boto3 and ckpt alike (default 8)")
    return ap.parse_args()


def main():
    a = parse_args()
    ensure_venv()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    if a.bin is None:
        sh(["bazel", "build", "-c", "opt", "//tools:ckptctl"], cwd=REPO)
        a.bin = os.path.join(REPO, "bazel-out", "k8-opt", "bin")
    ckptctl = os.path.join(a.bin, "tools", "ckptctl")
    work = tempfile.mkdtemp(prefix="s3bench-")
    if not a.keep:
        atexit.register(shutil.rmtree, work, True)  # registered first: runs after Swift stops
    print(f"s3_bench: work dir {work}; {ckptctl}", flush=True)
    server = start_swift(work)
    client = boto3_client(server)
    client.create_bucket(Bucket=BUCKET)
    global PART_MIB
    PART_MIB = a.part_mib
    env = dict(os.environ, AWS_ACCESS_KEY_ID=server["access_key_id"],
               AWS_SECRET_ACCESS_KEY=server["secret_access_key"], AWS_REGION=server["region"],
               AWS_ENDPOINT_URL=server["endpoint"], CKPT_S3_PART_SIZE=str(a.part_mib * MIB))
    ckpt, files, arrays = make_checkpoint(work, ckptctl, a.gib, a.shards)
    nbytes = sum(os.path.getsize(f) for f in files)
    print(f"checkpoint: {len(files)} data files, {nbytes / 1e9:.3f} GB ({ckpt})", flush=True)
    lim = limits(work, not a.no_loopback)
    rows, m = [], Meter(server["pids"])
    for i in range(a.repeat):
        run = "cold" if i == 0 else f"warm {i}"
        for path, fn in (
                ("ckpt", lambda: ckpt_round(m, ckptctl, env, ckpt, f"s3://{BUCKET}/ckpt-{i}",
                                            os.path.join(work, f"ckpt-load-{i}"))),
                ("boto3", lambda: boto3_round(m, client, files, f"boto3-{i}",
                                              os.path.join(work, f"boto3-load-{i}"))),
                ("DCP-s3fs", lambda: dcp_round(m, server, arrays, f"s3://{BUCKET}/dcp-{i}"))):
            save, load = fn()
            rows += [(path, "save", run, save), (path, "load", run, load)]
            print(f"  {run}: {path} save {save[0]:.2f} s, load {load[0]:.2f} s "
                  f"({nbytes / save[0] / 1e9:.3f} / {nbytes / load[0] / 1e9:.3f} GB/s)",
                  flush=True)
    rows.sort(key=lambda r: (r[1] == "load", r[2], ["ckpt", "boto3", "DCP-s3fs"].index(r[0])))
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print()
    print(table(rows, nbytes))
    print()
    extra = f"; loopback TCP 4 streams {lim['loop4']:.2f} GB/s" if "loop4" in lim else ""
    print(f"machine: dd write 1 GiB (O_DIRECT, conv=fsync) {lim['dd']:.2f} GB/s{extra}; "
          f"{os.cpu_count()} CPUs; uptime: {up}")


if __name__ == "__main__":
    main()
