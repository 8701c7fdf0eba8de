#include "worker/load_communicator.h"

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/gpu.h"
#include "exchange/communicator_cache.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rendezvous/store.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

pb::LoadPlanPart Part(bool device_exchange) {
  pb::LoadPlanPart part;
  part.set_rank(0);
  part.set_world_size(1);
  part.set_group("load/op-test");
  part.set_device_exchange(device_exchange);
  part.set_transport_reason(device_exchange ? "every rank is device-resident" : "rank 0 is not");
  return part;
}

LoadCommunicatorConfig Config(int cuda_device) {
  LoadCommunicatorConfig config;
  config.cuda_device = cuda_device;
  config.rendezvous_address = "coordinator:1";
  config.rendezvous_timeout = absl::Seconds(10);
  return config;
}

TEST(LoadCommunicatorOptionsTest, AHostPartAsksForGlooEvenOnAWorkerWithAGpu) {
  auto options = LoadCommunicatorOptions(Part(false), Config(0), "rank 0 of job j");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->memory_kind, MemoryKind::kHost);
  EXPECT_EQ(options->group_name, "load/op-test");
}

TEST(LoadCommunicatorOptionsTest, ADevicePartAsksForNcclOnTheWorkersGpu) {
  auto options = LoadCommunicatorOptions(Part(true), Config(3), "rank 0 of job j");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->memory_kind, MemoryKind::kDevice);
  EXPECT_EQ(options->cuda_device, 3);
  EXPECT_EQ(options->group_name, "load/op-test");
}

TEST(LoadCommunicatorOptionsTest, ADevicePartOnAWorkerWithoutAGpuIsRefusedSayingWhy) {
  auto options = LoadCommunicatorOptions(Part(true), Config(-1), "rank 0 of job j");
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(options.status().message(),
              HasSubstr("rank 0 of job j: the plan asks for the device exchange over NCCL "
                        "(every rank is device-resident) but this worker serves no GPU"));
}

TEST(JoinLoadCommunicatorTest, AHostPartJoinsAGlooGroupThroughTheStore) {
  InMemoryStore store;
  auto comm = JoinLoadCommunicator(Part(false), Config(-1), &store, "rank 0 of job j");
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend_name(), "gloo");
  EXPECT_EQ((*comm)->memory_kind(), MemoryKind::kHost);
  char byte = 7;
  EXPECT_TRUE((*comm)->Broadcast(&byte, 1, 0, absl::Now() + absl::Seconds(10)).ok());
}

TEST(JoinLoadCommunicatorTest, ADevicePartWithoutCudaReachesNcclAndNamesRankGroupAndTransport) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present: tests/device_e2e_test covers it";
  InMemoryStore store;
  auto comm = JoinLoadCommunicator(Part(true), Config(0), &store, "rank 0 of job j");
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  EXPECT_THAT(comm.status().message(),
              HasSubstr("rank 0 of job j: joining the load's communicator (nccl (device), group "
                        "load/op-test, 1 ranks, rendezvous at coordinator:1): no CUDA device"));
}

// An InMemoryStore that records every key set, to count the rendezvous an operation did.
class RecordingStore final : public Store {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value, absl::Time deadline) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      keys_.emplace(key);
    }
    return base_.Set(key, value, deadline);
  }
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override {
    return base_.Get(keys, deadline);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, absl::Time deadline) override {
    return base_.Add(key, delta, deadline);
  }
  // The keys set under `prefix` ("load/op-2/"), without it.
  std::set<std::string> KeysUnder(const std::string& prefix) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> out;
    for (const std::string& k : keys_) {
      if (absl::StartsWith(k, prefix)) out.insert(k.substr(prefix.size()));
    }
    return out;
  }

 private:
  InMemoryStore base_;
  mutable std::mutex mu_;
  std::set<std::string> keys_;
};

// One rank's side of an operation over a cache: whether it reused, and its outcome.
struct RankResult {
  absl::Status status;
  bool reused = false;
};

constexpr int kRanks = 3;

