"""Every data file ckpt writes, and every export, opened by the `safetensors` library itself.

The pinned safetensors (python/requirements.lock) reads: the data files of a save of the example
GPT state (TP=2 x DP=2, ZeRO-1 flat optimizer pieces), of an offline reshard of it into an
uneven 3-rank layout, and of an import; and the exports (one file, and split files with
model.safetensors.index.json). Each data file must open with safe_open (torch and, for the
dtypes numpy has, numpy), hold exactly the entries the manifest lists with the manifest's dtype
and shape, and each entry's bytes must be the manifest's byte range of the file. Content is
checked against an independent source: every stored piece must equal the exported full tensor
(read by safetensors) sliced to the piece's box and narrowed to its flat range with torch, and
the saved checkpoint itself is verified element by element against the example state's
pattern (gpt_tool check).
"""

import json
import os
import subprocess

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

CKPTCTL = os.environ["CKPTCTL"]
GPT_TOOL = os.environ["GPT_TOOL"]
LAYOUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "layouts")

TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def run(*args):
    done = subprocess.run(list(args), capture_output=True, timeout=600)
    assert done.returncode == 0, f"{args}: {done.stderr.decode()}"
    return done.stdout.decode()


def manifest(path):
    return json.loads(run(CKPTCTL, "inspect", path, "--json"))


def tensor_bytes(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def piece_of(full, region):
    """The stored form of `region` of `full`: the box, row-major, narrowed to the flat range."""
    box = full[tuple(slice(o, o + n) for o, n in zip(region["offsets"], region["lengths"]))]
    flat = box.reshape(-1)
    if "flat" in region:
        flat = flat[region["flat"][0]:region["flat"][1]]
    return flat


def check_data_files(ckpt, full_tensors):
    """Opens every data file of `ckpt` with safetensors and checks it against the manifest
    and, where given, the full tensors. Returns the number of pieces checked."""
    m = manifest(ckpt)
    by_file = {}
    for t in m["tensors"]:
        for p in t["pieces"]:
            by_file.setdefault(p["file"], []).append((t, p))
    assert sorted(by_file) == sorted(f["name"] for f in m["files"])
    checked = 0
    for f in m["files"]:
        path = os.path.join(ckpt, f["name"])
        assert os.path.getsize(path) == f["size_bytes"]
        raw = open(path, "rb").read()
        pieces = by_file[f["name"]]
        with safe_open(path, framework="pt") as st:
            assert sorted(st.keys()) == sorted(p["entry"] for _, p in pieces)
            assert st.metadata()["format"] == "ckpt"
            for t, p in pieces:
                stored = st.get_tensor(p["entry"])
                region = p["region"]
                shape = [region["flat"][1] - region["flat"][0]] if "flat" in region \
                    else region["lengths"]
                assert list(stored.shape) == shape, p["entry"]
                assert stored.dtype == TORCH_DTYPES[t["dtype"]], p["entry"]
                begin = p["byte_offset"]  # absolute in the file
                assert begin >= f["data_start"]
                assert tensor_bytes(stored) == raw[begin:begin + p["byte_length"]], p["entry"]
                if full_tensors is not None:
                    expected = piece_of(full_tensors[t["key"]], region)
                    assert tensor_bytes(stored) == tensor_bytes(expected), p["entry"]
                checked += 1
        with safe_open(path, framework="numpy") as st:
            for t, p in pieces:
                if t["dtype"] == "F32":
                    array = st.get_tensor(p["entry"])
                    assert array.dtype == np.float32
                    assert array.tobytes() == tensor_bytes(st_torch(path, p["entry"]))
        assert len(load_file(path)) == len(pieces)
    return checked


def st_torch(path, name):
    with safe_open(path, framework="pt") as st:
        return st.get_tensor(name)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    ckpt = str(root / "saved")
    run(GPT_TOOL, "write", ckpt, "--tp", "2", "--dp", "2", "--layers", "2", "--hidden", "64",
        "--vocab", "256")
    run(GPT_TOOL, "check", ckpt, "--layout", os.path.join(LAYOUT_DIR, "tp2dp2.json"))
    export = str(root / "full.safetensors")
    run(CKPTCTL, "export", ckpt, export)
    return root, ckpt, load_file(export)


def test_export_is_one_safetensors_file_with_every_tensor_whole(saved):
    _, ckpt, full = saved
    m = manifest(ckpt)
    assert sorted(full) == sorted(t["key"] for t in m["tensors"])
    for t in m["tensors"]:
        assert list(full[t["key"]].shape) == t["shape"]
        assert full[t["key"]].dtype == TORCH_DTYPES[t["dtype"]]


def test_saved_data_files_open_with_safetensors_and_hold_the_pieces(saved):
    _, ckpt, full = saved
    m = manifest(ckpt)
    assert any("flat" in p["region"] for t in m["tensors"] for p in t["pieces"])  # ZeRO pieces
    assert check_data_files(ckpt, full) == sum(len(t["pieces"]) for t in m["tensors"])


def test_resharded_data_files_open_with_safetensors_and_hold_the_pieces(saved):
    root, ckpt, full = saved
    out = str(root / "uneven3")
    run(CKPTCTL, "reshard", ckpt, out, "--layout", os.path.join(LAYOUT_DIR, "uneven3.json"))
    assert len(manifest(out)["files"]) == 3
    assert check_data_files(out, full) > 0


def test_split_export_opens_with_safetensors_and_agrees_with_the_index(saved):
    root, ckpt, full = saved
    out = root / "split"
    run(CKPTCTL, "export", ckpt, str(out), "--max-file-size", "200KiB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    seen = {}
    for name in files:
        assert (out / name).stat().st_size <= 200 * 1024 + 64 * 1024  # data + header
        with safe_open(str(out / name), framework="pt") as st:
            for key in st.keys():
                assert index["weight_map"][key] == name
                seen[key] = st.get_tensor(key)
    assert sorted(seen) == sorted(full)
    for key, tensor in seen.items():
        assert tensor_bytes(tensor) == tensor_bytes(full[key]), key
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size()
                                                   for t in full.values())


def test_imported_data_files_open_with_safetensors(tmp_path):
    tensors = {"w": torch.randn(7, 3), "b": torch.arange(5, dtype=torch.int64),
               "h": torch.randn(4, 4).to(torch.bfloat16), "flag": torch.tensor([True, False]),
               "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}
    source = str(tmp_path / "in.safetensors")
    save_file(tensors, source, metadata={"origin": "torch"})
    ckpt = str(tmp_path / "imported")
    run(CKPTCTL, "import", source, ckpt)
    assert check_data_files(ckpt, tensors) == len(tensors)
