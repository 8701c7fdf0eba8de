#include "coordinator/plan_part_bytes.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {
namespace {

std::string StagingField(const std::string& dir) {
  pb::SavePlanPart only;
  only.set_staging_dir(dir);
  return only.SerializeAsString();
}

TEST(PlanPartBytesTest, CopiesShareTheBodyInsteadOfCopyingIt) {
  PlanPartBytes part(std::string(4096, 'x'));
  PlanPartBytes copy = part;
  EXPECT_TRUE(copy.SharesBodyWith(part));
  EXPECT_EQ(copy.size(), 4096u);
  EXPECT_FALSE(PlanPartBytes().SharesBodyWith(PlanPartBytes()));
  EXPECT_TRUE(PlanPartBytes().empty());
}

TEST(PlanPartBytesTest, ATailReplacesTheBodysFieldWhenParsedAndSharesTheBody) {
  pb::SavePlanPart body;
  body.set_rank(3);
  body.set_staging_dir("/ckpt/.staging-op-1");
  body.add_files()->set_path("data/r3_0.safetensors");
  const PlanPartBytes first(body.SerializeAsString());
  const auto tail = std::make_shared<const std::string>(StagingField("/ckpt/.staging-op-2"));
  const PlanPartBytes again = first.WithTail(tail);
  EXPECT_TRUE(again.SharesBodyWith(first));
  EXPECT_EQ(again.size(), first.size() + tail->size());
  pb::SavePlanPart parsed;
  ASSERT_TRUE(parsed.ParseFromString(again.Bytes()));
  EXPECT_EQ(parsed.staging_dir(), "/ckpt/.staging-op-2");
  EXPECT_EQ(parsed.rank(), 3);
  ASSERT_EQ(parsed.files_size(), 1);
  EXPECT_EQ(parsed.files(0).path(), "data/r3_0.safetensors");
  // A second tail goes after the first: the last one wins.
  const PlanPartBytes third =
      again.WithTail(std::make_shared<const std::string>(StagingField("/ckpt/.staging-op-3")));
  ASSERT_TRUE(parsed.ParseFromString(third.Bytes()));
  EXPECT_EQ(parsed.staging_dir(), "/ckpt/.staging-op-3");
  EXPECT_EQ(again, again.Bytes());
}

}  // namespace
}  // namespace ckpt::coordinator
