"""DCP and Megatron torch_dist interop (python/ckpt/interop/dcp.py, ckptctl import --from dcp,
export --to dcp, diff) against torch and megatron-core themselves.

Inputs are written by the real peers in gloo processes on CPU (tests/dcp_fixtures.py): a DCP
checkpoint of DTensors on a (2, 2) mesh with uneven and nested shards, plain tensors of eight
dtypes and non-tensor entries, and a torch_dist checkpoint from megatron-core's own
dist_checkpointing.save. Round trips DCP -> ckpt -> DCP must be bit-exact under several target
shardings (the stored pieces, a 4-way layout, a (2, 3) layout with flat ZeRO ranges) as
torch's dcp.load reads them into plain tensors and into DTensors of other meshes. Broken
inputs (a missing .distcp, a truncated or damaged item, a .metadata naming a class outside
DCP's) are refused naming the file, with nothing written at the destination and no code from
the file run.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python", "ckpt"))

import dcp_fixtures  # noqa: E402
from interop import dcp as interop_dcp  # noqa: E402
from interop import dcp_metadata  # noqa: E402

CKPTCTL = os.environ["CKPTCTL"]

LAYOUT_TP4 = {
    "world_size": 4, "mesh": {"tp": 4},
    "rules": [{"match": "model.embed", "placements": ["Shard(1)"]},
              {"match": "model.layers.*", "placements": ["Shard(0)"]},
              {"match": "*", "placements": ["Replicate()"]}]}
LAYOUT_DP2_TP3_FLAT = {
    "world_size": 6, "mesh": {"dp": 2, "tp": 3},
    "rules": [{"match": "model.embed", "placements": ["Replicate()", "Shard(0)"],
               "flat": {"over": "dp"}},
              {"match": "model.layers.0.w", "placements": ["Replicate()", "Shard(1)"],
               "flat": {"over": "dp"}},
              {"match": "model.norm", "placements": ["Shard(0)", "Shard(0)"]},
              {"match": "*", "placements": ["Replicate()", "Replicate()"]}]}


def run_ranks(world, *args):
    """Runs tests/dcp_fixtures.py as `world` gloo ranks, each in its own session; returns
    their stderr if one failed. Output goes to files, not pipes, and each rank's session is
    killed once it exits, so helpers a rank started (megatron-core's spawned manager) can
    neither hold the test up nor outlive it."""
    tmp = tempfile.mkdtemp(prefix="ranks-", dir=os.environ.get("TEST_TMPDIR"))
    procs = []
    for r in range(world):
        with open(os.path.join(tmp, f"{r}.err"), "wb") as err:
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "dcp_fixtures.py"), *args],
                env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                         STORE_FILE=os.path.join(tmp, "store")),
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True))
    failures = []
    for rank, p in enumerate(procs):
        try:
            code = p.wait(timeout=600)
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if code != 0:
            with open(os.path.join(tmp, f"{rank}.err"), "rb") as f:
                failures.append(f"rank {rank}: {f.read().decode()[-2000:]}")
    return "\n".join(failures)


def ckptctl(*args):
    done = subprocess.run([CKPTCTL, *map(str, args)], capture_output=True, timeout=600)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def ok(*args):
    code, out, err = ckptctl(*args)
    assert code == 0, out + err
    return out


def plain_load(path):
    """dcp.load into plain full tensors (one process)."""
    state = {k: torch.zeros_like(v) for k, v in dcp_fixtures.full_state().items()}
    state.update({"step": 0, "extra": {"lr": 0.0, "name": ""}})
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def assert_plain_load_is_exact(path):
    state = plain_load(path)
    for key, tensor in dcp_fixtures.full_state().items():
        assert dcp_fixtures.same_bits(state[key], tensor), key
    assert state["step"] == 11 and state["extra"] == {"lr": 0.5, "name": "run-15"}


def chunk_counts(path):
    md = FileSystemReader(str(path)).read_metadata()
    return {k: len(v.chunks) for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp")
    failure = run_ranks(4, "save-dtensor", str(root / "dcp"))
    assert not failure, failure
    return root


@pytest.fixture(scope="module")
def imported(saved):
    ok("import", "--from", "dcp", saved / "dcp", saved / "ckpt", "--workers", "2")
    return saved / "ckpt"


def test_every_dcp_chunk_becomes_one_piece_and_nothing_is_gathered(saved, imported):
    ok("verify", imported)
    manifest = json.loads(ok("inspect", imported, "--json"))
    pieces = {t["key"]: t["pieces"] for t in manifest["tensors"]}
    md = FileSystemReader(str(saved / "dcp")).read_metadata()
    for key, entry in md.state_dict_metadata.items():
        if not hasattr(entry, "chunks"):
            continue
        boxes = sorted((p["region"]["offsets"], p["region"]["lengths"]) for p in pieces[key])
        assert boxes == sorted((list(c.offsets), list(c.sizes)) for c in entry.chunks), key
    assert len(pieces["model.embed"]) == 4  # nested uneven Shard(0), Shard(0): 4, 3, 3, 3 rows
    meta = manifest["user_metadata"]
    assert json.loads(meta["dcp.bytes_entries"]) == ["extra.lr", "extra.name", "step"]
    assert meta["format"] == "dcp"


def test_import_is_what_dcp_load_reads(saved, imported, tmp_path):
    """diff (ckptctl) of the import against the full tensors torch loads from the original."""
    from safetensors.torch import save_file
    state = plain_load(saved / "dcp")
    save_file({k: state[k] for k in dcp_fixtures.full_state()}, str(tmp_path / "t.safetensors"))
    code, out, err = ckptctl("diff", imported, tmp_path / "t.safetensors")
    assert code == 1 and "only in A: step" in out  # the bytes entries are only in the import
    assert "0 with other dtype/shape, 0 of 8 compared differ" in out, out + err


LAYOUTS = {"stored-pieces": None, "tp4": LAYOUT_TP4, "dp2xtp3-flat": LAYOUT_DP2_TP3_FLAT}


@pytest.fixture(scope="module")
def exports(imported, tmp_path_factory):
    """The import exported under each target sharding, and once more in a tiny budget."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name, layout in LAYOUTS.items():
        args = ["export", "--to", "dcp", imported, root / name, "--workers", "2"]
        if layout:
            (root / f"{name}.json").write_text(json.dumps(layout))
            args += ["--layout", root / f"{name}.json"]
        ok(*args)
        out[name] = root / name
    ok("export", "--to=dcp", imported, root / "small-budget", "--memory-budget", "4KiB",
       "--layout", root / "tp4.json")
    out["small-budget"] = root / "small-budget"
    return out


@pytest.mark.parametrize("name", list(LAYOUTS) + ["small-budget"])
def test_round_trip_loads_bit_exact_into_plain_tensors(saved, exports, name):
    assert_plain_load_is_exact(exports[name])
    code, out, err = ckptctl("diff", saved / "dcp", exports[name])
    assert code == 0, out + err


def test_exports_are_chunked_by_the_target_layout(saved, exports):
    tp4 = chunk_counts(exports["tp4"])
    assert tp4["model.embed"] == 3  # 6 columns over 4 ranks: 2, 2, 2 and an empty one
    assert tp4["model.layers.0.w"] == 4 and tp4["opt.count"] == 1
    assert sorted(os.listdir(exports["tp4"])) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    assert chunk_counts(exports["dp2xtp3-flat"])["model.embed"] > 3  # flat halves as boxes
    assert chunk_counts(exports["stored-pieces"]) == chunk_counts(saved / "dcp")


def test_round_trip_loads_bit_exact_into_dtensors_of_other_meshes(exports):
    failure = run_ranks(3, "load-dtensor", "3", *map(str, exports.values()))
    assert not failure, failure
    failure = run_ranks(4, "load-dtensor", "2x2", str(exports["dp2xtp3-flat"]))
    assert not failure, failure


def test_small_budget_and_many_workers_give_the_same_checkpoint(saved, imported, tmp_path):
    ok("import", saved / "dcp", tmp_path / "small", "--workers", "3", "--memory-budget", "2KiB")
    assert len(json.loads(ok("inspect", tmp_path / "small", "--json"))["files"]) > 3
    code, out, err = ckptctl("diff", imported, tmp_path / "small")
    assert code == 0, out + err


def test_megatron_torch_dist_keeps_metadata_json_and_common_pt(tmp_path):
    failure = run_ranks(2, "megatron-save", str(tmp_path / "meg"))
    assert not failure, failure
    assert sorted(os.listdir(tmp_path / "meg"))[-2:] == ["common.pt", "metadata.json"]
    ok("import", "--from", "dcp", tmp_path / "meg", tmp_path / "ckpt")
    manifest = json.loads(ok("inspect", tmp_path / "ckpt", "--json"))
    assert manifest["step"] == 7  # common.pt's iteration, read weights-only
    meta = manifest["user_metadata"]
    assert meta["format"] == "torch_dist"
    assert json.loads(meta["megatron.metadata_json"])["sharded_backend"] == "torch_dist"
    ok("export", "--to", "dcp", tmp_path / "ckpt", tmp_path / "back")
    for name in ("common.pt", "metadata.json"):
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "meg" / name).read_bytes()
    assert torch.load(tmp_path / "back" / "common.pt", weights_only=True)["iteration"] == 7
    full = dcp_fixtures.full_state()
    state = {"decoder.w": torch.zeros(12, 6), "decoder.b": torch.zeros(8, 5,
                                                                       dtype=torch.bfloat16)}
    dcp.load(state, checkpoint_id=str(tmp_path / "back"), no_dist=True)
    assert dcp_fixtures.same_bits(state["decoder.w"], full["model.embed"][:12])
    assert dcp_fixtures.same_bits(state["decoder.b"], full["model.layers.0.w"][:, :5])
    code, out, err = ckptctl("diff", tmp_path / "meg", tmp_path / "back")
    assert code == 0, out + err


