// Property test of own-share load plan parts (coordinator/plan_parts.h): on random problems,
// every rank running its exchange from its own share of the plan writes exactly the same bytes
// into each of its requests, and sends and receives exactly as many bytes, as from the whole
// plan (its brute-force twin: LoadPlannerOptions::own_shares = false), for each algorithm that
// splits, with process groups, and with serving participants (live-transfer receives, whose
// readers are extra ranks; verify mode's checksums included). The ranks are threads over real
// Gloo communicators; the coordinator's planner and the worker's wave planning
// (worker/load_wave_plan.h) are the real ones; the storage reads come from the reference bytes.
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/load_exchange.h"
#include "coordinator/plan_parts.h"
#include "exchange/communicator_factory.h"
#include "exchange/exchange.h"
#include "exchange/exchange_testing.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "proto/wire_names.h"
#include "rendezvous/store.h"
#include "sharding/overlap.h"
#include "worker/load_wave_plan.h"
#include "worker/transfer_verify.h"

namespace ckpt {
namespace {

using coordinator::LoadPlannerOptions;
using coordinator::Operation;
using coordinator::RankPlan;

// A random load: a checkpoint's manifest, the operation (ranks' requests), the readers allowed
// per piece (serving participants) and the planner's options.
struct Problem {
  pb::Manifest manifest;
  Operation op;
  std::vector<std::vector<int64_t>> readers_of_piece;
  LoadPlannerOptions options;
};

// What one rank ended with.
struct RankResult {
  absl::Status status;
  std::map<int, std::string> request_bytes;  // by local index
  int64_t sent = 0;
  int64_t received = 0;
};

PieceSpec SpecOf(const pb::Manifest& m, const std::string& key, const Region& region) {
  PieceSpec s;
  for (const pb::TensorMeta& t : m.tensors()) {
    if (t.key() != key) continue;
    s.dtype = *DTypeFromProto(t.dtype());
    s.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
  }
  s.region = region;
  s.id = PieceId{key, region.offsets, region.flat};
  return s;
}

// Tensors "a" (i32) and "b" (f32) of [rows, cols], each stored as random row chunks.
void AddTensors(std::mt19937_64& rng, Problem* p) {
  for (const auto& [key, dtype] : {std::pair<std::string, pb::DType>{"a", pb::DTYPE_I32},
                                   std::pair<std::string, pb::DType>{"b", pb::DTYPE_F32}}) {
    const int64_t rows = 2 + rng() % 9, cols = 1 + rng() % 4;
    pb::TensorMeta* t = p->manifest.add_tensors();
    t->set_key(key);
    t->set_dtype(dtype);
    t->add_global_shape(rows);
    t->add_global_shape(cols);
    for (int64_t first = 0; first < rows;) {
      const int64_t n = std::min<int64_t>(rows - first, 1 + rng() % 4);
      pb::StoredPiece* piece = p->manifest.add_pieces();
      piece->set_key(key);
      *piece->mutable_region() = RegionToProto(Region{{first, 0}, {n, cols}, std::nullopt});
      piece->set_file(absl::StrCat("data/", key, first, ".safetensors"));
      piece->set_byte_length(n * cols * 4);
      first += n;
    }
  }
}

// `ranks` ranks, each wanting a random row range of each tensor (some replicated, some not
// main replicas); then `serving` serving participants that alone may read the pieces.
Problem MakeProblem(uint64_t seed, pb::LoadAlgorithm algorithm, int ranks, int serving,
                    const std::string& groups) {
  std::mt19937_64 rng(seed);
  Problem p;
  AddTensors(rng, &p);
  p.op.id = absl::StrCat("op-", seed);
  p.op.job = "j";
  p.op.kind = coordinator::OperationKind::kLoad;
  p.op.path = "/nonexistent";
  p.op.process_groups = groups;
  p.op.ranks.resize(ranks + serving);
  for (int r = 0; r < ranks; ++r) {
    std::vector<pb::PieceMeta> pieces;
    for (const pb::TensorMeta& t : p.manifest.tensors()) {
      if (rng() % 5 == 0) continue;
      const int64_t rows = t.global_shape(0);
      const int64_t first = rng() % rows, n = 1 + rng() % (rows - first);
      pb::PieceMeta s;
      *s.mutable_tensor() = t;
      *s.mutable_region() = RegionToProto(Region{{first, 0}, {n, t.global_shape(1)}, std::nullopt});
      s.add_replica_id(rng() % 3 == 0 ? 1 : 0);
      pieces.push_back(std::move(s));
    }
    p.op.ranks[r].shards = RankPieces(pieces);
  }
  for (int s = 0; s < serving; ++s) p.op.ranks[ranks + s].serving = true;
  p.op.world_size = ranks + serving;
  if (serving > 0) {
    p.readers_of_piece.resize(p.manifest.pieces_size());
    for (auto& readers : p.readers_of_piece) {
      for (int s = 0; s < serving; ++s) {
        if (readers.empty() || rng() % 2 == 0) readers.push_back(ranks + s);
      }
    }
  }
  p.options.algorithm = algorithm;
  p.options.memory_budget_bytes = 16 + rng() % 96;  // several waves
  return p;
}

absl::StatusOr<std::vector<pb::LoadPlanPart>> Plan(const Problem& p, bool own_shares) {
  LoadPlannerOptions options = p.options;
  options.own_shares = own_shares;
  absl::StatusOr<std::vector<RankPlan>> plans =
      coordinator::PlanExchangeLoadFrom(p.op, options, p.manifest, p.readers_of_piece);
  if (!plans.ok()) return plans.status();
  std::vector<pb::LoadPlanPart> parts(plans->size());
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r].ParseFromString((*plans)[r].part.Bytes())) return absl::InternalError("parse");
  }
  return parts;
}

