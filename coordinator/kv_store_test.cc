#include "coordinator/kv_store.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(KvStoreTest, SetThenGetReturnsValuesInKeyOrder) {
  KvStore store;
  store.Set("b", "2");
  store.Set("a", std::string("\0x", 2));
  auto got = store.WaitAndGet({"a", "b"}, absl::Now());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], std::string("\0x", 2));
  EXPECT_EQ((*got)[1], "2");
}

TEST(KvStoreTest, WaitBlocksUntilAnotherThreadSets) {
  KvStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    store.Set("late", "v");
  });
  auto got = store.WaitAndGet({"late"}, absl::Now() + absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], "v");
}

TEST(KvStoreTest, TimeoutNamesOnlyTheMissingKeys) {
  KvStore store;
  store.Set("present", "x");
  auto got =
      store.WaitAndGet({"present", "rank/3", "rank/5"}, absl::Now() + absl::Milliseconds(30));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("rank/3, rank/5"), std::string::npos) << got.status();
  EXPECT_EQ(got.status().message().find("present"), std::string::npos);
}

TEST(KvStoreTest, CancellationStopsTheWait) {
  KvStore store;
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(30));
    cancel = true;
  });
  auto got =
      store.WaitAndGet({"never"}, absl::Now() + absl::Seconds(30), [&] { return cancel.load(); });
  canceller.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled);
}

TEST(KvStoreTest, AddIsAtomicAcrossThreads) {
  KvStore store;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) ASSERT_TRUE(store.Add("n", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  auto v = store.Add("n", 0);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 800);
  auto text = store.WaitAndGet({"n"}, absl::Now());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ((*text)[0], "800");
}

TEST(KvStoreTest, AddRejectsNonIntegerAndOverflow) {
  KvStore store;
  store.Set("s", "abc");
  EXPECT_EQ(store.Add("s", 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Add("big", INT64_MAX).ok());
  EXPECT_EQ(store.Add("big", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, ErasePrefixDropsOnlyThatOperationsKeys) {
  KvStore kv;
  kv.Set("load/op-1/mesh/0", "a");
  kv.Set("load/op-1/arrived", "2");
  kv.Set("load/op-10/mesh/0", "b");
  kv.Set("other", "c");
  EXPECT_EQ(kv.ErasePrefix("load/op-1/"), 2u);
  EXPECT_EQ(kv.size(), 2u);
  std::vector<std::string> keys = {"load/op-10/mesh/0", "other"};
  auto left = kv.WaitAndGet(keys, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(kv.ErasePrefix("nothing/"), 0u);
}

}  // namespace
}  // namespace ckpt