# ------------------------------------------------------------------------------- refusals


def copy_dcp(src, dst):
    os.mkdir(dst)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
            g.write(f.read())


def assert_refused(src, dest_parent, message_parts):
    code, out, err = ckptctl("import", "--from", "dcp", src, dest_parent / "ckpt")
    assert code == 1, out + err
    assert len(err.strip().splitlines()) == 1, err
    for part in message_parts:
        assert part in err, err
    assert sorted(os.listdir(dest_parent)) == [], "something was written at the destination"
    return err


def test_a_missing_distcp_file_is_refused_naming_it(saved, tmp_path):
    copy_dcp(saved / "dcp", tmp_path / "in")
    os.unlink(tmp_path / "in" / "__2_0.distcp")
    (tmp_path / "dest").mkdir()
    assert_refused(tmp_path / "in", tmp_path / "dest", ["__2_0.distcp", "No such file"])


def test_a_truncated_item_is_refused_naming_the_file(saved, tmp_path):
    copy_dcp(saved / "dcp", tmp_path / "in")
    path = tmp_path / "in" / "__3_0.distcp"
    os.truncate(path, os.path.getsize(path) - 100)
    (tmp_path / "dest").mkdir()
    assert_refused(tmp_path / "in", tmp_path / "dest", ["__3_0.distcp", "is truncated"])


