"""Hugging Face sharded safetensors export (ckptctl export --max-file-size, --dtype, --rename)
read by the `safetensors` library and by transformers-style index loading.

transformers itself is not in the pinned environment; `load_like_transformers` follows what
its sharded loading does with model.safetensors.index.json (the weight_map names each
tensor's file; every named file is opened with safetensors and must hold exactly the tensors
mapped to it; "metadata.total_size" is the data size). dtype conversion is compared bit for
bit with torch's own Tensor.to on random bit patterns (every class of float: normals,
subnormals, halfway cases, infinities; NaNs must stay NaNs).
"""

import json
import os
import re
import subprocess

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

CKPTCTL = os.environ["CKPTCTL"]
GPT_TOOL = os.environ["GPT_TOOL"]


def run(*args):
    done = subprocess.run([str(a) for a in args], capture_output=True, timeout=600)
    assert done.returncode == 0, f"{args}: {done.stderr.decode()}"
    return done.stdout.decode()


def load_like_transformers(folder):
    """The state dict a transformers-style sharded load builds from `folder`."""
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    state, total = {}, 0
    for shard in sorted(set(weight_map.values())):
        expected = {k for k, v in weight_map.items() if v == shard}
        with safe_open(os.path.join(folder, shard), framework="pt") as st:
            assert set(st.keys()) == expected, shard
            assert st.metadata()["format"] == "pt"  # what transformers checks for
            for key in st.keys():
                state[key] = st.get_tensor(key)
                total += state[key].numel() * state[key].element_size()
    assert total == index["metadata"]["total_size"]
    return state


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


def same_conversion(got, expected):
    """Bit for bit, except that a NaN need only stay a NaN (torch itself writes different NaN
    bits on different paths: F32 -> BF16 gives 0xffff, F64 -> BF16 0x7fc0)."""
    if not expected.is_floating_point():
        return torch.equal(bits(got), bits(expected))
    nan = torch.isnan(expected)
    return torch.equal(torch.isnan(got), nan) and torch.equal(bits(got[~nan]),
                                                              bits(expected[~nan]))


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    run(GPT_TOOL, "write", root / "ckpt", "--tp", "2", "--dp", "2", "--layers", "2", "--hidden",
        "64", "--vocab", "256")
    run(CKPTCTL, "export", root / "ckpt", root / "full.safetensors")
    return root


def test_sharded_export_with_bf16_and_renamed_keys_loads_like_transformers(gpt, tmp_path):
    full = load_file(str(gpt / "full.safetensors"))
    mapping = {k: "model." + k.replace("layers.", "h.") for k in full
               if not k.startswith("optimizer.")}
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    out = tmp_path / "hf"
    listing = run(CKPTCTL, "export", gpt / "ckpt", out, "--max-file-size", "300KiB", "--dtype",
                  "bf16", "--rename", tmp_path / "map.json")
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    n = len(shards)
    assert n > 2 and files == shards + ["model.safetensors.index.json"]
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert listing.count("wrote ") == n + 1
    state = load_like_transformers(out)
    assert sorted(state) == sorted(mapping.get(k, k) for k in full)
    for key, tensor in full.items():
        got = state[mapping.get(key, key)]
        assert got.dtype == torch.bfloat16 and got.shape == tensor.shape, key
        assert same_conversion(got, tensor.to(torch.bfloat16)), key
    for shard in shards:  # each file within the size chosen (one bigger tensor may be alone)
        with safe_open(str(out / shard), framework="pt") as st:
            sizes = [st.get_tensor(k).numel() * 2 for k in st.keys()]
        assert sum(sizes) <= 300 * 1024 or len(sizes) == 1, shard


def test_integer_and_bool_tensors_keep_their_dtype(tmp_path):
    tensors = {"ids": torch.arange(10, dtype=torch.int64), "mask": torch.tensor([True, False]),
               "w": torch.randn(3, 3, dtype=torch.float64), "f8": torch.zeros(4).to(
                   torch.float8_e5m2)}
    save_file(tensors, str(tmp_path / "in.safetensors"))
    run(CKPTCTL, "import", tmp_path / "in.safetensors", tmp_path / "ckpt")
    run(CKPTCTL, "export", tmp_path / "ckpt", tmp_path / "out.safetensors", "--dtype", "F16")
    out = load_file(str(tmp_path / "out.safetensors"))
    assert out["ids"].dtype == torch.int64 and out["mask"].dtype == torch.bool
    assert out["f8"].dtype == torch.float8_e5m2
    assert same_conversion(out["w"], tensors["w"].to(torch.float16))


def random_floats(n, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 1 << 32, (n,), generator=g, dtype=torch.int64)
    special = torch.tensor([0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x00000001,
                            0x807fffff, 0x3f808000, 0x3f818000, 0x477fe000, 0x477ff000,
                            0x33800000, 0x33000000, 0x387fc000, 0x7f7fffff, 0x7fc00000,
                            0x7f800001], dtype=torch.int64)
    # Mostly magnitudes near the half-precision range, where rounding is interesting.
    near = (torch.randint(0x30000000, 0x48000000, (n,), generator=g) |
            (torch.randint(0, 2, (n,), generator=g) << 31))
    return torch.cat([raw, special, near]).to(torch.uint32).view(torch.float32)


@pytest.mark.parametrize("source,target", [(torch.float32, torch.bfloat16),
                                           (torch.float32, torch.float16),
                                           (torch.float64, torch.bfloat16),
                                           (torch.bfloat16, torch.float16),
                                           (torch.float16, torch.float32)])
def test_dtype_conversion_matches_torch_bit_for_bit(tmp_path, source, target):
    values = random_floats(20000, 15).to(source)
    save_file({"x": values}, str(tmp_path / "in.safetensors"))
    run(CKPTCTL, "import", tmp_path / "in.safetensors", tmp_path / "ckpt")
    name = {torch.bfloat16: "bf16", torch.float16: "F16", torch.float32: "f32"}[target]
    run(CKPTCTL, "export", tmp_path / "ckpt", tmp_path / "out.safetensors", "--dtype", name)
    got = load_file(str(tmp_path / "out.safetensors"))["x"]
    assert same_conversion(got, values.to(target))


def test_bad_mappings_and_dtypes_are_refused_before_writing(gpt, tmp_path):
    (tmp_path / "typo.json").write_text(json.dumps({"no.such.key": "x"}))
    (tmp_path / "clash.json").write_text(json.dumps({"final_layernorm.bias":
                                                     "final_layernorm.weight"}))
    for args, message in [
        (["--rename", tmp_path / "typo.json"], "renames \"no.such.key\", which the checkpoint"),
        (["--rename", tmp_path / "clash.json"], "would both be exported as"),
        (["--rename", tmp_path / "missing.json"], "missing.json"),
        (["--dtype", "I8"], "--dtype must be"),
    ]:
        done = subprocess.run([CKPTCTL, "export", str(gpt / "ckpt"), str(tmp_path / "out"),
                               *map(str, args)], capture_output=True, timeout=60)
        assert done.returncode in (1, 2) and message in done.stderr.decode(), done.stderr
        assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
