#include "coordinator/operation_planners.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

pb::PieceMeta Shard(const std::string& key, std::vector<int64_t> shape,
                    std::vector<int64_t> offsets, std::vector<int64_t> lengths,
                    std::vector<int64_t> replica_id = {}) {
  pb::PieceMeta s;
  s.mutable_tensor()->set_key(key);
  s.mutable_tensor()->set_dtype(pb::DTYPE_F32);
  for (int64_t d : shape) s.mutable_tensor()->add_global_shape(d);
  for (int64_t o : offsets) s.mutable_region()->add_offsets(o);
  for (int64_t l : lengths) s.mutable_region()->add_lengths(l);
  for (int64_t r : replica_id) s.add_replica_id(r);
  return s;
}

// Two ranks: "w" split by rows (TP), "norm" replicated (rank 1 holds replica 1).
Operation TwoRankOperation() {
  Operation op;
  op.id = "op-1";
  op.world_size = 2;
  op.ranks.resize(2);
  op.ranks[0].shards = {Shard("norm", {8}, {0}, {8}, {0}), Shard("w", {4, 8}, {0, 0}, {2, 8})};
  op.ranks[1].shards = {Shard("w", {4, 8}, {2, 0}, {2, 8}), Shard("norm", {8}, {0}, {8}, {1})};
  return op;
}

TEST(PlanSaveTest, EveryMainReplicaIsWrittenOnceByARankHoldingIt) {
  const Operation op = TwoRankOperation();
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 2u);
  int64_t total = 0;
  std::map<std::string, int> writes;
  for (int r = 0; r < 2; ++r) {
    pb::SavePlanPart part;
    ASSERT_TRUE(part.ParseFromString((*plans)[r].part.Bytes()));
    EXPECT_EQ(part.rank(), r);
    EXPECT_EQ(part.total_bytes(), (*plans)[r].bytes);
    total += part.total_bytes();
    for (const pb::PlanFile& f : part.files()) {
      for (const pb::PlanPiece& p : f.pieces()) {
        // Named by local_index alone: the writer's own copy in its gathered shards, whole.
        EXPECT_TRUE(p.key().empty()) << p.DebugString();
        EXPECT_FALSE(p.has_region());
        ASSERT_GE(p.local_index(), 0);
        ASSERT_LT(p.local_index(), op.ranks[r].shards.size());
        const pb::PieceMeta& own = op.ranks[r].shards[p.local_index()];
        ++writes[own.tensor().key() + "@" + std::to_string(own.region().offsets(0))];
        EXPECT_EQ(p.size_bytes(),
                  own.region().lengths(0) *
                      (own.region().lengths_size() > 1 ? own.region().lengths(1) : 1) * 4);
      }
    }
  }
  EXPECT_EQ(total, (4 * 8 + 8) * 4);  // every element once
  EXPECT_EQ(writes, (std::map<std::string, int>{{"norm@0", 1}, {"w@0", 1}, {"w@2", 1}}));
}

TEST(PlanSaveTest, OverlappingMainReplicasAreALayoutErrorNamingTheTensor) {
  Operation op = TwoRankOperation();
  std::vector<pb::PieceMeta> pieces = op.ranks[1].shards.Pieces();
  pieces[0] = Shard("w", {4, 8}, {1, 0}, {3, 8});  // overlaps rank 0's rows
  op.ranks[1].shards = RankPieces(pieces);
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op);
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plans.status().message(), HasSubstr("w"));
}

TEST(PlanSaveTest, UnspecifiedDTypeNamesRankAndKey) {
  Operation op = TwoRankOperation();
  std::vector<pb::PieceMeta> pieces = op.ranks[1].shards.Pieces();
  pieces[1].mutable_tensor()->set_dtype(pb::DTYPE_UNSPECIFIED);
  op.ranks[1].shards = RankPieces(pieces);
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op);
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plans.status().message(), HasSubstr("rank 1 tensor norm"));
}

TEST(PlanSaveTest, RankWithNothingToWriteGetsAnEmptyPart) {
  Operation op;
  op.world_size = 2;
  op.ranks.resize(2);
  op.ranks[0].shards = {Shard("b", {4}, {0}, {4})};
  absl::StatusOr<std::vector<RankPlan>> plans = PlanSave(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  pb::SavePlanPart part;
  ASSERT_TRUE(part.ParseFromString((*plans)[1].part.Bytes()));
  EXPECT_EQ(part.rank(), 1);
  EXPECT_EQ(part.files_size(), 0);
  EXPECT_EQ((*plans)[1].bytes, 0);
  EXPECT_EQ((*plans)[0].bytes, 16);
}

}  // namespace
}  // namespace ckpt::coordinator
