"""`ckptctl import --from dcp` on damaged and hostile inputs (python/ckpt/interop/dcp.py and
dcp_metadata.py): each is refused with one line naming the file and what is wrong, exit code 1,
and nothing written at the destination; never a Python traceback, a bare "maximum recursion
depth exceeded", or an encoder error about a "duplicate, reserved or not valid UTF-8" entry.

The input is a small DCP checkpoint written by torch's own dcp.save in this process, then
altered: a .metadata whose objects lack fields, a chunk listed twice, more chunks than storage
items, planner data nested too deeply or expanding through shared references, and a torch_dist
metadata.json in UTF-16 or nested too deeply.
"""

import json
import os
import pickle
import shutil
import subprocess

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

CKPTCTL = os.environ["CKPTCTL"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("dcp") / "in"
    state = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(5),
             "step": 7}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return path


def copy_of(saved, tmp_path):
    shutil.copytree(saved, tmp_path / "in")
    return tmp_path / "in"


def write_metadata(src, md, protocol=pickle.DEFAULT_PROTOCOL):
    with open(src / ".metadata", "wb") as f:
        f.write(pickle.dumps(md, protocol=protocol))


def read_metadata(src):
    return FileSystemReader(str(src)).read_metadata()


def assert_refused(src, tmp_path, message_parts):
    (tmp_path / "dest").mkdir()
    done = subprocess.run([CKPTCTL, "import", "--from", "dcp", str(src),
                           str(tmp_path / "dest" / "ckpt")], capture_output=True, timeout=600)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert len(err.strip().splitlines()) == 1, err  # one line, no traceback
    for part in message_parts:
        assert part in err, err
    assert os.listdir(tmp_path / "dest") == [], "something was written at the destination"
    return err


