#include "client/state_dict.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "device/gpu.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

bool SegmentExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TensorDeclaration Spec(const std::string& key, std::vector<int64_t> shape) {
  TensorDeclaration s;
  s.key = key;
  s.dtype = DType::kBF16;
  s.global_shape = std::move(shape);
  return s;
}

TEST(StateDictTest, RegionTensorIsZeroFilledSharedMemoryNamedForJobRankAndPid) {
  std::string segment;
  {
    StateDict state("my job/1", 3);
    TensorDeclaration s = Spec("layers.0.w", {8, 4});
    s.layout = Region{{4, 0}, {4, 4}, std::nullopt};
    s.replica_id = {1};
    auto t = state.AddHost(s);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->nbytes, 4 * 4 * 2);
    for (std::byte b : (*t)->bytes()) ASSERT_EQ(b, std::byte{0});
    segment = (*t)->segment;
    EXPECT_TRUE(absl::StartsWith(segment, absl::StrCat("/ckpt.my_job_1.r3.p", getpid(), ".")))
        << segment;
    EXPECT_TRUE(SegmentExists(segment));
    auto described = state.Describe();
    ASSERT_EQ(described.size(), 1u);
    const pb::SharedTensor& d = described[0];
    EXPECT_EQ(d.shard().tensor().key(), "layers.0.w");
    EXPECT_EQ(d.shard().tensor().dtype(), pb::DTYPE_BF16);
    EXPECT_THAT(d.shard().region().offsets(), ElementsAre(4, 0));
    EXPECT_THAT(d.shard().region().lengths(), ElementsAre(4, 4));
    EXPECT_FALSE(d.shard().region().has_flat());
    EXPECT_THAT(d.shard().replica_id(), ElementsAre(1));
    EXPECT_EQ(d.memory_kind(), pb::MEMORY_HOST);
    EXPECT_EQ(d.segment(), segment);
    EXPECT_EQ(d.nbytes(), 32);
  }
  EXPECT_FALSE(SegmentExists(segment));  // released with the state dict
}

TEST(StateDictTest, SmallTensorsShareAnArenaAndLargeOnesGetTheirOwnSegment) {
  StateDict state("j", 0);
  std::vector<StateTensor*> small;
  for (int i = 0; i < 3; ++i) {
    TensorDeclaration s = Spec(absl::StrCat("small", i), {3, 5});  // 30 bytes: offsets 64 apart
    s.layout = Region{{0, 0}, {3, 5}, std::nullopt};
    auto t = state.AddHost(s);
    ASSERT_TRUE(t.ok()) << t.status();
    small.push_back(*t);
  }
  TensorDeclaration big = Spec("big", {int64_t{5} << 20});  // 10 MiB of BF16
  big.layout = Region{{0}, {int64_t{5} << 20}, std::nullopt};
  auto b = state.AddHost(big);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(small[0]->segment, small[2]->segment);
  EXPECT_NE((*b)->segment, small[0]->segment);
  EXPECT_EQ((*b)->segment_offset, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(small[i]->segment_offset, 64 * i);
    EXPECT_EQ(small[i]->data, small[0]->data + 64 * i);
    std::memset(small[i]->data, i + 1, small[i]->nbytes);  // no tensor overlaps another
  }
  for (int i = 0; i < 3; ++i) {
    for (std::byte v : small[i]->bytes()) ASSERT_EQ(v, std::byte(i + 1));
  }
  auto d = state.Describe();
  EXPECT_EQ(d[1].offset(), 64);
  EXPECT_EQ(d[1].segment(), small[0]->segment);
}

TEST(StateDictTest, FlatRangeCoversPartOfTheWholeTensor) {
  StateDict state("j", 0);
  TensorDeclaration s = Spec("optim.exp_avg", {10, 10});
  s.dtype = DType::kF32;
  s.layout = FlatRange{30, 55};
  auto t = state.AddHost(s);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->nbytes, 25 * 4);
  EXPECT_THAT((*t)->region.lengths, ElementsAre(10, 10));
  ASSERT_TRUE((*t)->region.flat.has_value());
  EXPECT_EQ((*t)->region.flat->start, 30);
  auto d = state.Describe();
  EXPECT_EQ(d[0].shard().region().flat().stop(), 55);
}

