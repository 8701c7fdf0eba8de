#include "worker/kept_plan_parts.h"

#include <string>

#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

pb::WorkItem Whole(const std::string& op, int rank, const std::string& body,
                   const std::string& tail) {
  pb::WorkItem item;
  item.set_operation_id(op);
  item.set_job("job");
  item.set_rank(rank);
  item.set_plan_part(body + tail);
  item.set_plan_part_body_id(op);
  item.set_plan_part_body_size(static_cast<int64_t>(body.size()));
  return item;
}

pb::WorkItem ByReference(const std::string& op, int rank, const std::string& body_id,
                         const std::string& tail) {
  pb::WorkItem item;
  item.set_operation_id(op);
  item.set_job("job");
  item.set_rank(rank);
  item.set_plan_part(tail);
  item.set_plan_part_body_id(body_id);
  item.set_plan_part_by_reference(true);
  return item;
}

TEST(KeptPlanPartsTest, AWholePartIsKeptAndALaterPartByReferenceIsItsBodyThenItsTail) {
  KeptPlanParts kept;
  EXPECT_EQ(kept.Held("job", 3), "");
  pb::WorkItem first = Whole("op-1", 3, "BODY", "");
  ASSERT_TRUE(kept.Resolve(first).ok());
  EXPECT_EQ(first.plan_part(), "BODY");  // unchanged
  EXPECT_EQ(kept.Held("job", 3), "op-1");
  EXPECT_EQ(kept.Held("job", 4), "");
  pb::WorkItem repeat = ByReference("op-2", 3, "op-1", "+TAIL");
  ASSERT_TRUE(kept.Resolve(repeat).ok());
  EXPECT_EQ(repeat.plan_part(), "BODY+TAIL");
  pb::WorkItem again = ByReference("op-3", 3, "op-1", "+T3");
  ASSERT_TRUE(kept.Resolve(again).ok());
  EXPECT_EQ(again.plan_part(), "BODY+T3");
}

TEST(KeptPlanPartsTest, APartByReferenceToABodyNotKeptFailsNamingRankAndBody) {
  KeptPlanParts kept;
  pb::WorkItem orphan = ByReference("op-2", 5, "op-1", "+TAIL");
  absl::Status s = kept.Resolve(orphan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("rank 5"), std::string::npos) << s;
  EXPECT_NE(s.message().find("body op-1"), std::string::npos) << s;
  pb::WorkItem first = Whole("op-0", 5, "OLD", "");
  ASSERT_TRUE(kept.Resolve(first).ok());
  pb::WorkItem other = ByReference("op-2", 5, "op-1", "+TAIL");  // another body
  EXPECT_EQ(kept.Resolve(other).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KeptPlanPartsTest, ANewerBodyReplacesTheRanksOldOne) {
  KeptPlanParts kept;
  pb::WorkItem first = Whole("op-1", 0, "A", "");
  pb::WorkItem second = Whole("op-2", 0, "BB", "");
  ASSERT_TRUE(kept.Resolve(first).ok());
  ASSERT_TRUE(kept.Resolve(second).ok());
  EXPECT_EQ(kept.Held("job", 0), "op-2");
  pb::WorkItem stale = ByReference("op-3", 0, "op-1", "");
  EXPECT_FALSE(kept.Resolve(stale).ok());
}

TEST(KeptPlanPartsTest, AHostileBodySizeIsRefusedAndNothingIsKept) {
  KeptPlanParts kept;
  pb::WorkItem hostile = Whole("op-1", 0, "AB", "");
  hostile.set_plan_part_body_size(3);
  EXPECT_EQ(kept.Resolve(hostile).code(), absl::StatusCode::kInvalidArgument);
  hostile.set_plan_part_body_size(-1);
  EXPECT_EQ(kept.Resolve(hostile).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kept.Held("job", 0), "");
}

TEST(KeptPlanPartsTest, PastTheBoundTheFirstKeptRankIsDroppedFirst) {
  KeptPlanParts kept(/*max_bodies=*/2);
  for (int r = 0; r < 3; ++r) {
    pb::WorkItem item = Whole("op-1", r, "B", "");
    ASSERT_TRUE(kept.Resolve(item).ok());
  }
  EXPECT_EQ(kept.Held("job", 0), "");
  EXPECT_EQ(kept.Held("job", 1), "op-1");
  EXPECT_EQ(kept.Held("job", 2), "op-1");
}

TEST(KeptPlanPartsTest, AnItemNamingNoBodyIsLeftAlone) {
  KeptPlanParts kept;
  pb::WorkItem plain;
  plain.set_job("job");
  plain.set_plan_part("PART");
  ASSERT_TRUE(kept.Resolve(plain).ok());
  EXPECT_EQ(plain.plan_part(), "PART");
  EXPECT_EQ(kept.Held("job", 0), "");
}

}  // namespace
}  // namespace ckpt::worker
