#include "rendezvous/kv_store.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(KvStoreTest, SetThenGetReturnsValuesInKeyOrder) {
  KvStore store;
  ASSERT_TRUE(store.Set("b", "2").ok());
  ASSERT_TRUE(store.Set("a", std::string("\0x", 2)).ok());
  auto got = store.WaitAndGet({"a", "b"}, absl::Now());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], std::string("\0x", 2));
  EXPECT_EQ((*got)[1], "2");
}

TEST(KvStoreTest, WaitBlocksUntilAnotherThreadSets) {
  KvStore store;
  // WaitAndGet asks `cancelled` each time it finds a key missing, before it sleeps: the first
  // call tells the setter that the waiter is blocked on the absent key.
  absl::Notification waiting;
  auto note_waiting = [&waiting] {
    if (!waiting.HasBeenNotified()) waiting.Notify();
    return false;
  };
  std::thread setter([&] {
    ASSERT_TRUE(waiting.WaitForNotificationWithTimeout(absl::Seconds(10)));
    ASSERT_TRUE(store.Set("late", "v").ok());
  });
  auto got = store.WaitAndGet({"late"}, absl::Now() + absl::Seconds(10), note_waiting);
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], "v");
}

TEST(KvStoreTest, TimeoutNamesOnlyTheMissingKeys) {
  KvStore store;
  ASSERT_TRUE(store.Set("present", "x").ok());
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
  ASSERT_TRUE(store.Set("s", "abc").ok());
  EXPECT_EQ(store.Add("s", 1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Add("big", INT64_MAX).ok());
  EXPECT_EQ(store.Add("big", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, ErasePrefixDropsOnlyThatOperationsKeys) {
  KvStore kv;
  ASSERT_TRUE(kv.Set("load/op-1/mesh/0", "a").ok());
  ASSERT_TRUE(kv.Set("load/op-1/arrived", "2").ok());
  ASSERT_TRUE(kv.Set("load/op-10/mesh/0", "b").ok());
  ASSERT_TRUE(kv.Set("other", "c").ok());
  EXPECT_EQ(kv.ErasePrefix("load/op-1/"), 2u);
  EXPECT_EQ(kv.size(), 2u);
  std::vector<std::string> keys = {"load/op-10/mesh/0", "other"};
  auto left = kv.WaitAndGet(keys, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(kv.ErasePrefix("nothing/"), 0u);
}

TEST(KvStoreTest, AGroupIsItsKeysFirstTwoComponents) {
  EXPECT_EQ(KvGroupOf("load/op-7/mesh/rank_0"), "load/op-7");
  EXPECT_EQ(KvGroupOf("load/op-7/"), "load/op-7");
  EXPECT_EQ(KvGroupOf("load/op-7"), "");
  EXPECT_EQ(KvGroupOf("plain"), "");
}

TEST(KvStoreTest, AGroupHoldsAtMostItsKeyLimitAndTheErrorNamesGroupAndLimit) {
  KvLimits limits;
  limits.max_keys_per_group = 3;
  KvStore kv(limits);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(kv.Set("load/op-1/k" + std::to_string(i), "v").ok());
  ASSERT_TRUE(kv.Set("load/op-1/k0", "replaced").ok()) << "replacing is not a new key";
  absl::Status s = kv.Set("load/op-1/k3", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("'load/op-1'"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("--rendezvous_max_keys_per_job"));
  EXPECT_EQ(kv.Add("load/op-1/counter", 1).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Set("load/op-2/k0", "v").ok()) << "another operation has its own budget";
  EXPECT_EQ(kv.ErasePrefix("load/op-1/"), 3u);
  EXPECT_TRUE(kv.Set("load/op-1/k3", "v").ok()) << "erasing frees the group's budget";
}

TEST(KvStoreTest, ValuesAndGroupBytesAreBounded) {
  KvLimits limits;
  limits.max_value_bytes = 100;
  limits.max_bytes_per_group = 250;
  KvStore kv(limits);
  absl::Status big = kv.Set("load/op-1/big", std::string(101, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.message(), ::testing::HasSubstr("--rendezvous_max_value_bytes"));
  ASSERT_TRUE(kv.Set("load/op-1/a", std::string(100, 'x')).ok());
  ASSERT_TRUE(kv.Set("load/op-1/b", std::string(100, 'x')).ok());
  absl::Status full = kv.Set("load/op-1/c", std::string(100, 'x'));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), ::testing::HasSubstr("--rendezvous_max_bytes_per_job"));
  EXPECT_EQ(kv.size(), 2u);
  EXPECT_EQ(kv.bytes(), 2u * (11 + 100));
  EXPECT_EQ(kv.Set(std::string(2000, 'k'), "v").code(), absl::StatusCode::kResourceExhausted);
}

// Records the outcome of one WaitAsync.
struct AsyncOutcome {
  int calls = 0;
  absl::StatusOr<std::vector<std::string>> values = absl::UnknownError("not called");
  KvStore::WaitCallback Callback() {
    return [this](absl::StatusOr<std::vector<std::string>> v) {
      ++calls;
      values = std::move(v);
    };
  }
};

TEST(KvStoreAsyncTest, WaitCompletesInsideTheSetThatSuppliesTheLastKey) {
  KvStore store;
  AsyncOutcome outcome;
  ASSERT_TRUE(store.Set("a", "1").ok());
  store.WaitAsync({"a", "b", "c"}, absl::InfiniteFuture(), outcome.Callback());
  ASSERT_TRUE(store.Set("c", "3").ok());
  EXPECT_EQ(outcome.calls, 0);
  EXPECT_EQ(store.async_waits(), 1u);
  ASSERT_TRUE(store.Add("b", 2).ok());  // a counter completes it too
  ASSERT_EQ(outcome.calls, 1);
  ASSERT_TRUE(outcome.values.ok()) << outcome.values.status();
  EXPECT_THAT(*outcome.values, ::testing::ElementsAre("1", "2", "3"));
  EXPECT_EQ(store.async_waits(), 0u);
}

TEST(KvStoreAsyncTest, WaitOnPresentKeysCompletesAtOnce) {
  KvStore store;
  AsyncOutcome outcome;
  ASSERT_TRUE(store.Set("k", "v").ok());
  store.WaitAsync({"k"}, absl::InfiniteFuture(), outcome.Callback());
  ASSERT_EQ(outcome.calls, 1);
  ASSERT_TRUE(outcome.values.ok());
  EXPECT_EQ(store.async_waits(), 0u);
}

TEST(KvStoreAsyncTest, ExpiredWaitNamesOnlyTheMissingKeysAndReportsTheNextDeadline) {
  KvStore store;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  AsyncOutcome early, late;
  ASSERT_TRUE(store.Set("present", "x").ok());
  store.WaitAsync({"present", "rank/3", "rank/5"}, t0, early.Callback());
  store.WaitAsync({"rank/9"}, t0 + absl::Seconds(5), late.Callback());
  EXPECT_EQ(store.ExpireWaits(t0 - absl::Seconds(1)), t0);
  EXPECT_EQ(early.calls, 0);
  EXPECT_EQ(store.ExpireWaits(t0), t0 + absl::Seconds(5));
  ASSERT_EQ(early.calls, 1);
  EXPECT_EQ(early.values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(early.values.status().message()), ::testing::HasSubstr("rank/3, rank/5"));
  EXPECT_EQ(late.calls, 0);
  ASSERT_TRUE(store.Set("rank/3", "y").ok());  // the expired wait is gone: nothing runs twice
  EXPECT_EQ(early.calls, 1);
}

TEST(KvStoreAsyncTest, CancelEndsTheWaitOnceAndOnlyWhileWaiting) {
  KvStore store;
  AsyncOutcome outcome;
  uint64_t id = store.WaitAsync({"never"}, absl::InfiniteFuture(), outcome.Callback());
  store.CancelWait(id);
  ASSERT_EQ(outcome.calls, 1);
  EXPECT_EQ(outcome.values.status().code(), absl::StatusCode::kCancelled);
  store.CancelWait(id);
  ASSERT_TRUE(store.Set("never", "now").ok());
  EXPECT_EQ(outcome.calls, 1);
  EXPECT_EQ(store.async_waits(), 0u);
}

TEST(KvStoreAsyncTest, WaitOnAnErasedKeyWaitsForItAgain) {
  KvStore store;
  AsyncOutcome outcome;
  ASSERT_TRUE(store.Set("load/op-1/a", "1").ok());
  store.WaitAsync({"load/op-1/a", "load/op-1/b"}, absl::InfiniteFuture(), outcome.Callback());
  EXPECT_EQ(store.ErasePrefix("load/op-1/"), 1u);
  ASSERT_TRUE(store.Set("load/op-1/b", "2").ok());
  EXPECT_EQ(outcome.calls, 0);  // "a" is missing again
  ASSERT_TRUE(store.Set("load/op-1/a", "3").ok());
  ASSERT_EQ(outcome.calls, 1);
  EXPECT_THAT(*outcome.values, ::testing::ElementsAre("3", "2"));
}

}  // namespace
}  // namespace ckpt