TEST(StateDictTest, DTensorPlacementGivesTorchChunkPieceAndReplicaId) {
  StateDict state("j", 3);
  TensorDeclaration s = Spec("emb", {5, 6});
  // Mesh (2, 2): rank 3 is coordinate (1, 1); Shard(0) over dim 0 of 5 rows -> rows [3, 5);
  // Replicate() over mesh dim 1 -> replica id [1].
  s.layout = DTensorLayout{{2, 2}, {Placement::Shard(0), Placement::Replicate()}};
  auto t = state.AddHost(s);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT((*t)->region.offsets, ElementsAre(3, 0));
  EXPECT_THAT((*t)->region.lengths, ElementsAre(2, 6));
  EXPECT_THAT((*t)->replica_id, ElementsAre(1));
  EXPECT_EQ((*t)->nbytes, 2 * 6 * 2);
}

TEST(StateDictTest, DTensorReplicaIdAppendsTheSpecsIdForCopiesOfTheMesh) {
  TensorDeclaration s = Spec("emb", {4, 6});
  s.layout = DTensorLayout{{2}, {Placement::Replicate()}, /*mesh_rank=*/1};
  s.replica_id = {3};  // the fourth copy of this 2-rank mesh in the job
  auto resolved = ResolveLayout(s, /*rank=*/7);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_THAT(resolved->second, ElementsAre(1, 3));
  s.replica_id = {};
  EXPECT_THAT(ResolveLayout(s, 7)->second, ElementsAre(1));
}

TEST(StateDictTest, EmptyDTensorShardHasNoBytes) {
  StateDict state("j", 3);
  TensorDeclaration s = Spec("tiny", {2});
  s.layout = DTensorLayout{{4}, {Placement::Shard(0)}};
  auto t = state.AddHost(s);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->nbytes, 0);
  EXPECT_THAT((*t)->region.offsets, ElementsAre(2));  // PyTorch's out-of-bounds offset
}

TEST(StateDictTest, RejectsDuplicateKeysAndBadLayoutsNamingTheKey) {
  StateDict state("j", 0);
  TensorDeclaration s = Spec("w", {4});
  s.layout = Region{{0}, {4}, std::nullopt};
  ASSERT_TRUE(state.AddHost(s).ok());
  EXPECT_EQ(state.AddHost(s).status().code(), absl::StatusCode::kAlreadyExists);
  TensorDeclaration bad = Spec("v", {4});
  bad.layout = Region{{2}, {4}, std::nullopt};
  auto r = state.AddHost(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("tensor v"));
  TensorDeclaration bad_mesh = Spec("m", {4});
  bad_mesh.layout = DTensorLayout{{2}, {Placement::Shard(3)}};
  EXPECT_THAT(state.AddHost(bad_mesh).status().message(), HasSubstr("tensor m"));
  EXPECT_EQ(state.tensors().size(), 1u);
  EXPECT_NE(state.Find("w"), nullptr);
  EXPECT_EQ(state.Find("v"), nullptr);
}

// Several shards of one tensor on one rank (a ShardedTensor's ChunkShardingSpec placing two
// chunks on it): each is a piece of its own under the same key.
TEST(StateDictTest, AddsDisjointPiecesOfOneKeyAndRefusesOverlapsOrAnotherShapeNamingThem) {
  StateDict state("j", 0);
  TensorDeclaration first = Spec("w", {8, 3});
  first.layout = Region{{0, 0}, {2, 3}, std::nullopt};
  TensorDeclaration second = first;
  second.layout = Region{{6, 0}, {2, 3}, std::nullopt};
  ASSERT_TRUE(state.AddHost(first).ok());
  auto t = state.AddHost(second);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT((*t)->region.offsets, ElementsAre(6, 0));
  EXPECT_EQ(state.tensors().size(), 2u);
  EXPECT_EQ(state.Describe().size(), 2u);
  EXPECT_THAT(state.Find("w")->region.offsets, ElementsAre(0, 0));  // the first piece
  TensorDeclaration overlapping = first;
  overlapping.layout = Region{{1, 0}, {2, 3}, std::nullopt};
  auto o = state.AddHost(overlapping);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(o.status().message(), HasSubstr("tensor w region"));
  EXPECT_THAT(o.status().message(), HasSubstr("rank 0"));
  TensorDeclaration other_shape = Spec("w", {9, 3});
  other_shape.layout = Region{{8, 0}, {1, 3}, std::nullopt};
  auto b = state.AddHost(other_shape);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("(8, 3)"));
  EXPECT_EQ(state.tensors().size(), 2u);
}