// The part of rank `r` of an operation whose communicator group is `group`.
pb::LoadPlanPart GroupPart(const std::string& group, int r) {
  pb::LoadPlanPart part;
  part.set_rank(r);
  part.set_world_size(kRanks);
  part.set_group(group);
  return part;
}

// Runs operation `group` on kRanks threads, rank r joining through caches[r] (one cache per
// worker): an all-to-all in which rank r sends peer p the byte 16 * r + p + salt, checked on
// arrival. Each rank puts its communicator back when its side succeeded.
std::vector<RankResult> RunOperation(Store* store, const std::string& group,
                                     std::vector<std::unique_ptr<CommunicatorCache>>& caches,
                                     int salt, absl::Duration exchange_timeout) {
  std::vector<RankResult> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const pb::LoadPlanPart part = GroupPart(group, r);
      const LoadCommunicatorConfig config = Config(-1);
      const std::string who = absl::StrCat("rank ", r, " of job j");
      absl::StatusOr<PartCommunicator> comm = JoinOrReuseLoadCommunicator(
          part, config, store, who, caches[r].get(), CommunicatorCacheKey(part, config));
      if (!comm.ok()) {
        results[r].status = comm.status();
        return;
      }
      results[r].reused = comm->reused();
      std::vector<char> send(kRanks), recv(kRanks, 0);
      for (int p = 0; p < kRanks; ++p) send[p] = static_cast<char>(16 * r + p + salt);
      const std::vector<size_t> ones(kRanks, 1);
      absl::Status s = comm->get().AllToAllV(send.data(), ones, recv.data(), ones,
                                             absl::Now() + exchange_timeout);
      for (int p = 0; s.ok() && p < kRanks; ++p) {
        if (recv[p] != static_cast<char>(16 * p + r + salt)) {
          s = absl::DataLossError(absl::StrCat("rank ", r, " got a wrong byte from rank ", p));
        }
      }
      comm->Finish(s);
      results[r].status = s;
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

std::vector<std::unique_ptr<CommunicatorCache>> Caches() {
  std::vector<std::unique_ptr<CommunicatorCache>> caches;
  for (int r = 0; r < kRanks; ++r) caches.push_back(std::make_unique<CommunicatorCache>(4));
  return caches;
}

void ExpectAll(const std::vector<RankResult>& results, bool reused) {
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(results[r].status.ok()) << "rank " << r << ": " << results[r].status;
    EXPECT_EQ(results[r].reused, reused) << "rank " << r;
  }
}

TEST(CommunicatorReuseTest, ASecondOperationOfTheSameRanksReusesTheCommunicatorWithoutARendezvous) {
  RecordingStore store;
  auto caches = Caches();
  ExpectAll(RunOperation(&store, "load/op-1", caches, 0, absl::Seconds(20)), false);
  EXPECT_TRUE(store.KeysUnder("load/op-1/").count("arrived/0"));  // the first one joined
  ExpectAll(RunOperation(&store, "load/op-2", caches, 1, absl::Seconds(20)), true);
  // Counted, not timed: the second operation only announced its tokens (no arrival, no
  // address exchange of the Gloo mesh, no TCP connects).
  EXPECT_EQ(store.KeysUnder("load/op-2/"),
            (std::set<std::string>{"reuse/0", "reuse/1", "reuse/2"}));
  ExpectAll(RunOperation(&store, "load/op-3", caches, 2, absl::Seconds(20)), true);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(caches[r]->stats().kept, 3) << "rank " << r;
    EXPECT_EQ(caches[r]->size(), 1u) << "rank " << r;
  }
}

TEST(CommunicatorReuseTest, ARestartedMemberMakesEveryRankJoinAnewAndTheBytesStillArrive) {
  RecordingStore store;
  auto caches = Caches();
  ExpectAll(RunOperation(&store, "load/op-1", caches, 0, absl::Seconds(20)), false);
  caches[1] = std::make_unique<CommunicatorCache>(4);  // rank 1's worker restarted: empty
  ExpectAll(RunOperation(&store, "load/op-2", caches, 5, absl::Seconds(20)), false);
  EXPECT_TRUE(store.KeysUnder("load/op-2/").count("arrived/2"));
  ExpectAll(RunOperation(&store, "load/op-3", caches, 9, absl::Seconds(20)), true);
}

