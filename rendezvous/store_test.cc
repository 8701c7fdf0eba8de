#include "rendezvous/store.h"

#include <thread>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(InMemoryStoreTest, WaitSeesKeysFromOtherThreads) {
  InMemoryStore store;
  std::thread t([&] { ASSERT_TRUE(store.Set("x", "1", absl::InfiniteFuture()).ok()); });
  EXPECT_TRUE(store.Wait({"x"}, absl::Now() + absl::Seconds(10)).ok());
  t.join();
}

TEST(PrefixedStoreTest, GroupsDoNotSeeEachOthersKeys) {
  InMemoryStore base;
  PrefixedStore a("group_a", &base);
  PrefixedStore b("group_b", &base);
  absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  ASSERT_TRUE(a.Set("addr/0", "A", deadline).ok());
  auto got = b.Get({"addr/0"}, deadline);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("group_b/addr/0"), std::string::npos) << got.status();
  auto mine = a.Get({"addr/0"}, deadline);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ((*mine)[0], "A");
  auto direct = base.Get({"group_a/addr/0"}, deadline);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(*b.Add("n", 2, deadline), 2);
  EXPECT_EQ(*a.Add("n", 1, deadline), 1);
}

}  // namespace
}  // namespace ckpt