def test_a_damaged_item_is_refused_naming_the_file_and_nothing_is_written(saved, tmp_path):
    copy_dcp(saved / "dcp", tmp_path / "in")
    md = FileSystemReader(str(tmp_path / "in")).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == "model.layers.0.w")
    path = tmp_path / "in" / info.relative_path
    raw = bytearray(path.read_bytes())
    raw[info.offset + 40: info.offset + 90] = b"\xff" * 50  # inside the archive's headers
    path.write_bytes(bytes(raw))
    (tmp_path / "dest").mkdir()
    err = assert_refused(tmp_path / "in", tmp_path / "dest",
                         [info.relative_path, "model.layers.0.w"])
    assert "does not load" in err or "is not a torch.save archive" in err


class RunsCode:
    """Unpickling this runs os.system: a .metadata must never do that."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("planted", ["os.system", "getattr"])
def test_metadata_naming_a_foreign_class_is_refused_without_running_it(saved, tmp_path,
                                                                       planted):
    copy_dcp(saved / "dcp", tmp_path / "in")
    md = FileSystemReader(str(tmp_path / "in")).read_metadata()
    marker = tmp_path / "ran"
    if planted == "os.system":
        md.planner_data = RunsCode(marker)
        expected = ["refusing to unpickle", "system"]
    else:  # builtins.getattr reaching past the enum it is admitted for
        md.planner_data = _GetattrEscape()
        expected = ["not a DCP enum member"]
    with open(tmp_path / "in" / ".metadata", "wb") as f:
        pickle.dump(md, f)
    (tmp_path / "dest").mkdir()
    assert_refused(tmp_path / "in", tmp_path / "dest", [".metadata"] + expected)
    assert not marker.exists()
    with pytest.raises(dcp_metadata.MetadataError):
        dcp_metadata.load_metadata(str(tmp_path / "in" / ".metadata"))


class _GetattrEscape:
    def __reduce__(self):
        return (getattr, (torch.Size, "__init__"))


def test_existing_destinations_are_left_alone(imported, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    code, _, err = ckptctl("export", "--to", "dcp", imported, tmp_path / "out")
    assert code == 1 and "already exists" in err
    assert os.listdir(tmp_path / "out") == ["keep"]
    code, _, err = ckptctl("import", "--from", "dcp", imported, tmp_path / "out")
    assert code == 1 and ".metadata" in err  # a ckpt checkpoint is not a DCP directory


def test_the_module_is_the_same_entry_point(saved, tmp_path):
    tensors = interop_dcp.import_dcp(str(saved / "dcp"), str(tmp_path / "ckpt"), log=lambda _: 0)
    assert len(tensors) == 11
    interop_dcp.export_dcp(str(tmp_path / "ckpt"), str(tmp_path / "out"), log=lambda _: 0)
    assert_plain_load_is_exact(tmp_path / "out")
