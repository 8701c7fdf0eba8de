#include "coordinator/transfer_plan_cache.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

pb::Manifest OneLayout(uint64_t checksum, int64_t step) {
  pb::Manifest m;
  pb::StoredPiece* piece = m.add_pieces();
  piece->set_key("w");
  piece->set_file("data/r0_0.safetensors");
  piece->set_byte_length(64);
  piece->set_xxh3_64(checksum);
  m.set_step(step);
  m.set_created_unix_micros(step * 1000);
  (*m.mutable_user_metadata())["step"] = std::to_string(step);
  return m;
}

Operation Destination(const std::vector<std::string>& digests) {
  Operation op;
  op.world_size = static_cast<int>(digests.size());
  op.ranks.resize(digests.size());
  for (size_t r = 0; r < digests.size(); ++r) op.ranks[r].description_digest = digests[r];
  return op;
}

TEST(TransferPlanCacheTest, LayoutDigestIgnoresWhatChangesBetweenVersionsOnly) {
  const std::string v1 = ManifestLayoutDigest(OneLayout(111, 1));
  EXPECT_EQ(v1, ManifestLayoutDigest(OneLayout(222, 2)));
  pb::Manifest other = OneLayout(111, 1);
  other.mutable_pieces(0)->set_byte_length(128);
  EXPECT_NE(v1, ManifestLayoutDigest(other));
}

TEST(TransferPlanCacheTest, KeysNeedEveryDestinationDigestAndTellLayoutsApart) {
  const std::string layout = ManifestLayoutDigest(OneLayout(1, 1));
  const std::string key = TransferPlanKey(layout, Destination({"a", "b"}), {"w1"}, 1, 100);
  EXPECT_FALSE(key.empty());
  EXPECT_EQ(key, TransferPlanKey(layout, Destination({"a", "b"}), {"w1"}, 1, 100));
  EXPECT_TRUE(TransferPlanKey(layout, Destination({"a", ""}), {"w1"}, 1, 100).empty());
  EXPECT_NE(key, TransferPlanKey(layout, Destination({"a", "c"}), {"w1"}, 1, 100));
  EXPECT_NE(key, TransferPlanKey(layout, Destination({"a", "b"}), {"w2"}, 1, 100));
  EXPECT_NE(key, TransferPlanKey(layout, Destination({"a", "b"}), {"w1"}, 2, 100));
  EXPECT_NE(key, TransferPlanKey(layout, Destination({"a", "b"}), {"w1"}, 1, 200));
  EXPECT_NE(key, TransferPlanKey("other", Destination({"a", "b"}), {"w1"}, 1, 100));
}

TEST(TransferPlanCacheTest, ReusesKeptPlansAndDropsTheLeastRecentlyUsed) {
  TransferPlanCache cache(/*max_plans=*/2);
  EXPECT_FALSE(cache.Find("k1").has_value());
  cache.Keep("k1", {RankPlan{"part1", 10}});
  cache.Keep("k2", {RankPlan{"part2", 20}});
  cache.Keep("", {RankPlan{"never", 1}});
  ASSERT_TRUE(cache.Find("k1").has_value());  // k1 most recently used now
  cache.Keep("k3", {RankPlan{"part3", 30}});  // drops k2
  EXPECT_FALSE(cache.Find("k2").has_value());
  std::optional<std::vector<RankPlan>> k1 = cache.Find("k1");
  ASSERT_TRUE(k1.has_value());
  EXPECT_EQ((*k1)[0].part, "part1");
  EXPECT_EQ(cache.reused(), 2);
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace ckpt::coordinator
