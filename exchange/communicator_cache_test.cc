#include "exchange/communicator_cache.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "exchange/gloo/gloo_communicator.h"
#include "gtest/gtest.h"
#include "rendezvous/store.h"

namespace ckpt {
namespace {

// A real one-rank Gloo communicator, wrapped for the cache under `instance`.
std::unique_ptr<CachedCommunicator> OneRank(InMemoryStore* store, const std::string& instance) {
  GlooOptions options;
  options.group_name = instance;
  auto comm = CreateGlooCommunicator(store, 0, 1, options, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(comm.ok()) << comm.status();
  return std::make_unique<CachedCommunicator>(*std::move(comm), instance);
}

TEST(CachedCommunicatorTest, TheReuseTokenNamesInstanceSizeAndCallsServed) {
  InMemoryStore store;
  std::unique_ptr<CachedCommunicator> comm = OneRank(&store, "load/op-1");
  EXPECT_EQ(comm->ReuseToken(), "load/op-1|1|0");
  ASSERT_TRUE(comm->Barrier(absl::Now() + absl::Seconds(5)).ok());
  char byte = 3;
  ASSERT_TRUE(comm->Broadcast(&byte, 1, 0, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(comm->calls(), 2u);
  EXPECT_EQ(comm->ReuseToken(), "load/op-1|1|2");
  EXPECT_TRUE(comm->failure().ok());
}

TEST(CachedCommunicatorTest, AFailedCallIsRecordedAndCounted) {
  InMemoryStore store;
  std::unique_ptr<CachedCommunicator> comm = OneRank(&store, "load/op-1");
  char byte = 3;
  absl::Status bad = comm->Broadcast(&byte, 1, /*root=*/5, absl::Now() + absl::Seconds(5));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(comm->failure(), bad);
  EXPECT_EQ(comm->calls(), 1u);
}

TEST(CommunicatorCacheTest, TakeRemovesWhatPutStored) {
  InMemoryStore store;
  CommunicatorCache cache(4);
  EXPECT_EQ(cache.Take("k"), nullptr);
  std::unique_ptr<CachedCommunicator> comm = OneRank(&store, "load/op-1");
  CachedCommunicator* raw = comm.get();
  cache.Put("k", std::move(comm));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Take("other"), nullptr);
  std::unique_ptr<CachedCommunicator> back = cache.Take("k");
  EXPECT_EQ(back.get(), raw);
  EXPECT_EQ(cache.Take("k"), nullptr);  // in use now: never handed out twice
  const CommunicatorCacheStats stats = cache.stats();
  EXPECT_EQ(stats.kept, 1);
  EXPECT_EQ(stats.taken, 1);
  EXPECT_EQ(stats.missed, 3);
}

TEST(CommunicatorCacheTest, ACommunicatorWithAFailedCallIsNeverKept) {
  InMemoryStore store;
  CommunicatorCache cache(4);
  std::unique_ptr<CachedCommunicator> comm = OneRank(&store, "load/op-1");
  char byte = 3;
  ASSERT_FALSE(comm->Broadcast(&byte, 1, /*root=*/5, absl::Now() + absl::Seconds(5)).ok());
  cache.Put("k", std::move(comm));
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.Take("k"), nullptr);
  EXPECT_EQ(cache.stats().refused, 1);
}

TEST(CommunicatorCacheTest, TheOldestEntryIsDroppedBeyondTheBoundAndAKeyHoldsOneEntry) {
  InMemoryStore store;
  CommunicatorCache cache(2);
  cache.Put("a", OneRank(&store, "load/op-a"));
  cache.Put("b", OneRank(&store, "load/op-b"));
  cache.Put("c", OneRank(&store, "load/op-c"));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Take("a"), nullptr);
  cache.Put("b", OneRank(&store, "load/op-b2"));  // replaces b's entry
  EXPECT_EQ(cache.size(), 2u);
  std::unique_ptr<CachedCommunicator> b = cache.Take("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->instance(), "load/op-b2");
  EXPECT_NE(cache.Take("c"), nullptr);
  EXPECT_EQ(cache.stats().evicted, 2);
}

TEST(CommunicatorCacheTest, ACacheOfNoEntriesKeepsNothing) {
  InMemoryStore store;
  CommunicatorCache cache(0);
  cache.Put("k", OneRank(&store, "load/op-1"));
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace ckpt
