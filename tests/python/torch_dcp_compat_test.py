"""ckpt.torch as a drop-in for torch.distributed.checkpoint (issue 41, items 1, 3 and 5) on one
rank in the test process (a 1-process gloo group), against real daemons and against DCP itself:
an existing empty directory as checkpoint_id, DCP's default planners and their options,
meta-device tensors, the older save_state_dict/load_state_dict names with FileSystemWriter/
Reader, partial loads in any key order (no_dist and process_group=: torch_dcp_ranks_test),
async_save's stager and executor options; each option
ckpt cannot honour is refused naming it. Values are compared bit for bit."""

import os
import re
import tempfile
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

import ckpt
import ckpt.torch
import rank_threads  # beside this file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 1, torch_job="torch-dcp-compat")


def fresh_path(cluster, name):
    return os.path.join(cluster.root, f"{name}-{uuid.uuid4().hex[:8]}")


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)},
            "emb": torch.randint(-100, 100, (4, 6), generator=g, dtype=torch.int64),
            "step": 7 + seed, "name": f"run-{seed}"}


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    return type(sd)() if isinstance(sd, (int, str)) else None


def assert_same(got, want, where="sd"):
    if isinstance(want, dict):
        assert set(got) == set(want), (where, sorted(got), sorted(want))
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got, want), f"{where}: values differ"
    else:
        assert got == want, (where, got, want)


# ---- item 1: an existing, empty directory as checkpoint_id -------------------------------------
def test_a_directory_made_by_mkdtemp_or_makedirs_is_saved_into_as_dcp_does(cluster):
    """Before: AlreadyExists ("planning failed") for any existing path."""
    want = state()
    made = tempfile.mkdtemp(dir=cluster.root, prefix="mkdtemp-")
    step_dir = fresh_path(cluster, "run") + "/step-100"
    os.makedirs(step_dir)
    for path in (made, step_dir):
        ckpt.torch.save(want, checkpoint_id=path)
        assert "manifest.pb" in os.listdir(path)
        assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")]
        got = zeros_like(want)
        ckpt.torch.load(got, checkpoint_id=path)
        assert_same(got, want)
    # DCP writes into the same kind of directory; its load gives the same values.
    dcp_dir = tempfile.mkdtemp(dir=cluster.root, prefix="dcp-")
    dcp.save(want, checkpoint_id=dcp_dir)
    from_dcp = zeros_like(want)
    dcp.load(from_dcp, checkpoint_id=dcp_dir)
    assert_same(from_dcp, want)


def test_a_directory_holding_anything_or_a_checkpoint_is_refused_naming_it(cluster):
    taken = tempfile.mkdtemp(dir=cluster.root, prefix="taken-")
    with open(os.path.join(taken, "notes.txt"), "w") as f:
        f.write("keep me")
    with pytest.raises(ckpt.AlreadyExists, match=r"taken-.* is not an empty directory "
                                                 r"\(it holds notes.txt\)"):
        ckpt.torch.save(state(), checkpoint_id=taken)
    assert os.listdir(taken) == ["notes.txt"]
    saved = fresh_path(cluster, "saved")
    ckpt.torch.save(state(0), checkpoint_id=saved)
    with pytest.raises(ckpt.AlreadyExists, match="holds a ckpt checkpoint; ckpt.torch.save "
                                                 "replaces one only with overwrite=True"):
        ckpt.torch.save(state(1), checkpoint_id=saved)
    got = zeros_like(state())
    ckpt.torch.load(got, checkpoint_id=saved)
    assert_same(got, state(0))


# ---- item 1: overwriting a ckpt checkpoint (overwrite=, FileSystemWriter.overwrite) ----------
def load_back(path):
    got = zeros_like(state())
    ckpt.torch.load(got, checkpoint_id=path)
    return got


def test_overwrite_or_a_filesystem_writers_overwrite_replaces_a_ckpt_checkpoint_bit_exact(cluster):
    """Before: every save over a ckpt checkpoint was refused (DCP's FileSystemWriter overwrites
    by default); a plain path still is, unless overwrite=True."""
    path = fresh_path(cluster, "over")
    ckpt.torch.save(state(0), checkpoint_id=path)
    ckpt.torch.save(state(1), checkpoint_id=path, overwrite=True)
    assert_same(load_back(path), state(1))
    # DCP's FileSystemWriter overwrites by default; the older name takes it too.
    ckpt.torch.save(state(2), storage_writer=dcp.FileSystemWriter(path))
    assert_same(load_back(path), state(2))
    ckpt.torch.save_state_dict(state(3), dcp.FileSystemWriter(path, thread_count=2))
    assert_same(load_back(path), state(3))
    ckpt.torch.async_save(state(4), checkpoint_id=path, overwrite=True).result(timeout=120)
    assert_same(load_back(path), state(4))
    # Refused without it, naming the path: FileSystemWriter(overwrite=False), a plain path.
    for kwargs in ({"storage_writer": dcp.FileSystemWriter(path, overwrite=False)},
                   {"checkpoint_id": path}):
        with pytest.raises(ckpt.AlreadyExists,
                           match=re.escape(path) + " holds a ckpt checkpoint"):
            ckpt.torch.save(state(5), **kwargs)
    assert_same(load_back(path), state(4))
    assert sorted(os.listdir(path)) == ["data", "manifest.pb"]
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")]