def test_the_unaltered_checkpoint_imports(saved, tmp_path):
    done = subprocess.run([CKPTCTL, "import", "--from", "dcp", str(saved),
                           str(tmp_path / "ckpt")], capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()


def _drop(obj, name):
    del obj.__dict__[name]


MISSING_FIELDS = {
    "Metadata.state_dict_metadata": (lambda md: _drop(md, "state_dict_metadata"),
                                     "the Metadata has no field 'state_dict_metadata'"),
    "TensorStorageMetadata.properties": (
        lambda md: _drop(md.state_dict_metadata["w"], "properties"),
        "tensor 'w' has no field 'properties'"),
    "ChunkStorageMetadata.sizes": (
        lambda md: _drop(md.state_dict_metadata["w"].chunks[0], "sizes"),
        "a chunk of tensor 'w' has no field 'sizes'"),
    "_StorageInfo.length": (
        lambda md: _drop(next(v for k, v in md.storage_data.items() if k.fqn == "w"),
                         "length"),
        "storage_data of 'w' has no field 'length'"),
}


@pytest.mark.parametrize("field", sorted(MISSING_FIELDS))
def test_metadata_objects_without_their_fields_are_refused_naming_the_field(
        saved, tmp_path, field):
    src = copy_of(saved, tmp_path)
    md = read_metadata(src)
    mutate, message = MISSING_FIELDS[field]
    mutate(md)
    write_metadata(src, md)
    assert_refused(src, tmp_path, [str(src / ".metadata"), message])


def test_a_chunk_listed_twice_is_refused_naming_the_tensor_and_offsets(saved, tmp_path):
    src = copy_of(saved, tmp_path)
    md = read_metadata(src)
    chunks = md.state_dict_metadata["w"].chunks
    chunks.append(chunks[0])
    write_metadata(src, md)
    assert_refused(src, tmp_path, [str(src / ".metadata"),
                                   "tensor 'w' lists its chunk at offsets [0, 0] twice"])


def test_more_chunks_than_storage_items_are_refused_before_they_are_looked_up(saved, tmp_path):
    src = copy_of(saved, tmp_path)
    md = read_metadata(src)
    chunk_type = type(md.state_dict_metadata["w"].chunks[0])
    md.state_dict_metadata["w"].chunks = [
        chunk_type(offsets=torch.Size([i, j]), sizes=torch.Size([0, 0]))
        for i in range(3) for j in range(4)]
    write_metadata(src, md)
    assert_refused(src, tmp_path, [str(src / ".metadata"),
                                   "lists more chunks than storage_data has items"])


MARK = "PLANNER-DATA-MARK"


def metadata_with_raw_planner_data(src, raw):
    """.metadata whose planner_data is the pickle opcodes `raw` (protocol 3: no frames, so
    opcodes can be spliced in)."""
    md = read_metadata(src)
    md.planner_data = MARK
    data = pickle.dumps(md, protocol=3)
    marker = b"X" + len(MARK).to_bytes(4, "little") + MARK.encode()
    assert data.count(marker) == 1
    with open(src / ".metadata", "wb") as f:
        f.write(data.replace(marker, raw))


def test_deeply_nested_planner_data_is_refused_naming_the_file(saved, tmp_path):
    src = copy_of(saved, tmp_path)
    depth = 100_000
    metadata_with_raw_planner_data(src, b"(" * depth + b"l" * depth)  # [[[...]]]
    err = assert_refused(src, tmp_path, [str(src / ".metadata"),
                                         "planner_data is nested deeper than 64 levels"])
    assert "recursion" not in err


def test_planner_data_expanding_through_shared_references_is_refused(saved, tmp_path):
    src = copy_of(saved, tmp_path)
    # A 2000-character string, then 18 lists each holding the one before twice: a few hundred
    # bytes of pickle, 2**18 copies of the string as JSON (512 MiB).
    def put(i):  # memo indexes far above the ones the rest of the pickle uses
        return b"r" + (10_000 + i).to_bytes(4, "little")

    def get(i):
        return b"j" + (10_000 + i).to_bytes(4, "little")

    raw = b"X" + (2000).to_bytes(4, "little") + b"s" * 2000 + put(0) + b"0"
    for i in range(18):
        raw += b"(" + get(i) + get(i) + b"l" + put(i + 1) + b"0"
    raw += get(18)
    metadata_with_raw_planner_data(src, raw)
    assert_refused(src, tmp_path, [str(src / ".metadata"), "planner_data expands to more than"])


def write_torch_dist_json(src, data):
    (src / "metadata.json").write_bytes(data)


def test_a_utf16_metadata_json_is_refused_as_not_utf8(saved, tmp_path):
    src = copy_of(saved, tmp_path)
    write_torch_dist_json(src, json.dumps({"sharded_backend": "torch_dist"}).encode("utf-16"))
    assert_refused(src, tmp_path, [str(src / "metadata.json"), "is not UTF-8 JSON"])


def test_a_deeply_nested_metadata_json_is_refused_naming_the_file(saved, tmp_path):
    src = copy_of(saved, tmp_path)
    write_torch_dist_json(src, b"[" * 100_000 + b"]" * 100_000)
    assert_refused(src, tmp_path, [str(src / "metadata.json"), "nested deeper than"])


def test_a_metadata_that_crashes_the_interpreter_is_refused_naming_the_input(saved, tmp_path):
    # A dict keyed by a tuple nested a million deep: CPython's tuple hash recurses in C without
    # a depth check and the converter dies of SIGSEGV while unpickling. Not prevented (a
    # pre-scan of every opcode costs seconds on million-chunk metadata); ckptctl must still
    # name what it was converting, exit non-zero and write nothing.
    src = copy_of(saved, tmp_path)
    (src / ".metadata").write_bytes(b"\x80\x04}" + b")" + b"\x85" * 1_000_000 + b"Ns.")
    (tmp_path / "dest").mkdir()
    done = subprocess.run([CKPTCTL, "import", "--from", "dcp", str(src),
                           str(tmp_path / "dest" / "ckpt")], capture_output=True, timeout=600)
    err = done.stderr.decode()
    assert done.returncode != 0, err
    assert "ended by signal" in err and str(src) in err, err
    assert os.listdir(tmp_path / "dest") == [], "something was written at the destination"
