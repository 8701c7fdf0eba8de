#include "coordinator/reshard_commit.h"

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "tests/test_util.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

class ReshardCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ckpt::testing::FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    GptConfig c;
    c.layers = 2;
    c.hidden = 64;
    c.vocab = 500;
    tensors_ = *GptTensors(c);
    src_ = JoinPath(dir_, "src");
    auto layout = LayoutSpec::Parse(GptLayoutJson(2, 2));
    ASSERT_TRUE(layout.ok());
    ASSERT_TRUE(WriteGptCheckpoint(src_, tensors_, *layout, int64_t{256} << 10, WriteOptions{}, 9,
                                   {{"model", "m"}})
                    .ok());
    auto reader = CheckpointReader::Open(src_);
    ASSERT_TRUE(reader.ok());
    manifest_ = (*reader)->manifest();
  }

  Operation ReshardOp(const std::string& dst, int world_size, const std::string& layout_json) {
    Operation op;
    op.id = "op-1";
    op.kind = OperationKind::kReshard;
    op.path = dst;
    op.world_size = world_size;
    op.ranks.resize(world_size);
    op.reshard.source = src_;
    op.reshard.layout_json = layout_json;
    return op;
  }

  std::string dir_, src_;
  std::vector<TensorMeta> tensors_;
  pb::Manifest manifest_;
};

TEST_F(ReshardCommitTest, EveryElementWrittenOnceInFilesThatFitTheBudget) {
  auto layout = LayoutSpec::Parse(GptLayoutJson(4, 2));  // DP replicas: written once
  ASSERT_TRUE(layout.ok());
  const int64_t budget = int64_t{3} << 20;
  auto plans = PlanClusterReshard(manifest_, src_, *layout, budget, "/staging");
  ASSERT_TRUE(plans.ok()) << plans.status();
  ASSERT_EQ(plans->size(), 8u);
  int64_t total = 0;
  std::set<std::string> pieces;
  for (size_t r = 0; r < plans->size(); ++r) {
    pb::ReshardPlanPart part;
    ASSERT_TRUE(part.ParseFromString((*plans)[r].part.Bytes()));
    EXPECT_EQ(part.rank(), static_cast<int>(r));
    EXPECT_EQ(part.source(), src_);
    EXPECT_EQ(part.staging_dir(), "/staging");
    EXPECT_EQ(part.total_bytes(), (*plans)[r].bytes);
    for (int k = 0; k < part.files_size(); ++k) {
      const pb::PlanFile& f = part.files(k);
      EXPECT_EQ(f.path(), DataFileName(int64_t(r), int64_t(k)));
      EXPECT_LE(f.total_bytes(), budget / 3);
      for (const pb::PlanPiece& p : f.pieces()) {
        EXPECT_TRUE(pieces.insert(absl::StrCat(p.key(), p.region().DebugString())).second)
            << "written twice: " << p.key();
      }
    }
    total += part.total_bytes();
  }
  EXPECT_EQ(total, TotalBytes(tensors_));
}

TEST_F(ReshardCommitTest, BudgetTooSmallForAPieceNamesIt) {
  // hidden 256: the MLP's fp32 master weights are 1 MiB pieces when not sharded.
  GptConfig c;
  c.layers = 1;
  c.hidden = 256;
  c.vocab = 100;
  auto tensors = GptTensors(c);
  ASSERT_TRUE(tensors.ok());
  const std::string big = JoinPath(dir_, "big");
  auto tp2 = LayoutSpec::Parse(GptLayoutJson(2, 1));
  ASSERT_TRUE(
      WriteGptCheckpoint(big, *tensors, *tp2, int64_t{1} << 20, WriteOptions{}, 1, {}).ok());
  auto reader = CheckpointReader::Open(big);
  ASSERT_TRUE(reader.ok());
  auto layout = LayoutSpec::Parse(GptLayoutJson(1, 1));
  ASSERT_TRUE(layout.ok());
  auto plans =
      PlanClusterReshard((*reader)->manifest(), big, *layout, int64_t{1} << 20, "/staging");
  ASSERT_EQ(plans.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plans.status().message(), HasSubstr("tensor \""));
  EXPECT_THAT(plans.status().message(), HasSubstr("use a budget of at least"));
  EXPECT_EQ(PlanClusterReshard(manifest_, src_, *layout, 1000, "/s").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ReshardCommitTest, PlanChecksSourceDestinationAndLayout) {
  ReshardCommitter committer;
  const std::string tp4 = GptLayoutJson(4, 1);
  // World size of the operation must be the layout's.
  auto wrong = committer.Plan(ReshardOp(JoinPath(dir_, "dst"), 3, tp4));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  // A bad layout names the JSON path.
  auto bad_layout = committer.Plan(ReshardOp(JoinPath(dir_, "dst"), 4, "{\"mesh\": 3}"));
  EXPECT_EQ(bad_layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_layout.status().message(), HasSubstr("target layout"));
  // Missing source.
  Operation missing = ReshardOp(JoinPath(dir_, "dst"), 4, tp4);
  missing.reshard.source = JoinPath(dir_, "nothing");
  auto no_source = committer.Plan(missing);
  EXPECT_FALSE(no_source.ok());
  EXPECT_THAT(no_source.status().message(), HasSubstr(JoinPath(dir_, "nothing")));
  // An existing destination without overwrite: AlreadyExists, and nothing created.
  auto exists = committer.Plan(ReshardOp(src_, 4, tp4));
  EXPECT_FALSE(exists.ok());
  ASSERT_TRUE(MakeDir(JoinPath(dir_, "taken")).ok());  // not empty: an empty one is committed over
  ASSERT_TRUE(WriteFileDurably(JoinPath(JoinPath(dir_, "taken"), "notes.txt"), "keep").ok());
  auto taken = committer.Plan(ReshardOp(JoinPath(dir_, "taken"), 4, tp4));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(ReshardCommitTest, AbortedReshardLeavesNoStagingBehind) {
  ReshardCommitter committer;
  Operation op = ReshardOp(JoinPath(dir_, "dst"), 4, GptLayoutJson(4, 1));
  auto plans = committer.Plan(op);
  ASSERT_TRUE(plans.ok()) << plans.status();
  pb::ReshardPlanPart part;
  ASSERT_TRUE(part.ParseFromString((*plans)[0].part.Bytes()));
  EXPECT_TRUE(PathExists(part.staging_dir()));
  op.phase = Phase::kAborted;
  EXPECT_TRUE(committer.Finalize(op).ok());
  EXPECT_FALSE(PathExists(part.staging_dir()));
  EXPECT_FALSE(PathExists(op.path));
  // Commit of an operation the committer does not know is refused.
  EXPECT_EQ(committer.Commit(op).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ckpt::coordinator