def test_overwrite_replaces_nothing_but_a_ckpt_checkpoint_naming_what_is_there(cluster):
    """A directory holding other files, a DCP checkpoint, or a manifest.pb that is no committed
    checkpoint: ckpt.FailedPrecondition naming the path, and it stays as it was."""
    other = tempfile.mkdtemp(dir=cluster.root, prefix="other-")
    with open(os.path.join(other, "notes.txt"), "w") as f:
        f.write("keep me")
    with pytest.raises(ckpt.FailedPrecondition, match=r"other-.* is not an empty directory "
                                                      r"\(it holds notes.txt\)"):
        ckpt.torch.save(state(), checkpoint_id=other, overwrite=True)
    assert os.listdir(other) == ["notes.txt"]
    dcp_dir = tempfile.mkdtemp(dir=cluster.root, prefix="dcp-over-")
    dcp.save(state(0), checkpoint_id=dcp_dir)
    before = sorted(os.listdir(dcp_dir))
    with pytest.raises(ckpt.FailedPrecondition, match="holds a DCP checkpoint"):
        ckpt.torch.save(state(1), storage_writer=dcp.FileSystemWriter(dcp_dir))
    assert sorted(os.listdir(dcp_dir)) == before
    # Past the check here, refused by the coordinator's guard (storage/overwrite_guard.h).
    fake = tempfile.mkdtemp(dir=cluster.root, prefix="fake-")
    with open(os.path.join(fake, "manifest.pb"), "wb") as f:
        f.write(b"not a manifest")
    with pytest.raises(ckpt.FailedPrecondition, match=r"fake-.*invalid checkpoint"):
        ckpt.torch.save(state(), checkpoint_id=fake, overwrite=True)
    assert os.listdir(fake) == ["manifest.pb"]
    assert not [n for n in os.listdir(cluster.root) if n.startswith(".")]