// Runs one wave of `part` on rank `me`: reads, exchange, verify checksums, scatter.
absl::Status RunWave(const pb::LoadPlanPart& part, int w, const pb::Manifest& manifest,
                     const worker::TensorLookup& tensors,
                     const std::vector<worker::LoadRequest>& requests, int me, Communicator& comm,
                     RankResult* result) {
  const bool narrow = part.algorithm() == pb::LOAD_OVERLAP_ALL_TO_ALL;
  absl::StatusOr<worker::WaveExchange> wave =
      worker::BuildWaveExchange(part.waves(w), manifest, tensors, requests, me, part.world_size(),
                                narrow, absl::StrCat("wave ", w));
  if (!wave.ok()) return wave.status();
  wave->plan.own_share = part.own_share();
  ShardBuffers loaded;
  for (const worker::UnitRead& u : wave->reads) {
    const pb::StoredPiece& piece = manifest.pieces(u.piece);
    const std::string stored =
        ReferenceRegionBytes(SpecOf(manifest, piece.key(), *RegionFromProto(piece.region())));
    loaded[u.id] = stored.substr(u.begin, u.end - u.begin);
  }
  absl::StatusOr<std::vector<uint64_t>> checksums =
      worker::ChecksumsOfReadUnits(wave->plan, me, loaded, "here");
  if (!checksums.ok()) return checksums.status();
  ExchangeOptions options;
  options.memory_budget_bytes = part.memory_budget_bytes();
  options.deadline = absl::Now() + absl::Seconds(60);
  ExchangeReport report;
  absl::StatusOr<ShardBuffers> received = ExchangeByDistribution(
      LoadAlgorithmName(part.algorithm()), comm, wave->plan, loaded, options, &report);
  if (!received.ok()) return received.status();
  result->sent += report.bytes_sent();
  result->received += report.bytes_received();
  if (part.algorithm() == pb::LOAD_BROADCAST) {
    absl::Status verified = worker::VerifyReceivedUnits(
        part, part.waves(w), wave->plan, me, *checksums, *received, comm, options.deadline, "here");
    if (!verified.ok()) return verified;
  }
  const std::vector<PieceSpec>& needs = wave->plan.needs[me];
  for (size_t i = 0; i < needs.size(); ++i) {
    for (int q : wave->my_targets[i]) {
      const worker::LoadRequest& request = requests[q];
      absl::StatusOr<std::vector<CopyRun>> runs =
          OverlapRuns(needs[i].region, request.region, request.shape);
      if (!runs.ok()) return runs.status();
      CopyRuns(*runs, DTypeSize(request.dtype), received->at(needs[i].id).data(), request.dest);
    }
  }
  return absl::OkStatus();
}

// Runs `part` (its group's communicator over `store`) on its rank.
RankResult RunPart(const pb::LoadPlanPart& part, const pb::Manifest& manifest, Store* store) {
  RankResult result;
  const int me = part.group_ranks_size() > 0 ? part.group_rank() : part.rank();
  worker::TensorLookup tensors = [&manifest](const std::string& key) -> const pb::TensorMeta* {
    for (const pb::TensorMeta& t : manifest.tensors()) {
      if (t.key() == key) return &t;
    }
    return nullptr;
  };
  absl::StatusOr<std::vector<worker::LoadRequest>> requests =
      worker::ResolveRequests(part, tensors, "here");
  if (!requests.ok()) {
    result.status = requests.status();
    return result;
  }
  for (worker::LoadRequest& q : *requests) {
    if (q.rank != me) continue;
    std::string& bytes = result.request_bytes[q.local_index];
    bytes.assign(q.region.NumElements() * DTypeSize(q.dtype), '\xee');
    q.dest = bytes.data();
  }
  result.status = worker::CheckDeliveriesTileRequests(part, manifest, *requests, me, "here");
  if (!result.status.ok()) return result;
  CommunicatorOptions options;
  options.group_name = part.group();
  // The event-loop threads at the test's own priority: at the daemons' default (nice +10, so
  // that a worker never takes CPU from training) they starve behind the other tests CI runs on
  // the same cores, and a run that takes 7 s alone overran its 300 s limit there.
  options.gloo_loop_thread_nice = 0;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(store, me, part.world_size(), options, absl::Now() + absl::Seconds(60));
  if (!comm.ok()) {
    result.status = comm.status();
    return result;
  }
  for (int w = 0; w < part.waves_size() && result.status.ok(); ++w) {
    result.status = RunWave(part, w, manifest, tensors, *requests, me, **comm, &result);
  }
  return result;
}

