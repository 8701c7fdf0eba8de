"""`ckptctl diff A B` on the real binary: checkpoints of different formats (ckpt, safetensors
file, directory, index) and layouts (TP x DP with flat ZeRO pieces, uneven 3-rank) that hold
the same tensors are identical; every kind of difference is reported (keys missing on either
side, dtype, shape, values with the first differing element, its index and both values); a
tensor larger than the memory budget is compared in chunks without holding it; unreadable or
corrupt sides are errors. Exit status 0 same, 1 different, 2 error.

Expected answers come from torch and the safetensors library, not from ckpt.
"""

import os
import re
import sys
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

CKPTCTL = os.environ["CKPTCTL"]
GPT_TOOL = os.environ["GPT_TOOL"]
LAYOUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "layouts")


def run(*args):
    done = subprocess.run(list(args), capture_output=True, timeout=600)
    assert done.returncode == 0, f"{args}: {done.stderr.decode()}"
    return done.stdout.decode()


def diff(a, b, *flags):
    done = subprocess.run([CKPTCTL, "diff", str(a), str(b), *flags], capture_output=True,
                          timeout=600)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """The example GPT state saved TP=2 x DP=2, resharded, exported three ways."""
    root = tmp_path_factory.mktemp("gpt")
    saved = root / "saved"
    run(GPT_TOOL, "write", str(saved), "--tp", "2", "--dp", "2", "--layers", "2", "--hidden",
        "64", "--vocab", "256")
    run(CKPTCTL, "reshard", str(saved), str(root / "uneven3"), "--layout",
        os.path.join(LAYOUT_DIR, "uneven3.json"))
    run(CKPTCTL, "export", str(saved), str(root / "full.safetensors"))
    run(CKPTCTL, "export", str(saved), str(root / "split"), "--max-file-size", "200KiB")
    return root


def test_same_tensors_in_any_format_and_layout_are_identical(gpt):
    sides = [gpt / "saved", gpt / "uneven3", gpt / "full.safetensors", gpt / "split",
             gpt / "split" / "model.safetensors.index.json"]
    for a, b in [(sides[0], sides[1]), (sides[1], sides[2]), (sides[2], sides[3]),
                 (sides[4], sides[0])]:
        code, out, err = diff(a, b)
        assert code == 0, out + err
        assert "identical: 0 only in A, 0 only in B, 0 with other dtype/shape, 0 of 112" in out


def test_one_changed_element_is_found_with_its_index_and_values(gpt, tmp_path):
    tensors = load_file(str(gpt / "full.safetensors"))
    key = "optimizer.exp_avg.layers.1.mlp.fc1.weight"  # fp32, flat-sharded in the save
    changed = dict(tensors)
    changed[key] = tensors[key].clone()
    shape = changed[key].shape
    changed[key][100, 7] = 1.5
    old = tensors[key][100, 7].item()
    save_file(changed, str(tmp_path / "changed.safetensors"))
    code, out, _ = diff(gpt / "uneven3", tmp_path / "changed.safetensors")
    assert code == 1
    line = [l for l in out.splitlines() if l.startswith("values differ")]
    assert len(line) == 1 and key in line[0]
    assert f"1 of {shape[0] * shape[1]} elements" in line[0]
    assert f"first at [100, 7] (element {100 * shape[1] + 7})" in line[0]
    assert "B 1.5 (0x3fc00000)" in line[0]
    assert f"A {old:.17g}".rstrip("0") in line[0] or f"A {repr(old)}" in line[0]
    assert f"max |a-b| {abs(old - 1.5):.9g}" in line[0]
    assert out.splitlines()[-1].startswith("different: 0 only in A, 0 only in B, 0 with")


