// ExecuteExchangeLoadPart with every rank of a load as a thread of this process: parts planned by
// the coordinator's exchange-load planner (which is why this test sits in tests/: worker/ may not
// depend on coordinator/), the communicator formed through a real Rendezvous gRPC service on
// loopback, Gloo over loopback, a real checkpoint, and each rank's destination as a host tensor.
#include "worker/load_exchange_executor.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/load_exchange.h"
#include "exchange/communicator_cache.h"
#include "exchange/staging_arena.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "rendezvous/kv_store.h"
#include "rendezvous/loopback_rendezvous.h"
#include "rendezvous/rendezvous_service.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kRows = 8, kCols = 16;  // int32 w, stored as two 4-row pieces
constexpr int kRanks = 3;

int32_t Value(int64_t i, int64_t j) { return static_cast<int32_t>(1000 * i + j); }

// With `unused_file`: also tensor "unused" (int32 [4]) in its own data file, written by rank 2,
// which no load here asks for.
std::string WriteCheckpointOfW(const std::string& name, bool unused_file = false) {
  static const std::vector<int32_t> w = [] {
    std::vector<int32_t> v(kRows * kCols);
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) v[i * kCols + j] = Value(i, j);
    }
    return v;
  }();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "-", getpid());
  (void)RemoveTree(path);
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kI32, {kRows, kCols}}};
  for (int r = 0; r < 2; ++r) {
    DataFilePlan file;
    file.writer_rank = r;
    file.pieces.push_back(PieceData{"w", Region{{r * kRows / 2, 0}, {kRows / 2, kCols}, {}},
                                    w.data() + r * kRows / 2 * kCols, kRows / 2 * kCols * 4});
    contents.files.push_back(file);
  }
  static const int32_t unused[4] = {1, 2, 3, 4};
  if (unused_file) {
    contents.tensors.push_back(TensorMeta{"unused", DType::kI32, {4}});
    DataFilePlan file;
    file.writer_rank = 2;
    file.pieces.push_back(PieceData{"unused", Region{{0}, {4}, {}}, unused, sizeof(unused)});
    contents.files.push_back(file);
  }
  auto manifest = WriteCheckpoint(path, contents, WriteOptions());
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return path;
}

pb::PieceMeta Rows(int64_t first, int64_t count) {
  pb::PieceMeta s;
  s.mutable_tensor()->set_key("w");
  s.mutable_tensor()->set_dtype(pb::DTYPE_I32);
  s.mutable_tensor()->add_global_shape(kRows);
  s.mutable_tensor()->add_global_shape(kCols);
  s.mutable_region()->add_offsets(first);
  s.mutable_region()->add_offsets(0);
  s.mutable_region()->add_lengths(count);
  s.mutable_region()->add_lengths(kCols);
  return s;
}

// Ranks 0 and 1 hold all of w; rank 2 holds rows 2-6 (straddling both stored pieces).
std::vector<pb::PieceMeta> RankShards() { return {Rows(0, kRows), Rows(0, kRows), Rows(2, 5)}; }

class LoadExchangeExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(rendezvous_.ok()); }

  // The parts of a load of `path` into RankShards() with `algorithm`.
  std::vector<pb::LoadPlanPart> Plan(const std::string& path, const std::string& id,
                                     pb::LoadAlgorithm algorithm, int64_t budget) {
    coordinator::Operation op;
    op.id = id;
    op.job = "j";
    op.kind = coordinator::OperationKind::kLoad;
    op.path = path;
    op.world_size = kRanks;
    op.ranks.resize(kRanks);
    const std::vector<pb::PieceMeta> shards = RankShards();
    for (int r = 0; r < kRanks; ++r) op.ranks[r].shards = {shards[r]};
    auto plans =
        coordinator::PlanExchangeLoad(op, coordinator::LoadPlannerOptions{algorithm, budget});
    EXPECT_TRUE(plans.ok()) << plans.status();
    std::vector<pb::LoadPlanPart> parts(kRanks);
    for (int r = 0; plans.ok() && r < kRanks; ++r) {
      EXPECT_TRUE(parts[r].ParseFromString((*plans)[r].part.Bytes()));
    }
    return parts;
  }

  // Rank r's session: job j, one host tensor (its shard) in `memory`.
  static SessionInfo Session(int r, std::vector<int32_t>* memory) {
    const pb::PieceMeta shard = RankShards()[r];
    const int64_t elements = shard.region().lengths(0) * shard.region().lengths(1);
    memory->assign(elements, -1);
    SessionInfo session;
    session.trainer.job = "j";
    session.trainer.rank = r;
    session.trainer.world_size = kRanks;
    RegisteredTensor t;
    t.shard = shard;
    t.memory_kind = pb::MEMORY_HOST;
    t.nbytes = elements * 4;
    t.data = reinterpret_cast<std::byte*>(memory->data());
    session.tensors.push_back(t);
    return session;
  }

  // What each rank's worker keeps across operations (one entry per rank, as one worker each).
  struct Workers {
    std::vector<std::unique_ptr<StagingArenaPool>> buffers;
    std::vector<std::unique_ptr<ShardBufferPool>> reads;
    std::vector<std::unique_ptr<CommunicatorCache>> communicators;
  };
  static Workers MakeWorkers() {
    Workers w;
    for (int r = 0; r < kRanks; ++r) {
      w.buffers.push_back(std::make_unique<StagingArenaPool>(1 << 20));
      w.reads.push_back(std::make_unique<ShardBufferPool>(1 << 20));
      w.communicators.push_back(std::make_unique<CommunicatorCache>(4));
    }
    return w;
  }

  // Runs every rank's part at once; each rank's status, its tensor in memory[r].
  // With `workers`: rank r's exchange buffers, read buffers and communicator come from worker
  // r's pools and cache, and (*reused)[r] says whether its communicator was reused.
  std::vector<absl::Status> RunAll(const std::vector<pb::LoadPlanPart>& parts,
                                   std::vector<std::vector<int32_t>>* memory,
                                   const Workers* workers = nullptr,
                                   std::vector<char>* reused = nullptr) {
    memory->assign(kRanks, {});
    // One byte per rank, never std::vector<bool>: its elements share words, so the rank threads'
    // writes below would race and lose each other's flags.
    if (reused != nullptr) reused->assign(kRanks, 0);
    std::vector<SessionInfo> sessions;
    for (int r = 0; r < kRanks; ++r) sessions.push_back(Session(r, &(*memory)[r]));
    std::vector<absl::Status> statuses(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        MemoryGate gate;
        ExchangeLoadStats stats;
        ExchangeLoadContext context = Context();
        if (workers != nullptr) {
          context.buffers = workers->buffers[r].get();
          context.read_buffers = workers->reads[r].get();
          context.communicators = workers->communicators[r].get();
        }
        statuses[r] = ExecuteExchangeLoadPart(parts[r], sessions[r], context, gate, &stats);
        if (reused != nullptr) (*reused)[r] = stats.communicator_reused ? 1 : 0;
      });
    }
    for (std::thread& t : threads) t.join();
    return statuses;
  }

  ExchangeLoadContext Context(StagingArenaPool* buffers = nullptr) const {
    ExchangeLoadContext context;
    context.buffers = buffers;
    context.rendezvous_address = rendezvous_.address();
    context.rendezvous_timeout = absl::Seconds(30);
    context.exchange_timeout = absl::Seconds(60);
    context.gloo_loop_thread_nice = 0;
    return context;
  }

  LoopbackRendezvous rendezvous_;
};

TEST_F(LoadExchangeExecutorTest, EveryAlgorithmFillsEachRanksTensorReadingEachStoredByteOnce) {
  const std::string path = WriteCheckpointOfW("exchange-load");
  int n = 0;
  for (pb::LoadAlgorithm algorithm : {pb::LOAD_BROADCAST, pb::LOAD_OVERLAP_ALL_TO_ALL,
                                      pb::LOAD_GATHER_ROUNDS, pb::LOAD_GATHER_OBJECT}) {
    SCOPED_TRACE(pb::LoadAlgorithm_Name(algorithm));
    // A budget of 200 bytes: a 256-byte stored piece is read in several units and waves.
    std::vector<pb::LoadPlanPart> parts =
        Plan(path, absl::StrCat("op-", ++n), algorithm, /*budget=*/200);
    ASSERT_EQ(parts.size(), static_cast<size_t>(kRanks));
    EXPECT_GT(parts[0].waves_size(), 1);
    std::vector<std::vector<int32_t>> memory(kRanks);
    std::vector<SessionInfo> sessions;
    for (int r = 0; r < kRanks; ++r) sessions.push_back(Session(r, &memory[r]));
    std::vector<absl::Status> statuses(kRanks);
    std::vector<ExchangeLoadStats> stats(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        MemoryGate gate;
        statuses[r] = ExecuteExchangeLoadPart(parts[r], sessions[r], Context(), gate, &stats[r]);
      });
    }
    for (std::thread& t : threads) t.join();
    int64_t read = 0;
    const std::vector<pb::PieceMeta> shards = RankShards();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
      const pb::Region& region = shards[r].region();
      for (int64_t i = 0; i < region.lengths(0); ++i) {
        for (int64_t j = 0; j < kCols; ++j) {
          ASSERT_EQ(memory[r][i * kCols + j], Value(region.offsets(0) + i, j))
              << "rank " << r << " element " << i << "," << j;
        }
      }
      EXPECT_EQ(stats[r].bytes_scattered, region.lengths(0) * kCols * 4) << "rank " << r;
      read += stats[r].bytes_read;
    }
    EXPECT_EQ(read, kRows * kCols * 4);
  }
}

