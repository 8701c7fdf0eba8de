"""Writes the ckpt wheel (a zip with .dist-info, PEP 427) from built files; stdlib only, so
Bazel runs it offline (python/BUILD.bazel, target //python:wheel; tools/build_wheel.sh).

    python3 python/wheel.py --out ckpt-0.1.0-cp311-cp311-linux_x86_64.whl \\
        --file ckpt/__init__.py=python/ckpt/__init__.py ... --exec ckpt/bin/ckpt_worker=...

Every --file/--exec is ARCNAME=PATH; --exec files keep mode 0755 (pip restores it).
--base WHEEL starts from another wheel's files (tools/build_wheel.sh adds the daemons so).
"""

import argparse
import base64
import hashlib
import zipfile

METADATA = """Metadata-Version: 2.1
Name: ckpt
Version: {version}
Summary: Distributed checkpoints for PyTorch: a drop-in for torch.distributed.checkpoint
Requires-Python: >=3.11,<3.12
Requires-Dist: numpy
Provides-Extra: torch
Requires-Dist: torch>=2.4; extra == "torch"

The extension links the system libraries of the build host (gRPC, protobuf, Abseil, xxhash,
NCCL/CUDA runtime as installed by tools/install_deps.sh); ckpt/bin/ holds the daemons
(ckpt_coordinator, ckpt_worker) and ckptctl that ckpt.LocalCluster starts.
"""

WHEEL = """Wheel-Version: 1.0
Generator: ckpt python/wheel.py
Root-Is-Purelib: false
Tag: {tag}
"""


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _add(zf, records, arcname, data, mode):
    info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    records.append(f"{arcname},{_digest(data)},{len(data)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--version", default="0.1.0")
    p.add_argument("--tag", default="cp311-cp311-linux_x86_64")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--exec", action="append", default=[])
    p.add_argument("--base", help="a wheel whose files (but not .dist-info) to start from")
    args = p.parse_args()
    dist_info = f"ckpt-{args.version}.dist-info"
    records = []
    with zipfile.ZipFile(args.out, "w") as zf:
        if args.base:
            with zipfile.ZipFile(args.base) as base:
                for info in base.infolist():
                    if ".dist-info/" not in info.filename:
                        _add(zf, records, info.filename, base.read(info),
                             (info.external_attr >> 16) & 0o777)
        for spec, mode in [(f, 0o644) for f in args.file] + [(f, 0o755) for f in args.exec]:
            arcname, path = spec.split("=", 1)
            with open(path, "rb") as f:
                _add(zf, records, arcname, f.read(), mode)
        _add(zf, records, f"{dist_info}/METADATA",
             METADATA.format(version=args.version).encode(), 0o644)
        _add(zf, records, f"{dist_info}/WHEEL", WHEEL.format(tag=args.tag).encode(), 0o644)
        _add(zf, records, f"{dist_info}/top_level.txt", b"ckpt\n", 0o644)
        records.append(f"{dist_info}/RECORD,,")
        _add_record(zf, dist_info, records)


def _add_record(zf, dist_info, records):
    info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = (0o100644) << 16
    zf.writestr(info, "\n".join(records) + "\n")


if __name__ == "__main__":
    main()