TEST(StateDictTest, HostViewUsesAllocatedSharedMemoryInPlaceAndKeepsItAlive) {
  SharedAllocator allocator(absl::StrCat("/ckpt.viewtest.p", getpid(), "."));
  std::string name;
  {
    StateDict state("j", 0);
    {
      auto a = allocator.Allocate(4 * 2, "w");
      ASSERT_TRUE(a.ok());
      name = a->segment->name();
      TensorDeclaration s = Spec("w", {8});
      s.layout = Region{{4}, {4}, std::nullopt};
      auto t = state.AddHostView(s, a->segment, a->offset, 8);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ((*t)->data, a->data());
      EXPECT_EQ((*t)->segment, name);
      EXPECT_EQ((*t)->segment_offset, a->offset);
    }
    // The allocation is gone; the state dict still holds the segment.
    EXPECT_TRUE(SegmentExists(name));
    auto described = state.Describe();
    ASSERT_EQ(described.size(), 1u);
    EXPECT_EQ(described[0].segment(), name);
    EXPECT_EQ(described[0].nbytes(), 8);
  }
  EXPECT_FALSE(SegmentExists(name));
}

TEST(StateDictTest, HostViewRefusesMemoryOfTheWrongSizeNamingTheKey) {
  SharedAllocator allocator(absl::StrCat("/ckpt.viewtest.p", getpid(), "."));
  auto a = allocator.Allocate(16, "w");
  ASSERT_TRUE(a.ok());
  StateDict state("j", 0);
  TensorDeclaration s = Spec("layers.1.w", {8});
  s.layout = Region{{0}, {8}, std::nullopt};
  auto wrong = state.AddHostView(s, a->segment, a->offset, 10);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("layers.1.w"));
  auto outside = state.AddHostView(s, a->segment, SharedAllocator::kArenaBytes - 8, 16);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.status().message(), HasSubstr("outside segment"));
  EXPECT_TRUE(state.tensors().empty());
}

TEST(StateDictTest, DeviceTensorsNeedAGpu) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present; covered by GPU tests";
  StateDict state("j", 0);
  TensorDeclaration s = Spec("w", {4});
  s.layout = Region{{0}, {4}, std::nullopt};
  int fake = 0;
  auto r = state.AddDevice(s, &fake, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("tensor w"));
  EXPECT_THAT(r.status().message(), HasSubstr("CUDA"));
}

}  // namespace
TEST(StateDictTest, LendingMarksWhatTheSaveMayWriteInPlace) {
  StateDict state("lend", 0);
  auto whole = [](const std::string& key) {
    TensorDeclaration s = Spec(key, {4});
    s.layout = Region{{0}, {4}, std::nullopt};
    return s;
  };
  auto staging = state.AddHost(whole("staging"));
  ASSERT_TRUE(staging.ok()) << staging.status();
  (*staging)->lent_until_durable = true;  // a binding's own staging buffer
  ASSERT_TRUE(state.AddHost(whole("trainers")).ok());
  auto lent = [&](Lending lending) {
    std::vector<bool> out;
    for (const pb::SharedTensor& t : state.Describe(lending)) out.push_back(t.lent_until_durable());
    return out;
  };
  EXPECT_EQ(lent(Lending::kNone), (std::vector<bool>{false, false}));
  EXPECT_EQ(lent(Lending::kMarkedTensors), (std::vector<bool>{true, false}));
  EXPECT_EQ(lent(Lending::kAllHostTensors), (std::vector<bool>{true, true}));
}

}  // namespace ckpt::client