// Issue 40: a worker's exchange staging and receive buffers are faulted in once, not once per
// operation: a second load of the same shapes maps no new block.
TEST_F(LoadExchangeExecutorTest, ASecondLoadReceivesIntoTheFirstLoadsBuffersWithoutMappingAgain) {
  const std::string path = WriteCheckpointOfW("exchange-load-reuse");
  const Workers workers = MakeWorkers();
  std::vector<int64_t> mapped(kRanks), allocated(kRanks);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    std::vector<pb::LoadPlanPart> parts =
        Plan(path, absl::StrCat("op-reuse-", run), pb::LOAD_OVERLAP_ALL_TO_ALL, /*budget=*/200);
    std::vector<std::vector<int32_t>> memory;
    std::vector<absl::Status> statuses = RunAll(parts, &memory, &workers);
    const std::vector<pb::PieceMeta> shards = RankShards();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
      const pb::Region& region = shards[r].region();
      for (int64_t i = 0; i < region.lengths(0); ++i) {
        for (int64_t j = 0; j < kCols; ++j) {
          ASSERT_EQ(memory[r][i * kCols + j], Value(region.offsets(0) + i, j)) << "rank " << r;
        }
      }
      const StagingPoolStats stats = workers.buffers[r]->stats();
      EXPECT_EQ(stats.leases, 2 * (run + 1)) << "rank " << r;
      EXPECT_EQ(stats.arenas, 2) << "rank " << r;
      // The units a rank reads (and sends) go into buffers kept across waves and loads.
      const ShardBufferPoolStats reads = workers.reads[r]->stats();
      if (run == 0) {
        EXPECT_GT(stats.mappings, 0) << "rank " << r << " received into memory of its own";
        mapped[r] = stats.mappings;
        allocated[r] = reads.allocated;
      } else {
        EXPECT_EQ(stats.mappings, mapped[r]) << "rank " << r << " mapped new exchange buffers";
        EXPECT_EQ(reads.allocated, allocated[r]) << "rank " << r << " read into new buffers";
        if (allocated[r] > 0) {  // a reader
          EXPECT_GT(reads.reused, 0) << "rank " << r;
        }
      }
    }
  }
}

// Issue 40: the next load of the same ranks reuses the communicator of the last one (no mesh
// rendezvous through the coordinator, no TCP connects) and still delivers the right bytes; a
// rank whose worker restarted (an empty cache) makes every rank join anew.
TEST_F(LoadExchangeExecutorTest, TheNextLoadOfTheSameRanksReusesTheirCommunicator) {
  const std::string path = WriteCheckpointOfW("exchange-load-communicator");
  Workers workers = MakeWorkers();
  // Run 2 follows a restart of rank 1's worker.
  const std::vector<bool> expect_reused = {false, true, false, true};
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(run);
    if (run == 2) workers.communicators[1] = std::make_unique<CommunicatorCache>(4);
    const pb::LoadAlgorithm algorithm =
        run % 2 == 0 ? pb::LOAD_OVERLAP_ALL_TO_ALL : pb::LOAD_BROADCAST;
    std::vector<pb::LoadPlanPart> parts =
        Plan(path, absl::StrCat("op-communicator-", run), algorithm, /*budget=*/200);
    std::vector<std::vector<int32_t>> memory;
    std::vector<char> reused;
    std::vector<absl::Status> statuses = RunAll(parts, &memory, &workers, &reused);
    const std::vector<pb::PieceMeta> shards = RankShards();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
      EXPECT_EQ(reused[r] != 0, expect_reused[run]) << "rank " << r;
      const pb::Region& region = shards[r].region();
      for (int64_t i = 0; i < region.lengths(0) * kCols; ++i) {
        ASSERT_EQ(memory[r][i], Value(region.offsets(0) + i / kCols, i % kCols)) << r << " " << i;
      }
      EXPECT_EQ(workers.communicators[r]->size(), 1u) << "rank " << r;
    }
  }
}