def test_missing_keys_and_dtype_and_shape_differences_are_reported(tmp_path):
    a = {"same": torch.arange(6.0), "only_a": torch.zeros(2), "dt": torch.ones(3),
         "sh": torch.ones(2, 3)}
    b = {"same": torch.arange(6.0), "only_b": torch.zeros(2),
         "dt": torch.ones(3, dtype=torch.bfloat16), "sh": torch.ones(3, 2)}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    run(CKPTCTL, "import", str(tmp_path / "a.safetensors"), str(tmp_path / "a_ckpt"))
    code, out, _ = diff(tmp_path / "a_ckpt", tmp_path / "b.safetensors")
    assert code == 1
    assert "only in A: only_a" in out and "only in B: only_b" in out
    assert "dtype differs: dt: A F32 (3,), B BF16 (3,)" in out
    assert "shape differs: sh: A F32 (2, 3), B F32 (3, 2)" in out
    assert "1 only in A, 1 only in B, 2 with other dtype/shape, 0 of 1 compared" in out


def test_comparison_is_bitwise_for_signed_zeros_and_nans(tmp_path):
    nan = torch.tensor([float("nan")])
    save_file({"z": torch.tensor([0.0]), "n": nan}, str(tmp_path / "a.safetensors"))
    save_file({"z": torch.tensor([-0.0]), "n": nan.clone()}, str(tmp_path / "b.safetensors"))
    code, out, _ = diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert code == 1
    assert "values differ: z (F32 (1,)): 1 of 1 elements; first at [0] (element 0): A 0 (0x00000000), B -0 (0x80000000)" in out
    assert "values differ: n" not in out  # the same NaN bits


def test_a_tensor_larger_than_the_budget_is_compared_in_chunks(tmp_path):
    big = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB
    other = big.clone()
    other[-1] = -1.0  # in the last chunk
    save_file({"big": big}, str(tmp_path / "a.safetensors"))
    save_file({"big": other}, str(tmp_path / "b.safetensors"))
    run(CKPTCTL, "import", str(tmp_path / "a.safetensors"), str(tmp_path / "a_ckpt"))
    del big, other
    # A fresh parent reports the peak resident size of its only child: the diff.
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], capture_output=True)\n"
             "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.stdout.write(done.stdout.decode())\n")
    out = run(sys.executable, "-c", probe, CKPTCTL, "diff", str(tmp_path / "a_ckpt"),
              str(tmp_path / "b.safetensors"), "--memory-budget", "1MiB")
    code, peak_kib = map(int, out.splitlines()[0].split())
    assert code == 1
    assert f"first at [{(16 << 20) - 1}]" in out and "B -1 (0xbf800000)" in out
    # Holding both sides would take 128 MiB; the chunks take 1 MiB (plus the binary's own).
    assert peak_kib < 40 * 1024, peak_kib

def test_reports_are_capped_but_the_summary_counts_all(tmp_path):
    a = {f"t{i}": torch.zeros(4) for i in range(30)}
    b = {f"t{i}": torch.ones(4) for i in range(30)}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    code, out, _ = diff(tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--max-reports",
                        "5")
    assert code == 1
    assert len([l for l in out.splitlines() if l.startswith("values differ")]) == 5
    assert "... and 25 more tensors whose values differ" in out
    assert "30 of 30 compared differ" in out


def test_errors_exit_2_naming_the_side_and_file(gpt, tmp_path):
    code, _, err = diff(gpt / "saved", tmp_path / "missing")
    assert code == 2 and "B:" in err and "does not exist" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = diff(empty, gpt / "saved")
    assert code == 2 and "A:" in err and "not a checkpoint" in err
    corrupt = tmp_path / "corrupt"
    shutil.copytree(gpt / "saved", corrupt)
    data = sorted((corrupt / "data").iterdir())[0]
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0xFF  # a byte of the last piece: its checksum no longer matches
    data.write_bytes(bytes(raw))
    code, out, err = diff(corrupt, gpt / "saved")
    assert code == 2 and data.name in err, err
    assert not re.search(r"^(identical|different)", out, re.M)
    done = subprocess.run([CKPTCTL, "diff", str(gpt / "saved")], capture_output=True, timeout=60)
    assert done.returncode == 2 and "expected two checkpoints" in done.stderr.decode()
    code, _, err = diff(gpt / "saved", gpt / "saved", "--memory-budget", "lots")
    assert code == 2 and "--memory-budget" in err
