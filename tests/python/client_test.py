"""The low-level Python API (ckpt.Client, state dicts, layouts, ckpt.empty) against real
daemons started by ckpt.LocalCluster. Ranks of one job run as threads of this process (each
with its own Client and worker session): the GIL is released while they wait for each other."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import ckpt
import rank_threads  # beside this file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from rank_threads.local_cluster(tmp_path_factory, 2)


def ranks(world, body, job):
    return rank_threads.ranks(world, body, job)


def test_zero_copy_staged_and_numpy_tensors_round_trip(cluster):
    path = os.path.join(cluster.root, "round-trip")
    shared = ckpt.empty(4, 4, dtype=torch.bfloat16)
    shared.copy_(torch.arange(16).view(4, 4))
    plain = torch.arange(10, dtype=torch.int64)
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert ckpt.is_shared(shared) and not ckpt.is_shared(plain) and not ckpt.is_shared(array)
    with ckpt.Client(job="round-trip", rank=0, world_size=1, local_rank=0) as client:
        assert client.launcher == "explicit"
        state = client.state_dict()
        state.add("shared", shared).add("plain", plain).add("array", array, ckpt.Replicated())
        assert state.shared_bytes == 32 and state.staged_bytes == 80 + 48
        handle = client.save(path, state, metadata={"step": 7})
        handle.wait(timeout=60)
        progress = handle.progress()
        assert progress.phase == "done" and progress.error is None
        assert progress.staged_bytes == 128 and progress.shared_bytes == 32
        shared.zero_()
        plain.zero_()
        array[...] = 0
        client.load(path, state)
    assert torch.equal(shared, torch.arange(16).view(4, 4).to(torch.bfloat16))
    assert torch.equal(plain, torch.arange(10))
    assert np.array_equal(array, np.arange(6, dtype=np.float64).reshape(2, 3))
    manifest = ckpt.read_manifest(path)
    assert manifest["tensors"]["shared"] == ("BF16", [4, 4]) and manifest["step"] == 7


def test_snapshot_holds_the_values_at_save_while_the_tensors_change(cluster):
    path = os.path.join(cluster.root, "snapshot")
    shared = ckpt.empty(1 << 16, dtype=torch.float32)
    shared.fill_(1.0)
    plain = torch.full((1 << 16,), 2.0)
    with ckpt.Client(job="snapshot", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict().add("shared", shared).add("plain", plain)
        handle = client.save(path, state)
        shared.fill_(-1.0)  # right after the snapshot, before the commit
        plain.fill_(-2.0)
        handle.wait(60)
        client.load(path, state)
    assert bool((shared == 1.0).all()) and bool((plain == 2.0).all())
    # The staging of `plain` was lent (written in place), ckpt.empty memory copied by the worker.
    assert handle.lent_bytes == 4 << 16 and handle.worker_copied_bytes == 4 << 16


def test_staging_is_lent_not_copied_and_lend_true_lends_everything(cluster):
    path = os.path.join(cluster.root, "lent")
    shared = ckpt.empty(1 << 10, dtype=torch.float32)
    shared.fill_(3.0)
    plain = torch.full((1 << 12,), 4.0)
    with ckpt.Client(job="lent", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict().add("shared", shared).add("plain", plain)
        handle = client.save(path + "-a", state)
        assert (handle.worker_copied_bytes, handle.lent_bytes) == (4 << 10, 4 << 12)
        handle.wait(60)
        p = handle.progress()
        assert (p.worker_copied_bytes, p.lent_bytes, p.device_bytes) == (4 << 10, 4 << 12, 0)
        assert (p.snapshot_waited_for_writes, p.bytes_written_before_snapshot) == (False, 0)
        blocking = client.save(path + "-b", state, lend=True)  # nothing is copied by the worker
        assert (blocking.worker_copied_bytes, blocking.lent_bytes) == (0, (4 << 10) + (4 << 12))
        blocking.wait(60)
        shared.zero_()
        plain.zero_()
        client.load(path + "-b", state)
    assert bool((shared == 3.0).all()) and bool((plain == 4.0).all())


def test_a_second_save_of_lent_staging_waits_for_the_first_to_end(cluster):
    path = os.path.join(cluster.root, "busy")
    plain = torch.full((1 << 16,), 5.0)
    with ckpt.Client(job="busy", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict().add("plain", plain)
        first = client.save(path + "-1", state)
        assert first.lent_bytes == 4 << 16
        plain.fill_(6.0)
        second = client.save(path + "-2", state)  # restages only after the first ended
        assert first.progress().phase == "done"
        second.wait(60)
        plain.zero_()
        client.load(path + "-1", state)
        assert bool((plain == 5.0).all())
        client.load(path + "-2", state)
        assert bool((plain == 6.0).all())


def test_box_flat_and_dtensor_layouts_reshard_between_two_ranks(cluster):
    path = os.path.join(cluster.root, "layouts")
    full = torch.arange(6 * 5, dtype=torch.float32).view(6, 5)

    def save(client):
        r = client.rank
        state = client.state_dict()
        state.add("box", full[3 * r:3 * r + 3].clone(), ckpt.Box((6, 5), (3 * r, 0)))
        state.add("flat", full.flatten()[r * 13:(r + 1) * 13 + 4 * r].clone(),
                  ckpt.Flat((6, 5), r * 13, (r + 1) * 13 + 4 * r))
        layout = ckpt.DTensor((6, 5), (2,), [ckpt.Shard(1)], (r,))
        region = ckpt.resolve(layout)
        state.add("dtensor", full[:, region.offsets[1]:region.offsets[1] + region.lengths[1]]
                  .clone(), layout)
        state.add("megatron", full.clone(), ckpt.Replicated(replica_id=(0, r)))
        client.save(path, state).wait(60)

    ranks(2, save, "layouts-save")

    def load(client):
        # Rank 0 reads everything as one box; rank 1 a flat range of the DTensor-saved one.
        state = client.state_dict()
        if client.rank == 0:
            out = {k: torch.zeros(6, 5) for k in ("box", "flat", "dtensor", "megatron")}
            for k, v in out.items():
                state.add(k, v, ckpt.Box((6, 5), (0, 0)))
        else:
            out = {k: torch.zeros(7) for k in ("box", "flat", "dtensor", "megatron")}
            for k, v in out.items():
                state.add(k, v, ckpt.Flat((6, 5), 20, 27))
        client.load(path, state)
        return out

    got = ranks(2, load, "layouts-load")
    for k in ("box", "flat", "dtensor", "megatron"):
        assert torch.equal(got[0][k], full), k
        assert torch.equal(got[1][k], full.flatten()[20:27]), k


def test_dtensor_region_follows_torch_chunk():
    # 5 rows over a (2, 2) mesh, rank (1, 1): rows [3, 5), replica 1 along the Replicate dim.
    region = ckpt.resolve(ckpt.DTensor((5, 6), (2, 2), [ckpt.Shard(0), ckpt.Replicate()], (1, 1)))
    assert region.offsets == (3, 0) and region.lengths == (2, 6) and region.replica_id == (1,)
    empty = ckpt.resolve(ckpt.DTensor((2,), (4,), [ckpt.Shard(0)], (3,)))
    assert empty.lengths == (0,) and empty.numel == 0


def test_errors_keep_the_status_code_and_message(cluster):
    with pytest.raises(ckpt.InvalidArgument, match="tensor w region"):
        ckpt.resolve(ckpt.Box((8, 4), (6, 0)), (4, 4), key="w")
    with ckpt.Client(job="errors", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict()
        with pytest.raises(ckpt.Unimplemented, match="tensor on_device is on meta"):
            state.add("on_device", torch.empty(3, device="meta"))
        state.add("w", torch.ones(3))
        with pytest.raises(ckpt.Error, match="already"):
            state.add("w", torch.ones(3))
        with pytest.raises(ckpt.NotFound):
            client.load(os.path.join(cluster.root, "never-saved"), state)
        with pytest.raises(ckpt.PermissionDenied, match="root"):
            client.save("/proc/outside-the-roots", state)
        with pytest.raises(ckpt.InvalidArgument, match="no main replica"):
            holey = client.state_dict().add("v", torch.ones(2), ckpt.Box((4,), (0,)))
            client.save(os.path.join(cluster.root, "holey"), holey)
    with pytest.raises(ckpt.DeadlineExceeded, match="cannot connect"):
        ckpt.Client(job="j", rank=0, world_size=1, worker_address="unix:/nonexistent.sock",
                    rpc_timeout=0.5)
    with pytest.raises(ckpt.InvalidArgument, match="missing rank"):
        ckpt.Client(worker_address="unix:/nonexistent.sock", rpc_timeout=0.5)


def test_overwrite_replaces_a_checkpoint_and_a_failed_overwrite_leaves_the_old_one(cluster):
    """Save with overwrite=True over a committed checkpoint (issue 41): the new values, bit for
    bit. An overwriting save the planner refuses (the ranks disagree on a shape), after the
    coordinator accepted the old checkpoint and made its staging directory, leaves the old one
    intact and nothing else beside it; without overwrite, ckpt.AlreadyExists."""
    path = os.path.join(cluster.root, "overwritten")

    def save(rows_by_rank, fill, overwrite):
        def body(client):
            rows = rows_by_rank[client.rank]
            w = torch.arange(rows * 2 * 3, dtype=torch.float32).view(rows * 2, 3) + fill
            mine = w[client.rank * rows:(client.rank + 1) * rows].clone()
            state = client.state_dict().add("w", mine, ckpt.Box((rows * 2, 3),
                                                                (client.rank * rows, 0)))
            client.save(path, state, overwrite=overwrite).wait(timeout=60)
        return body

    def load(rows):
        with ckpt.Client(job="ow-load", rank=0, world_size=1, local_rank=0) as client:
            w = torch.zeros(rows * 2, 3)
            client.load(path, client.state_dict().add("w", w))
        return w

    ranks(2, save((2, 2), 0.0, False), "ow")
    ranks(2, save((3, 3), 100.0, True), "ow")
    assert torch.equal(load(3), torch.arange(18, dtype=torch.float32).view(6, 3) + 100.0)
    with pytest.raises(ckpt.AlreadyExists, match=path):
        ranks(2, save((3, 3), 7.0, False), "ow")
    with pytest.raises(ckpt.Error, match="planning failed") as failed:
        ranks(2, save((4, 5), 9.0, True), "ow")
    assert "exists" not in str(failed.value)
    assert torch.equal(load(3), torch.arange(18, dtype=torch.float32).view(6, 3) + 100.0)
    assert not [n for n in os.listdir(cluster.root) if n.startswith(".overwritten")]
    with pytest.raises(ckpt.InvalidArgument, match="overwrite is for saves to storage"):
        ranks(1, lambda c: c.save("mem://ow", c.state_dict().add("w", torch.ones(2)),
                                  overwrite=True), "ow-mem")


def test_operator_requested_save_runs_at_the_next_poll(cluster):
    ckptctl = os.environ.get("CKPTCTL")
    if not ckptctl:
        pytest.skip("CKPTCTL (//tools:ckptctl) not given")
    path = os.path.join(cluster.root, "operator-save")
    values = torch.arange(5.0)
    with ckpt.Client(job="polled", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict().add("values", values)
        assert client.poll(state) is None
        operator = subprocess.Popen([ckptctl, "save", "--coordinator", cluster.address,
                                     "--job", "polled", path], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
        result = None
        while result is None and operator.poll() is None:
            result = client.poll(state)
        out = operator.communicate(timeout=60)[0].decode()
        assert operator.returncode == 0, out
        assert result is not None and result.kind == "save" and result.path == path
    assert ckpt.read_manifest(path)["tensors"]["values"] == ("F32", [5])


def test_local_cluster_names_a_missing_binary(tmp_path):
    with pytest.raises(ckpt.NotFound, match="ckpt_coordinator"):
        ckpt.cluster.find_binary("ckpt_coordinator", "nowhere", bin_dir=str(tmp_path))


def test_up_command_starts_daemons_for_a_command_and_stops_them(tmp_path):
    trainer = ("import ckpt, torch, os; c = ckpt.Client(job='up', rank=0, world_size=1); "
               "s = c.state_dict().add('x', torch.ones(3)); "
               f"c.save({str(tmp_path / 'by-up')!r}, s).wait(60); c.close(); "
               "print('saved via', os.environ['CKPT_WORKER_DIR'])")
    out = subprocess.run([sys.executable, "-m", "ckpt.up", "--workers", "1", "--root",
                          str(tmp_path), "--", sys.executable, "-c", trainer],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ckpt up: coordinator 127.0.0.1:" in out.stdout and "saved via /tmp/" in out.stdout
    assert ckpt.read_manifest(tmp_path / "by-up")["tensors"]["x"] == ("F32", [3])


def test_memory_save_persists_in_the_background_as_the_direct_save(cluster):
    """A memory save with persist_to: committed at the path by the worker holding it, with the
    values saved; a mem:// persist_to, one on a storage save, and negative replicas raise
    InvalidArgument naming the value."""
    persisted = os.path.join(cluster.root, "persisted")
    values = torch.arange(4096, dtype=torch.float32)
    with ckpt.Client(job="persist", rank=0, world_size=1, local_rank=0) as client:
        state = client.state_dict()
        state.add("w", values.clone())
        client.save("mem://py-persist", state, memory_replicas=0, persist_to=persisted).wait(60)
        manifest = os.path.join(persisted, "manifest.pb")
        deadline = time.monotonic() + 60
        while not os.path.exists(manifest):  # the commit renames the finished directory in
            assert time.monotonic() < deadline, "not persisted within 60 s"
            time.sleep(0.02)
        loaded = client.state_dict()
        target = torch.zeros(4096, dtype=torch.float32)
        loaded.add("w", target)
        client.load(persisted, loaded)
        assert torch.equal(target, values)
        for kwargs, named in (({"persist_to": "mem://elsewhere"}, "mem://elsewhere"),
                              ({"memory_replicas": -2}, "-2")):
            with pytest.raises(ckpt.errors.InvalidArgument, match=named):
                client.save("mem://py-refused", state, **kwargs)
        with pytest.raises(ckpt.errors.InvalidArgument, match="only for memory saves"):
            client.save(os.path.join(cluster.root, "plain"), state, persist_to=persisted + "2")


def test_groups_keyword_saves_and_loads_within_each_group(cluster):
    path = os.path.join(cluster.root, "grouped")
    full = torch.arange(4 * 6, dtype=torch.int32).view(4, 6)

    def save(client):
        # Both ranks replicate "w" (rank 0 the main replica) and each holds half of "v".
        r = client.rank
        state = client.state_dict()
        state.add("w", full.clone(), ckpt.Replicated(replica_id=(r,)))
        state.add("v", full[2 * r:2 * r + 2].clone(), ckpt.Box((4, 6), (2 * r, 0)))
        client.save(path, state, groups=[[0], [1]]).wait(60)

    ranks(2, save, "groups-save")

    def load(client):
        # Groups of one rank: rank 1's group holds no main replica of "w" (a cross-group
        # piece) and reads it from storage itself; nothing is exchanged between the ranks.
        state = client.state_dict()
        out = {"w": torch.zeros(4, 6, dtype=torch.int32), "v": torch.zeros(4, 6, dtype=torch.int32)}
        state.add("w", out["w"], ckpt.Replicated(replica_id=(client.rank,)))
        state.add("v", out["v"], ckpt.Box((4, 6), (0, 0)))
        client.load(path, state, algorithm="broadcast", groups="read-groups:1")
        return out

    for got in ranks(2, load, "groups-load"):
        assert torch.equal(got["w"], full) and torch.equal(got["v"], full)


def test_groups_that_do_not_partition_the_ranks_raise_invalid_argument(cluster):
    def save(client):
        state = client.state_dict()
        state.add("w", torch.ones(2), ckpt.Box((4,), (2 * client.rank,)))
        with pytest.raises(ckpt.InvalidArgument, match="process group 1 names rank 5"):
            client.save(os.path.join(cluster.root, "bad-groups"), state, groups=[[0], [5]])

    ranks(2, save, "groups-bad")


def test_a_shared_tensor_outlives_its_client_and_serves_the_next_one(cluster):
    """A client's goodbye leaves ckpt.empty memory to the process: the next Client registers it
    again (the worker used to unlink its name at the goodbye, so this failed with NotFound)."""
    shared = ckpt.empty(1024, dtype=torch.float32)
    for i in range(2):
        shared.fill_(i)
        with ckpt.Client(job=f"outlives-{i}", rank=0, world_size=1, local_rank=0) as client:
            state = client.state_dict()
            state.add("w", shared)
            client.save(os.path.join(cluster.root, f"outlives-{i}"), state).wait(60)
    with ckpt.Client(job="outlives-check", rank=0, world_size=1, local_rank=0) as client:
        target = torch.full((1024,), -1.0)
        state = client.state_dict()
        state.add("w", target)
        client.load(os.path.join(cluster.root, "outlives-1"), state)
        assert torch.equal(target, torch.ones(1024))
