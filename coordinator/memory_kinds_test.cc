#include "coordinator/memory_kinds.h"

#include <string>
#include <vector>

#include "coordinator/memory_catalog.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

// An operation whose rank r is served by worker `workers[r]` on host `hosts[r]`.
Operation OperationOn(const std::vector<std::string>& hosts,
                      const std::vector<std::string>& workers) {
  Operation op;
  op.id = "op-1";
  op.path = "mem://m";
  op.world_size = static_cast<int>(hosts.size());
  op.ranks.resize(hosts.size());
  for (size_t r = 0; r < hosts.size(); ++r) {
    op.ranks[r].location.host = hosts[r];
    op.ranks[r].location.worker_id = workers[r];
  }
  return op;
}

TEST(PlaceReplicasTest, EveryReplicaIsOnAnotherHostAndSpread) {
  const Operation op = OperationOn({"a", "a", "b", "b"}, {"w0", "w1", "w2", "w3"});
  absl::StatusOr<std::vector<std::vector<int>>> placement = PlaceReplicas(op, 1);
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::vector<int> copies_held(4, 0);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ((*placement)[r].size(), 1u);
    const int replica = (*placement)[r][0];
    EXPECT_NE(op.ranks[replica].location.host, op.ranks[r].location.host) << "rank " << r;
    ++copies_held[replica];
  }
  for (int held : copies_held) EXPECT_EQ(held, 1);  // one replica per worker, not all on one
  EXPECT_TRUE((*PlaceReplicas(op, 0))[0].empty());
}

TEST(PlaceReplicasTest, RefusesWhenNoWorkerOnAnotherHostNamingRankAndHost) {
  const Operation one_host = OperationOn({"a", "a"}, {"w0", "w1"});
  absl::StatusOr<std::vector<std::vector<int>>> placement = PlaceReplicas(one_host, 1);
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(placement.status().message().find("rank 0"), std::string::npos);
  EXPECT_NE(placement.status().message().find("host a"), std::string::npos);
  // Two copies need two workers on other hosts.
  const Operation two_hosts = OperationOn({"a", "b"}, {"w0", "w1"});
  EXPECT_EQ(PlaceReplicas(two_hosts, 2).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MemoryCatalogTest, ClaimsCommitsAndLosesCopiesOfDeadWorkers) {
  MemoryCatalog catalog;
  ASSERT_TRUE(catalog.Claim("m", "op-1").ok());
  EXPECT_EQ(catalog.Claim("m", "op-2").code(), absl::StatusCode::kAlreadyExists);
  MemoryCheckpoint c;
  c.name = "m";
  c.holders["data/r0_0.safetensors"] = {{"w0", "a"}, {"w2", "b"}};
  c.holders["data/r1_0.safetensors"] = {{"w1", "a"}, {"w3", "b"}};
  ASSERT_TRUE(catalog.Commit("op-1", c).ok());
  EXPECT_EQ(catalog.Claim("m", "op-3").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(catalog.DropWorker("w2"), std::vector<std::string>{"m"});
  EXPECT_TRUE(catalog.DropWorker("nobody").empty());
  absl::StatusOr<MemoryCheckpoint> found = catalog.Find("m");
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->holders["data/r0_0.safetensors"].size(), 1u);
  EXPECT_EQ(found->holders["data/r0_0.safetensors"][0].worker_id, "w0");
  ASSERT_EQ(found->lost["data/r0_0.safetensors"].size(), 1u);
  EXPECT_EQ(found->lost["data/r0_0.safetensors"][0].host, "b");
  EXPECT_EQ(catalog.Find("other").status().code(), absl::StatusCode::kNotFound);
  // A save that did not commit gives its claim back.
  ASSERT_TRUE(catalog.Claim("n", "op-4").ok());
  catalog.Release("n", "op-4");
  EXPECT_TRUE(catalog.Claim("n", "op-5").ok());
}

TEST(MemoryCatalogTest, AWorkersEvictionLosesOnlyItsCopiesAndIsNamedAsAnEviction) {
  MemoryCatalog catalog;
  ASSERT_TRUE(catalog.Claim("m", "op-1").ok());
  MemoryCheckpoint c;
  c.name = "m";
  c.holders["data/r0_0.safetensors"] = {{"w0", "a"}, {"w2", "b"}};
  ASSERT_TRUE(catalog.Commit("op-1", c).ok());
  // Names the catalog does not know (forgotten by keep-newest) change nothing.
  EXPECT_EQ(catalog.DropEvicted("w2", {"m", "gone"}), std::vector<std::string>{"m"});
  EXPECT_TRUE(catalog.DropEvicted("w2", {"m"}).empty());  // reported twice: nothing more
  absl::StatusOr<MemoryCheckpoint> found = catalog.Find("m");
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->holders["data/r0_0.safetensors"].size(), 1u);
  ASSERT_EQ(found->lost["data/r0_0.safetensors"].size(), 1u);
  const MemoryHolder& lost = found->lost["data/r0_0.safetensors"][0];
  EXPECT_TRUE(lost.evicted);
  EXPECT_EQ(lost.DebugString(), "worker w2 on host b, which evicted it from its memory tier");
}

TEST(MemoryCatalogTest, KeepsTheNewestCommittedCheckpoints) {
  MemoryCatalog catalog;
  std::vector<std::string> forgotten_all;
  for (const std::string name : {"s1", "s2", "s3"}) {
    ASSERT_TRUE(catalog.Claim(name, "op-" + name).ok());
    MemoryCheckpoint c;
    c.name = name;
    absl::StatusOr<std::vector<std::string>> forgotten =
        catalog.Commit("op-" + name, c, /*keep_newest=*/2);
    ASSERT_TRUE(forgotten.ok()) << forgotten.status();
    forgotten_all.insert(forgotten_all.end(), forgotten->begin(), forgotten->end());
  }
  EXPECT_EQ(forgotten_all, std::vector<std::string>{"s1"});
  EXPECT_EQ(catalog.Find("s1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(catalog.Find("s2").ok());
  EXPECT_TRUE(catalog.Find("s3").ok());
  // A commit without the claim is refused.
  MemoryCheckpoint unclaimed;
  unclaimed.name = "s4";
  EXPECT_EQ(catalog.Commit("op-x", unclaimed).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ckpt::coordinator
