// Exchange-based load plans with process groups (coordinator/load_exchange with
// coordinator/group_plan): each group gets its own plan, numbered within the group, its own
// rendezvous group, and reads every piece its ranks need itself.
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/load_exchange.h"
#include "coordinator/two_row_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_writer.h"

namespace ckpt::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The whole tensor, replica `replica` (0: the main replica).
pb::PieceMeta Whole(int64_t replica) {
  pb::PieceMeta s;
  s.mutable_tensor()->set_key("w");
  s.mutable_tensor()->set_dtype(pb::DTYPE_I32);
  s.mutable_tensor()->add_global_shape(2);
  s.mutable_tensor()->add_global_shape(4);
  for (int64_t v : {0, 0}) s.mutable_region()->add_offsets(v);
  for (int64_t v : {2, 4}) s.mutable_region()->add_lengths(v);
  s.add_replica_id(replica);
  return s;
}

// Four ranks each replicating the whole tensor (rank r is replica r), on `hosts`.
Operation FourReplicas(const std::string& path, const std::vector<std::string>& hosts,
                       const std::string& groups) {
  Operation op;
  op.id = "op-7";
  op.job = "j";
  op.kind = OperationKind::kLoad;
  op.path = path;
  op.world_size = 4;
  op.process_groups = groups;
  op.ranks.resize(4);
  for (int r = 0; r < 4; ++r) {
    op.ranks[r].shards = {Whole(r)};
    op.ranks[r].location.host = hosts[r];
  }
  return op;
}

std::vector<pb::LoadPlanPart> Plan(const Operation& op, pb::LoadAlgorithm algorithm) {
  LoadPlannerOptions options;
  options.algorithm = algorithm;
  absl::StatusOr<std::vector<RankPlan>> plans = PlanExchangeLoad(op, options);
  EXPECT_TRUE(plans.ok()) << plans.status();
  std::vector<pb::LoadPlanPart> parts(plans.ok() ? plans->size() : 0);
  for (size_t r = 0; r < parts.size(); ++r)
    EXPECT_TRUE(parts[r].ParseFromString((*plans)[r].part.Bytes()));
  return parts;
}

// The stored pieces (by row) a part's plan reads, and the ranks (within the group) reading them.
std::set<int> PiecesRead(const pb::LoadPlanPart& part, std::set<int>* readers) {
  std::set<int> pieces;
  for (const pb::LoadWaveEntry& w : part.waves()) {
    for (const pb::LoadUnitEntry& u : w.units()) {
      pieces.insert(static_cast<int>(UnitPiece(part, u).region().offsets(0)));
      readers->insert(u.reader());
    }
  }
  return pieces;
}

TEST(GroupLoadTest, AutoAcrossHostsExchangesWithinPerNodeGroups) {
  const std::string path = WriteTwoRowCheckpoint("auto-per-node");
  const std::vector<pb::LoadPlanPart> parts =
      Plan(FourReplicas(path, {"a", "b", "a", "b"}, ""), pb::LOAD_AUTO);
  ASSERT_EQ(parts.size(), 4u);
  // Host a: ranks 0 and 2; host b: ranks 1 and 3.
  EXPECT_EQ(parts[0].group(), "load/op-7/g0");
  EXPECT_EQ(parts[2].group(), "load/op-7/g0");
  EXPECT_EQ(parts[1].group(), "load/op-7/g1");
  EXPECT_THAT(parts[3].group_ranks(), ElementsAre(1, 3));
  EXPECT_EQ(parts[3].group_rank(), 1);
  EXPECT_EQ(parts[3].world_size(), 2);
  EXPECT_EQ(parts[3].algorithm(), pb::LOAD_BROADCAST);
  EXPECT_THAT(parts[0].transport_reason(), HasSubstr("span 2 hosts"));
  for (int r : {0, 1}) {  // each node reads both pieces itself, by ranks of its own group
    std::set<int> readers;
    EXPECT_THAT(PiecesRead(parts[r], &readers), ElementsAre(0, 1));
    for (int reader : readers) EXPECT_LT(reader, 2);
    for (const pb::LoadRequestEntry& q : parts[r].requests()) EXPECT_LT(q.rank(), 2);
  }
}

TEST(GroupLoadTest, OneHostAutoStaysOneGroupAsBefore) {
  const std::string path = WriteTwoRowCheckpoint("one-host");
  const std::vector<pb::LoadPlanPart> parts =
      Plan(FourReplicas(path, {"a", "a", "a", "a"}, ""), pb::LOAD_BROADCAST);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[3].group(), "load/op-7");
  EXPECT_EQ(parts[3].world_size(), 4);
  EXPECT_EQ(parts[3].group_ranks_size(), 0);
  std::set<int> readers;
  EXPECT_THAT(PiecesRead(parts[0], &readers), ElementsAre(0, 1));
}

TEST(GroupLoadTest, DeclaredGroupsReadCrossGroupPiecesThemselves) {
  const std::string path = WriteTwoRowCheckpoint("declared");
  // Groups {0, 2} and {1, 3}: the main replica (rank 0) is in group 0 only, so group 1's
  // pieces are all cross-group loads, which it reads from storage itself.
  const std::vector<pb::LoadPlanPart> parts =
      Plan(FourReplicas(path, {"a", "a", "a", "a"}, "data-parallel:2"), pb::LOAD_BROADCAST);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[2].group(), "load/op-7/g0");
  EXPECT_EQ(parts[2].group_rank(), 1);
  EXPECT_EQ(parts[1].group(), "load/op-7/g1");
  EXPECT_THAT(parts[1].transport_reason(), HasSubstr("process groups data-parallel:2"));
  for (int r : {0, 1}) {
    std::set<int> readers;
    EXPECT_THAT(PiecesRead(parts[r], &readers), ElementsAre(0, 1));
  }
}

TEST(GroupLoadTest, GroupsThatDoNotPartitionTheRanksFailThePlanNamingTheGroup) {
  const std::string path = WriteTwoRowCheckpoint("bad");
  LoadPlannerOptions options;
  options.algorithm = pb::LOAD_BROADCAST;
  absl::StatusOr<std::vector<RankPlan>> plans =
      PlanExchangeLoad(FourReplicas(path, {"a", "a", "a", "a"}, "0,1;1,2,3"), options);
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plans.status().message(), HasSubstr("rank 1 is in process groups 0 and 1"));
}

}  // namespace
}  // namespace ckpt::coordinator