TEST_F(LoadExchangeExecutorTest, EachRankReadsThroughItsShareWithoutTheDataFilesNobodyReads) {
  const std::string path = WriteCheckpointOfW("exchange-load-share", /*unused_file=*/true);
  for (pb::LoadAlgorithm algorithm : {pb::LOAD_BROADCAST, pb::LOAD_OVERLAP_ALL_TO_ALL}) {
    SCOPED_TRACE(pb::LoadAlgorithm_Name(algorithm));
    std::vector<pb::LoadPlanPart> parts =
        Plan(path, absl::StrCat("op-share-", algorithm), algorithm, /*budget=*/200);
    ASSERT_EQ(parts.size(), static_cast<size_t>(kRanks));
    for (const pb::LoadPlanPart& part : parts) ASSERT_FALSE(part.manifest_share().empty());
    // After planning, the file of "unused" goes: a worker that opened the whole checkpoint
    // (its manifest lists that file) would refuse it; through its share none looks at it.
    const std::string unused_file = JoinPath(path, "data/r2_0.safetensors");
    ASSERT_TRUE(FileSize(unused_file).ok());
    ASSERT_EQ(::rename(unused_file.c_str(), (unused_file + ".away").c_str()), 0);
    std::vector<std::vector<int32_t>> memory;
    std::vector<absl::Status> statuses = RunAll(parts, &memory);
    const std::vector<pb::PieceMeta> shards = RankShards();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
      const pb::Region& region = shards[r].region();
      for (int64_t i = 0; i < region.lengths(0) * kCols; ++i) {
        ASSERT_EQ(memory[r][i], Value(region.offsets(0) + i / kCols, i % kCols)) << r << " " << i;
      }
    }
    // The same parts without their shares open the whole checkpoint and stop at the missing
    // file, naming it (the parts' units index the shares, but nothing runs that far).
    for (pb::LoadPlanPart& part : parts) part.clear_manifest_share();
    statuses = RunAll(parts, &memory);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_FALSE(statuses[r].ok()) << "rank " << r;
      EXPECT_TRUE(absl::StrContains(statuses[r].message(), "r2_0.safetensors")) << statuses[r];
    }
    ASSERT_EQ(::rename((unused_file + ".away").c_str(), unused_file.c_str()), 0);
    // With every file there, a worker that ignores the share (one that predates shares) is
    // refused by the units' piece -1 ("inconsistent delivery in the plan"), not misled into
    // reading other pieces of the whole manifest.
    statuses = RunAll(parts, &memory);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInvalidArgument) << statuses[r];
      EXPECT_TRUE(absl::StrContains(statuses[r].message(), "in the plan")) << statuses[r];
    }
  }
}

TEST_F(LoadExchangeExecutorTest, ClosedGateStopsThePartWithItsReasonInsteadOfWaitingForPeers) {
  const std::string path = WriteCheckpointOfW("exchange-load-aborted");
  std::vector<pb::LoadPlanPart> parts = Plan(path, "op-aborted", pb::LOAD_BROADCAST, 1 << 20);
  std::vector<int32_t> memory;
  SessionInfo session = Session(0, &memory);
  MemoryGate gate;
  gate.Close(absl::AbortedError("operation op-aborted aborted: rank 2 never arrived"));
  ExchangeLoadStats stats;
  const absl::Time start = absl::Now();
  // Ranks 1 and 2 never come: only the closed gate can end the wait before its 30 s timeout.
  absl::Status s = ExecuteExchangeLoadPart(parts[0], session, Context(), gate, &stats);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 2 never arrived")) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(memory, std::vector<int32_t>(memory.size(), -1));
}

}  // namespace
}  // namespace ckpt::worker