TEST(CommunicatorReuseTest, RanksThatServedDifferentCallsNeverReuse) {
  RecordingStore store;
  auto caches = Caches();
  ExpectAll(RunOperation(&store, "load/op-1", caches, 0, absl::Seconds(20)), false);
  // Rank 0 alone makes one more call: its message slots are now ahead of its peers'.
  std::unique_ptr<CachedCommunicator> ahead =
      caches[0]->Take(CommunicatorCacheKey(GroupPart("load/op-1", 0), Config(-1)));
  ASSERT_NE(ahead, nullptr);
  ASSERT_TRUE(ahead->Send(nullptr, 0, 1, 7, absl::Now() + absl::Seconds(5)).ok());
  caches[0]->Put(CommunicatorCacheKey(GroupPart("load/op-1", 0), Config(-1)), std::move(ahead));
  ExpectAll(RunOperation(&store, "load/op-2", caches, 3, absl::Seconds(20)), false);
}

TEST(CommunicatorReuseTest,
     ABrokenCachedCommunicatorFailsNamingThePeerIsDroppedAndTheNextJoinsAnew) {
  RecordingStore store;
  auto caches = Caches();
  ExpectAll(RunOperation(&store, "load/op-1", caches, 0, absl::Seconds(20)), false);
  // Rank 2's worker lost its side of the connections (its communicator is gone) while its
  // cache still offers the same token: every rank agrees to reuse, and the exchange must fail
  // within its deadline naming the peer, not hang or deliver wrong bytes.
  const std::string key2 = CommunicatorCacheKey(GroupPart("load/op-1", 2), Config(-1));
  std::unique_ptr<CachedCommunicator> original = caches[2]->Take(key2);
  ASSERT_NE(original, nullptr);
  const std::string token = original->ReuseToken();
  original.reset();  // closes rank 2's connections to ranks 0 and 1
  // A stand-in with the same token whose peers are gone too: a group of its own, whose other
  // ranks have left.
  InMemoryStore side_store;
  std::vector<std::unique_ptr<Communicator>> side(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto made = JoinLoadCommunicator(GroupPart("load/side", r), Config(-1), &side_store, "side");
      if (made.ok()) side[r] = *std::move(made);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_NE(side[r], nullptr);
  auto stand_in = std::make_unique<CachedCommunicator>(std::move(side[2]), "load/op-1");
  ASSERT_TRUE(stand_in->Send(nullptr, 0, 0, 1, absl::Now() + absl::Seconds(5)).ok());
  side[0].reset();
  side[1].reset();
  ASSERT_EQ(stand_in->ReuseToken(), token);
  caches[2]->Put(key2, std::move(stand_in));

  std::vector<RankResult> broken = RunOperation(&store, "load/op-2", caches, 1, absl::Seconds(10));
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(broken[r].reused) << "rank " << r;
    ASSERT_FALSE(broken[r].status.ok()) << "rank " << r;
    EXPECT_NE(broken[r].status.code(), absl::StatusCode::kDataLoss) << broken[r].status;
    EXPECT_EQ(caches[r]->size(), 0u) << "rank " << r << " kept a broken communicator";
  }
  // The peer that is gone is named (rank 0 or 1 may first see the other close on it, and then
  // names rank 2 among the peers whose messages failed too).
  EXPECT_TRUE(absl::StrContains(broken[0].status.message(), "rank 2") ||
              absl::StrContains(broken[1].status.message(), "rank 2"))
      << broken[0].status << "\n"
      << broken[1].status;
  ExpectAll(RunOperation(&store, "load/op-3", caches, 2, absl::Seconds(20)), false);
  ExpectAll(RunOperation(&store, "load/op-4", caches, 4, absl::Seconds(20)), true);
}

}  // namespace
}  // namespace ckpt::worker
