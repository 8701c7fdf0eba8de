"""The DCP usages issue 41 lists, one test each, in the shape of PyTorch's DCP suite
(torch.testing._internal's DTensorTestBase: 2 spawned gloo ranks on the CPU, with_temp_dir's
existing empty directory). Written for this project; run by tools/dcp_suite/run.py like the
suite itself (`run --tests tools/dcp_suite/probes`): in "dcp" mode against
torch.distributed.checkpoint, in "ckpt" mode with its entry points replaced by ckpt.torch's.
Every test checks values, not just that nothing raised."""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    DTensorTestBase,
    with_comms,
)
from torch.testing._internal.distributed.checkpoint_utils import with_temp_dir


def _full():
    return torch.arange(24, dtype=torch.float32).reshape(6, 4)


class Holder:
    """A Stateful app state (DCP calls state_dict() / load_state_dict())."""

    def __init__(self, value):
        self.w = torch.full((3,), float(value))

    def state_dict(self):
        return {"w": self.w}

    def load_state_dict(self, state):
        self.w = state["w"].clone()


class DCPUsageProbes(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    def _mesh(self):
        return dist.device_mesh.init_device_mesh(self.device_type, (self.world_size,))

    @with_comms
    @with_temp_dir
    def test_save_into_the_existing_empty_temp_dir_and_reshard(self):
        """with_temp_dir hands an existing, empty directory (issue item 1)."""
        mesh = self._mesh()
        dcp.save({"t": distribute_tensor(_full(), mesh, [Shard(0)])}, checkpoint_id=self.temp_dir)
        target = {"t": distribute_tensor(torch.zeros(6, 4), mesh, [Replicate()])}
        dcp.load(target, checkpoint_id=self.temp_dir)
        self.assertEqual(target["t"].to_local(), _full())

    @with_comms
    @with_temp_dir
    def test_save_to_a_new_subdirectory_and_reshard_rows_to_columns(self):
        mesh = self._mesh()
        path = os.path.join(self.temp_dir, "step1")
        dcp.save({"t": distribute_tensor(_full(), mesh, [Shard(0)]), "step": 3},
                 checkpoint_id=path)
        target = {"t": distribute_tensor(torch.zeros(6, 4), mesh, [Shard(1)]), "step": 0}
        dcp.load(target, checkpoint_id=path)
        self.assertEqual(target["t"].full_tensor(), _full())
        self.assertEqual(target["step"], 3)

    @with_comms
    @with_temp_dir
    def test_default_planners_are_accepted(self):
        """Issue item 3."""
        path = os.path.join(self.temp_dir, "p")
        dcp.save({"a": torch.ones(4)}, checkpoint_id=path, planner=DefaultSavePlanner())
        target = {"a": torch.zeros(4)}
        dcp.load(target, checkpoint_id=path, planner=DefaultLoadPlanner())
        self.assertEqual(target["a"], torch.ones(4))

    @with_comms
    @with_temp_dir
    def test_allow_partial_load_loads_a_subset(self):
        path = os.path.join(self.temp_dir, "p")
        dcp.save({"a": torch.ones(4), "b": torch.ones(2)}, checkpoint_id=path)
        target = {"a": torch.zeros(4), "c": torch.zeros(1)}
        dcp.load(target, checkpoint_id=path,
                 planner=DefaultLoadPlanner(allow_partial_load=True))
        self.assertEqual(target["a"], torch.ones(4))

    @with_comms
    @with_temp_dir
    def test_old_names_with_storage_objects(self):
        """save_state_dict / load_state_dict with FileSystemWriter / Reader (issue item 5)."""
        path = os.path.join(self.temp_dir, "old")
        dcp.save_state_dict({"a": torch.arange(5)}, storage_writer=dcp.FileSystemWriter(path))
        target = {"a": torch.zeros(5, dtype=torch.int64)}
        dcp.load_state_dict(target, storage_reader=dcp.FileSystemReader(path))
        self.assertEqual(target["a"], torch.arange(5))

    @with_comms
    @with_temp_dir
    def test_stateful_values_round_trip(self):
        """Issue item 0."""
        path = os.path.join(self.temp_dir, "s")
        dcp.save({"app": Holder(7)}, checkpoint_id=path)
        other = Holder(0)
        dcp.load({"app": other}, checkpoint_id=path)
        self.assertEqual(other.w, torch.full((3,), 7.0))

    @with_comms
    @with_temp_dir
    def test_async_save_future_then_load(self):
        path = os.path.join(self.temp_dir, "async")
        value = torch.arange(8, dtype=torch.float32)
        future = dcp.async_save({"v": value}, checkpoint_id=path)
        future.result()
        target = {"v": torch.zeros(8)}
        dcp.load(target, checkpoint_id=path)
        self.assertEqual(target["v"], torch.arange(8, dtype=torch.float32))

    @with_comms
    @with_temp_dir
    def test_sharded_tensor_round_trip(self):
        """torch.distributed._shard's ShardedTensor (issue item 2)."""
        from torch.distributed._shard import sharded_tensor
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec

        spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(2)])
        st = sharded_tensor.zeros(spec, 4, 3)
        st.local_shards()[0].tensor.fill_(self.rank + 1)
        path = os.path.join(self.temp_dir, "st")
        dcp.save({"st": st}, checkpoint_id=path)
        target = {"st": sharded_tensor.zeros(spec, 4, 3)}
        dcp.load(target, checkpoint_id=path)
        self.assertEqual(target["st"].local_shards()[0].tensor,
                         torch.full((2, 3), float(self.rank + 1)))

    @with_temp_dir
    def test_single_process_without_a_process_group(self):
        """no_dist: one process, no torch.distributed (issue item 5)."""
        path = os.path.join(self.temp_dir, "single")
        dcp.save({"a": torch.ones(3)}, checkpoint_id=path, no_dist=True)
        target = {"a": torch.zeros(3)}
        dcp.load(target, checkpoint_id=path, no_dist=True)
        self.assertEqual(target["a"], torch.ones(3))


if __name__ == "__main__":
    run_tests()
