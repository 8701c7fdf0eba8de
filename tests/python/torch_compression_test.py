"""ckpt.torch.save(compression=...) on one rank against real daemons (issue 40 item 6): every
value comes back bit for bit (NaN payloads, subnormals, negative zero, odd sizes, every common
dtype), `ckptctl inspect` shows the codec and a ratio below 1 for the weights and says a plain
safetensors reader cannot read the files; a bad spec is refused naming it."""

import json
import os
import subprocess
import uuid

import pytest
import torch

import ckpt
import ckpt.torch
import rank_threads  # beside this file

# Integer views of the same width, to compare floats bit for bit (torch.equal says NaN != NaN).
BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
        torch.bfloat16: torch.int16, torch.bool: torch.uint8}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 1, torch_job="torch-compression")


def special(dtype, bits):
    """A tensor of `dtype` holding the given bit patterns (NaN payloads, subnormals, -0)."""
    return torch.tensor(bits, dtype=BITS[dtype]).view(dtype)


def state():
    g = torch.Generator().manual_seed(40)
    weights = torch.randn(1000, 333, generator=g) * 0.02
    return {
        "model": {
            "w_bf16": weights.to(torch.bfloat16),
            "w_f32": weights[:77, :13].clone(),
            "w_f16": (torch.randn(3, 5, 7, generator=g) * 0.1).to(torch.float16),
            "w_f64": torch.randn(41, generator=g, dtype=torch.float64),
        },
        "nan_f32": special(torch.float32, [0x7FC00123, -0x007FFFFF, 0x00000001, -0x80000000,
                                           0x7F800000, 0x007FFFFF, 0x3F800000]),
        "nan_bf16": special(torch.bfloat16, [0x7FC1, -0x007F, 0x0001, -0x8000, 0x7F81]),
        "nan_f16": special(torch.float16, [0x7E01, 0x0001, -0x8000, 0x7C01, 0x03FF]),
        "nan_f64": special(torch.float64, [0x7FF0000000000001, 0x000FFFFFFFFFFFFF,
                                           -0x8000000000000000]),
        "step_i64": torch.arange(13, dtype=torch.int64) * 1000003,
        "i32": torch.randint(-5, 5, (9, 11), generator=g, dtype=torch.int32),
        "i8": torch.randint(-128, 127, (1,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (4097,), generator=g, dtype=torch.uint8),
        "mask": torch.rand(301, generator=g) > 0.5,
        "epoch": 3,
    }


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    return torch.zeros_like(sd) if isinstance(sd, torch.Tensor) else sd


def assert_bit_exact(got, want, where="sd"):
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            assert_bit_exact(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        view = BITS.get(want.dtype)
        a, b = (got.view(view), want.view(view)) if view else (got, want)
        assert torch.equal(a, b), f"{where}: not bit-exact"
    else:
        assert got == want, (where, got, want)


def inspect(path):
    ckptctl = os.environ.get("CKPTCTL")
    if not ckptctl:
        pytest.skip("CKPTCTL (//tools:ckptctl) not given")
    out = subprocess.run([ckptctl, "inspect", path, "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def save_compressed_and_check(cluster, spec):
    want = state()
    path = os.path.join(cluster.root, f"compressed-{uuid.uuid4().hex[:8]}")
    ckpt.torch.save(want, checkpoint_id=path, compression=spec)
    got = zeros_like(want)
    ckpt.torch.load(got, checkpoint_id=path)
    assert_bit_exact(got, want)

    info = inspect(path)
    assert info["compressed_pieces"] > 0
    assert info["plain_safetensors_readable"] is False
    tensors = {t["key"]: t for t in info["tensors"]}
    w = tensors["model.w_bf16"]
    assert w["codec"] == "bytegroup-zstd", w
    assert w["ratio"] < 0.9, w  # trained-weight-like bf16 shrinks
    assert w["stored_bytes"] < w["raw_bytes"], w
    assert tensors["step_i64"]["codec"] == "zstd", tensors["step_i64"]


def test_a_compressed_save_loads_back_bit_exact_and_inspect_shows_the_codec(cluster):
    save_compressed_and_check(cluster, "zstd:3")  # the module's first save of its job


# Its plan is reused (same layout, same job): the compression must still reach the workers.
def test_a_later_compressed_save_of_the_same_state_is_compressed_too(cluster):
    save_compressed_and_check(cluster, "zstd")


def test_an_uncompressed_save_says_so_in_inspect(cluster):
    want = state()
    path = os.path.join(cluster.root, f"plain-{uuid.uuid4().hex[:8]}")
    ckpt.torch.save(want, checkpoint_id=path)
    got = zeros_like(want)
    ckpt.torch.load(got, checkpoint_id=path)
    assert_bit_exact(got, want)
    info = inspect(path)
    assert info["compressed_pieces"] == 0
    assert info["plain_safetensors_readable"] is True
    assert all(t["codec"] == "none" for t in info["tensors"])


def test_a_bad_compression_spec_is_refused_naming_it(cluster):
    path = os.path.join(cluster.root, f"bad-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ckpt.Error, match="lz4"):
        ckpt.torch.save(state(), checkpoint_id=path, compression="lz4")