# ---- item 3: planners --------------------------------------------------------------------------
def test_dcps_default_planners_and_their_options_are_accepted(cluster):
    """Before: any planner was refused as "custom DCP planners are not supported"."""
    want = state(2)
    path = fresh_path(cluster, "planner")
    ckpt.torch.save(want, checkpoint_id=path,
                    planner=dcp.DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    got = zeros_like(want)
    ckpt.torch.load(got, checkpoint_id=path, planner=dcp.DefaultLoadPlanner())
    assert_same(got, want)
    # allow_partial_load: a key the checkpoint lacks is left as it is, as with DCP.
    dcp_path = fresh_path(cluster, "planner-dcp")
    dcp.save(want, checkpoint_id=dcp_path)
    results = []
    for load, where in ((ckpt.torch.load, path), (dcp.load, dcp_path)):
        partial = zeros_like(want)
        partial["extra"] = torch.full((2,), 5.0)
        load(partial, checkpoint_id=where, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        results.append(partial)
    assert_same(results[0], results[1])
    assert torch.equal(results[0]["extra"], torch.full((2,), 5.0))
    with pytest.raises(ckpt.NotFound, match="state-dict key extra is not in the checkpoint"):
        ckpt.torch.load({"extra": torch.zeros(2)}, checkpoint_id=path,
                        planner=dcp.DefaultLoadPlanner())


def test_a_custom_planner_is_refused_naming_its_class_before_anything_is_written(cluster):
    class MyPlanner(dcp.DefaultSavePlanner):
        pass

    path = fresh_path(cluster, "custom")
    with pytest.raises(ckpt.Unimplemented, match=r"planner=.*MyPlanner is not supported"):
        ckpt.torch.save(state(), checkpoint_id=path, planner=MyPlanner())
    assert not os.path.exists(path)
    ckpt.torch.save(state(), checkpoint_id=path)
    with pytest.raises(ckpt.Unimplemented, match=r"planner=.*_EmptyStateDictLoadPlanner"):
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

        ckpt.torch.load({}, checkpoint_id=path, planner=_EmptyStateDictLoadPlanner())


# ---- item 5: the rest of DCP's API -------------------------------------------------------------
def test_meta_tensors_are_replaced_by_loaded_ones_as_dcp_does(cluster):
    """Before: 'tensor model.w is on meta' (Unimplemented). DCP replaces a meta tensor with one
    on the process group's device (the CPU for gloo) and loads into it."""
    want = state(3)
    path = fresh_path(cluster, "meta")
    ckpt.torch.save(want, checkpoint_id=path)
    dcp_path = fresh_path(cluster, "meta-dcp")
    dcp.save(want, checkpoint_id=dcp_path)
    for load, where in ((ckpt.torch.load, path), (dcp.load, dcp_path)):
        model = {"w": torch.empty(5, 3, device="meta"), "b": torch.empty(3, device="meta")}
        sd = {"model": model, "emb": torch.empty(4, 6, dtype=torch.int64, device="meta"),
              "step": 0, "name": ""}
        load(sd, checkpoint_id=where)
        assert sd["model"] is model  # nested containers are filled in place
        assert sd["emb"].device.type == "cpu" and model["w"].device.type == "cpu"
        assert_same(sd, want)


def test_the_older_names_take_filesystem_writers_and_readers_as_dcp_does(cluster):
    want = state(4)
    path = fresh_path(cluster, "older")
    ckpt.torch.save_state_dict(want, dcp.FileSystemWriter(path, thread_count=2))
    got = zeros_like(want)
    ckpt.torch.load_state_dict(got, dcp.FileSystemReader(path))
    assert_same(got, want)
    other = fresh_path(cluster, "writer")
    ckpt.torch.save(want, storage_writer=dcp.FileSystemWriter(other))
    got = zeros_like(want)
    ckpt.torch.load(got, storage_reader=dcp.FileSystemReader(other))
    assert_same(got, want)


def test_other_storage_objects_and_stream_transforms_are_refused_naming_them(cluster):
    from torch.distributed.checkpoint._extension import ZStandard

    path = fresh_path(cluster, "storage")
    with pytest.raises(ckpt.Unimplemented, match="with _extensions"):
        zstd = ZStandard.__new__(ZStandard)  # its compressor module is not installed here
        ckpt.torch.save(state(), storage_writer=dcp.FileSystemWriter(path, _extensions=[zstd]))

    class MyWriter(dcp.FileSystemWriter):  # may write anywhere: its methods are its own
        pass

    with pytest.raises(ckpt.Unimplemented, match=r"storage_writer=.*MyWriter is not supported"):
        ckpt.torch.save(state(), storage_writer=MyWriter(path))
    with pytest.raises(ckpt.Unimplemented, match="use_collectives=False"):
        ckpt.torch.save(state(), checkpoint_id=path, use_collectives=False)
    assert not os.path.exists(path)


def test_a_subset_of_the_keys_in_another_order_is_loaded_as_dcp_loads_it(cluster):
    """Before: a checkpoint key the state dict lacks was InvalidArgument unless strict=False."""
    want = state(5)
    path = fresh_path(cluster, "subset")
    ckpt.torch.save(want, checkpoint_id=path)
    dcp_path = fresh_path(cluster, "subset-dcp")
    dcp.save(want, checkpoint_id=dcp_path)
    results = []
    for load, where in ((ckpt.torch.load, path), (dcp.load, dcp_path)):
        sd = {"step": 0, "model": {"b": torch.zeros(3)}}  # no emb, name or model.w
        load(sd, checkpoint_id=where)
        results.append(sd)
    assert_same(results[0], results[1])
    assert_same(results[0], {"step": want["step"], "model": {"b": want["model"]["b"]}})


@pytest.mark.parametrize("executor", [AsyncCheckpointerType.THREAD,
                                      AsyncCheckpointerType.PROCESS])
def test_async_save_takes_dcps_executor_and_stager_options(cluster, executor):
    """Before: async_checkpointer_type and async_stager were accepted and ignored, and an
    AsyncSaveResponse was never returned."""
    want = state(7)
    live = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in want.items()}
    live["model"] = {k: v.clone() for k, v in want["model"].items()}
    path = fresh_path(cluster, "async")
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                          use_async_staging=True, use_non_blocking_copy=False))
    response = ckpt.torch.async_save(live, checkpoint_id=path, async_checkpointer_type=executor,
                                     async_stager=stager)
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    assert isinstance(response, AsyncSaveResponse)
    assert response.staging_completion.done()  # the snapshot is taken before it returns
    live["model"]["w"].add_(1.0)
    response.upload_completion.result(timeout=60)
    got = zeros_like(want)
    ckpt.torch.load(got, checkpoint_id=path)
    assert_same(got, want)
    # Without a stager (or a synchronous one): a Future, as DCP returns.
    future = ckpt.torch.async_save(want, checkpoint_id=path + "-f",
                                   async_checkpointer_type=executor,
                                   async_stager=DefaultStager(StagingOptions(
                                       False, False, False, False)))
    future.result(timeout=60)


def test_a_custom_stager_is_refused_naming_its_class(cluster):
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    class MyStager(BlockingAsyncStager):
        pass

    path = fresh_path(cluster, "stager")
    with pytest.raises(ckpt.Unimplemented, match=r"async_stager=.*MyStager is not supported"):
        ckpt.torch.async_save(state(), checkpoint_id=path, async_stager=MyStager())
    assert not os.path.exists(path)