// Runs every rank's part, each group on its own communicator, all at once.
std::vector<RankResult> RunAll(const std::vector<pb::LoadPlanPart>& parts,
                               const pb::Manifest& manifest) {
  InMemoryStore store;
  std::vector<RankResult> results(parts.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < parts.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = RunPart(parts[r], manifest, &store); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Plans `p` both ways, runs both and compares rank by rank; returns the parts' total bytes
// (own shares, whole plans).
std::pair<size_t, size_t> CheckOwnSharesMatchTheWholePlan(const Problem& p) {
  absl::StatusOr<std::vector<pb::LoadPlanPart>> shares = Plan(p, true);
  absl::StatusOr<std::vector<pb::LoadPlanPart>> wholes = Plan(p, false);
  EXPECT_TRUE(shares.ok()) << shares.status();
  EXPECT_TRUE(wholes.ok()) << wholes.status();
  if (!shares.ok() || !wholes.ok()) return {0, 0};
  const std::vector<RankResult> own = RunAll(*shares, p.manifest);
  const std::vector<RankResult> twin = RunAll(*wholes, p.manifest);
  size_t share_bytes = 0, whole_bytes = 0;
  for (size_t r = 0; r < own.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE((*shares)[r].own_share());
    share_bytes += (*shares)[r].ByteSizeLong();
    whole_bytes += (*wholes)[r].ByteSizeLong();
    EXPECT_TRUE(twin[r].status.ok()) << twin[r].status;
    EXPECT_TRUE(own[r].status.ok()) << own[r].status;
    if (!own[r].status.ok() || !twin[r].status.ok()) continue;
    EXPECT_EQ(own[r].request_bytes, twin[r].request_bytes);
    EXPECT_EQ(own[r].sent, twin[r].sent);
    EXPECT_EQ(own[r].received, twin[r].received);
    for (int index = 0; index < p.op.ranks[r].shards.size(); ++index) {  // and the right bytes
      const pb::PieceMeta s = p.op.ranks[r].shards.Piece(index);
      const std::string want =
          ReferenceRegionBytes(SpecOf(p.manifest, s.tensor().key(), *RegionFromProto(s.region())));
      EXPECT_EQ(own[r].request_bytes.at(index), want) << s.tensor().key();
    }
  }
  return {share_bytes, whole_bytes};
}

const pb::LoadAlgorithm kSplitting[] = {pb::LOAD_BROADCAST, pb::LOAD_GATHER_ROUNDS,
                                        pb::LOAD_GATHER_OBJECT, pb::LOAD_OVERLAP_ALL_TO_ALL};

TEST(PlanPartsPropertyTest, OwnSharesWriteWhatTheWholePlanWritesForEveryAlgorithm) {
  for (pb::LoadAlgorithm algorithm : kSplitting) {
    size_t shares = 0, wholes = 0;
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      SCOPED_TRACE(absl::StrCat(LoadAlgorithmName(algorithm), " seed ", seed));
      auto [s, w] =
          CheckOwnSharesMatchTheWholePlan(MakeProblem(seed, algorithm, 2 + seed % 4, 0, ""));
      shares += s;
      wholes += w;
    }
    EXPECT_LT(shares, wholes) << LoadAlgorithmName(algorithm);
  }
}

TEST(PlanPartsPropertyTest, OwnSharesMatchTheWholePlanWithinProcessGroups) {
  for (pb::LoadAlgorithm algorithm : kSplitting) {
    for (uint64_t seed = 20; seed < 26; ++seed) {
      SCOPED_TRACE(absl::StrCat(LoadAlgorithmName(algorithm), " seed ", seed));
      CheckOwnSharesMatchTheWholePlan(
          MakeProblem(seed, algorithm, 5, 0, seed % 2 == 0 ? "0,2,4;1,3" : "0,1;2,3,4"));
    }
  }
}

TEST(PlanPartsPropertyTest, OwnSharesMatchTheWholePlanWithServingParticipants) {
  for (pb::LoadAlgorithm algorithm : kSplitting) {
    for (uint64_t seed = 40; seed < 46; ++seed) {
      SCOPED_TRACE(absl::StrCat(LoadAlgorithmName(algorithm), " seed ", seed));
      CheckOwnSharesMatchTheWholePlan(MakeProblem(seed, algorithm, 2 + seed % 3, 1 + seed % 2, ""));
    }
  }
}

}  // namespace
}  // namespace ckpt
