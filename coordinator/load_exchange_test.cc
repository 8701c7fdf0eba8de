#include "coordinator/load_exchange.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/two_row_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "storage/checkpoint_writer.h"
#include "storage/manifest_file.h"
#include "storage/manifest_share.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

std::vector<pb::LoadPlanPart> Parts(const std::vector<RankPlan>& plans) {
  std::vector<pb::LoadPlanPart> parts(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    EXPECT_TRUE(parts[r].ParseFromString(plans[r].part.Bytes()));
  }
  return parts;
}

// Elements read per stored piece (by its row), over every wave's units each rank reads itself
// (an own-share part lists the units its rank reads; with gather_rounds and broadcast also
// others').
std::map<int, int64_t> ElementsReadPerPiece(const std::vector<pb::LoadPlanPart>& parts) {
  std::map<int, int64_t> read;
  for (int r = 0; r < static_cast<int>(parts.size()); ++r) {
    for (const pb::LoadWaveEntry& w : parts[r].waves()) {
      for (const pb::LoadUnitEntry& u : w.units()) {
        const int row = static_cast<int>(UnitPiece(parts[r], u).region().offsets(0));
        if (u.reader() == r) read[row] += u.num_elements();
      }
    }
  }
  return read;
}

TEST(LoadExchangeTest, EveryStoredPieceIsReadOnceByARankThatNeedsIt) {
  const std::string path = WriteTwoRowCheckpoint("read-once");
  Operation op = ThreeRankLoad(path);
  auto plans = PlanExchangeLoad(op, LoadPlannerOptions{pb::LOAD_BROADCAST, 1 << 20});
  ASSERT_TRUE(plans.ok()) << plans.status();
  std::vector<pb::LoadPlanPart> parts = Parts(*plans);
  ASSERT_EQ(parts.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(parts[r].rank(), r);
    EXPECT_EQ(parts[r].algorithm(), pb::LOAD_BROADCAST);
    EXPECT_EQ(parts[r].world_size(), 3);
    EXPECT_EQ(parts[r].group(), "load/op-9");
    // Every rank runs the same waves, but gets only its own share of them: its own requests
    // and deliveries (coordinator/plan_parts.h).
    EXPECT_EQ(parts[r].waves_size(), parts[0].waves_size());
    EXPECT_TRUE(parts[r].own_share());
    ASSERT_EQ(parts[r].requests_size(), 1);
    EXPECT_EQ(parts[r].requests(0).rank(), r);
  }
  EXPECT_EQ((*plans)[0].bytes, 32);
  EXPECT_EQ((*plans)[2].bytes, 16);
  for (int r = 0; r < 3; ++r) {
    for (const pb::LoadWaveEntry& w : parts[r].waves()) {
      for (const pb::LoadUnitEntry& u : w.units()) {
        // Row 0 is needed by ranks 0 and 1 only; row 1 by all three.
        if (UnitPiece(parts[r], u).region().offsets(0) == 0) {
          EXPECT_LT(u.reader(), 2);
        }
      }
      for (const pb::LoadDeliveryEntry& d : w.deliveries()) {
        if (d.request() == -1) {
          EXPECT_NE(d.dst_rank(), r);  // a witness that another rank receives the unit
        } else {
          EXPECT_EQ(d.dst_rank(), r);
          EXPECT_EQ(parts[r].requests(d.request()).rank(), r);
        }
      }
    }
  }
  EXPECT_THAT(ElementsReadPerPiece(parts),
              ::testing::UnorderedElementsAre(::testing::Pair(0, 4), ::testing::Pair(1, 4)));
}

// A stored piece's identity for comparing shares with the manifest: key and region.
std::string PieceName(const pb::StoredPiece& p) {
  return absl::StrCat(p.key(), " ", p.region().ShortDebugString());
}

TEST(LoadExchangeTest, EachPartsShareHoldsExactlyThePiecesItsUnitsRead) {
  const std::string path = WriteTwoRowCheckpoint("shares");
  const Operation op = ThreeRankLoad(path);
  absl::StatusOr<pb::Manifest> manifest = ReadManifestFile(path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (pb::LoadAlgorithm algorithm : {pb::LOAD_BROADCAST, pb::LOAD_OVERLAP_ALL_TO_ALL,
                                      pb::LOAD_GATHER_ROUNDS, pb::LOAD_GATHER_OBJECT}) {
    for (bool own_shares : {true, false}) {
      SCOPED_TRACE(absl::StrCat(pb::LoadAlgorithm_Name(algorithm), own_shares ? " own" : ""));
      LoadPlannerOptions options{algorithm, /*budget=*/8};  // pieces split into several units
      options.own_shares = own_shares;
      auto plans = PlanExchangeLoad(op, options);
      ASSERT_TRUE(plans.ok()) << plans.status();
      // The same plan over the whole manifest: its units index the manifest's pieces.
      auto whole = PlanExchangeLoadFrom(op, options, *manifest, {});
      ASSERT_TRUE(whole.ok()) << whole.status();
      const std::vector<pb::LoadPlanPart> parts = Parts(*plans), twins = Parts(*whole);
      for (int r = 0; r < 3; ++r) {
        SCOPED_TRACE(absl::StrCat("rank ", r));
        EXPECT_TRUE(twins[r].manifest_share().empty());
        pb::ManifestShare share;
        ASSERT_TRUE(share.ParseFromString(parts[r].manifest_share()));
        absl::StatusOr<pb::Manifest> read = ExpandManifestShare(share);
        ASSERT_TRUE(read.ok()) << read.status();
        std::set<std::string> expected_read, expected_files, listed_read, listed_files;
        ASSERT_EQ(parts[r].waves_size(), twins[r].waves_size());
        for (int w = 0; w < parts[r].waves_size(); ++w) {
          ASSERT_EQ(parts[r].waves(w).units_size(), twins[r].waves(w).units_size());
          for (int k = 0; k < parts[r].waves(w).units_size(); ++k) {
            const pb::LoadUnitEntry& u = parts[r].waves(w).units(k);
            const pb::StoredPiece& stored = manifest->pieces(twins[r].waves(w).units(k).piece());
            // Each unit names, through the share, the piece the whole plan's unit names.
            EXPECT_EQ(PieceName(UnitPiece(parts[r], u)), PieceName(stored));
            if (u.reader() != r) continue;
            expected_read.insert(PieceName(stored));
            expected_files.insert(stored.file());
            // A piece this rank reads is in the share in full, as the manifest records it.
            EXPECT_EQ(u.piece(), -1);  // a worker that predates shares refuses the unit
            ASSERT_LT(u.share_piece(), read->pieces_size());
            pb::StoredPiece in_share = read->pieces(u.share_piece());
            EXPECT_EQ(in_share.SerializeAsString(), stored.SerializeAsString());
          }
        }
        for (const pb::StoredPiece& p : read->pieces()) listed_read.insert(PieceName(p));
        for (const pb::DataFile& f : read->files()) listed_files.insert(f.name());
        EXPECT_EQ(listed_read, expected_read);
        EXPECT_EQ(static_cast<size_t>(read->pieces_size()), expected_read.size());
        EXPECT_EQ(listed_files, expected_files);
        EXPECT_EQ(share.tensors_size(), 1);  // "w", of the requests and units
      }
    }
  }
}

TEST(LoadExchangeTest, ASmallBudgetSplitsPiecesIntoSeveralWavesStillReadingEachByteOnce) {
  const std::string path = WriteTwoRowCheckpoint("small-budget");
  Operation op = ThreeRankLoad(path);
  auto plans = PlanExchangeLoad(op, LoadPlannerOptions{pb::LOAD_OVERLAP_ALL_TO_ALL, 8});
  ASSERT_TRUE(plans.ok()) << plans.status();
  std::vector<pb::LoadPlanPart> parts = Parts(*plans);
  EXPECT_GT(parts[0].waves_size(), 1);
  for (const pb::LoadWaveEntry& w : parts[0].waves()) {
    for (const pb::LoadUnitEntry& u : w.units()) EXPECT_LE(u.num_elements(), 2);
  }
  EXPECT_THAT(ElementsReadPerPiece(parts),
              ::testing::UnorderedElementsAre(::testing::Pair(0, 4), ::testing::Pair(1, 4)));
  EXPECT_EQ(parts[1].memory_budget_bytes(), 8);
}

TEST(LoadExchangeTest, DirectKeepsEveryRankReadingItsOwnRegions) {
  const std::string path = WriteTwoRowCheckpoint("direct");
  auto plans = PlanExchangeLoad(ThreeRankLoad(path), LoadPlannerOptions{pb::LOAD_DIRECT, 1 << 20});
  ASSERT_TRUE(plans.ok()) << plans.status();
  for (const pb::LoadPlanPart& part : Parts(*plans)) {
    EXPECT_EQ(part.algorithm(), pb::LOAD_ALGORITHM_UNSPECIFIED);  // read directly
    EXPECT_EQ(part.waves_size(), 0);
    EXPECT_EQ(part.reads_size(), 1);
  }
}

TEST(LoadExchangeTest, AutoReadsDirectlyOnOneHostAndExchangesAcrossHosts) {
  const std::string path = WriteTwoRowCheckpoint("auto");
  Operation op = ThreeRankLoad(path);
  for (RankEntry& e : op.ranks) e.location.host = "node0";
  EXPECT_EQ(AutoLoadAlgorithm(op), pb::LOAD_DIRECT);
  auto plans = PlanExchangeLoad(op, LoadPlannerOptions{pb::LOAD_AUTO, 1 << 20});
  ASSERT_TRUE(plans.ok()) << plans.status();
  for (const pb::LoadPlanPart& part : Parts(*plans)) EXPECT_EQ(part.waves_size(), 0);
  op.ranks[2].location.host = "node1";
  EXPECT_EQ(AutoLoadAlgorithm(op), pb::LOAD_BROADCAST);
  plans = PlanExchangeLoad(op, LoadPlannerOptions{pb::LOAD_AUTO, 1 << 20});
  ASSERT_TRUE(plans.ok()) << plans.status();
  EXPECT_EQ(Parts(*plans)[0].algorithm(), pb::LOAD_BROADCAST);
}

TEST(LoadExchangeTest, AnAlgorithmThisBuildDoesNotKnowIsRefusedNamingTheValidOnes) {
  const std::string path = WriteTwoRowCheckpoint("unknown");
  auto plans = PlanExchangeLoad(ThreeRankLoad(path),
                                LoadPlannerOptions{static_cast<pb::LoadAlgorithm>(42), 1 << 20});
  ASSERT_FALSE(plans.ok());
  EXPECT_EQ(plans.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plans.status().message(), HasSubstr("algorithm 42"));
  EXPECT_THAT(plans.status().message(), HasSubstr("broadcast, overlap_all_to_all"));
}

TEST(LoadExchangeTest, ATensorTheCheckpointLacksIsRefusedNamingRankAndKey) {
  const std::string path = WriteTwoRowCheckpoint("missing");
  Operation op = ThreeRankLoad(path);
  std::vector<pb::PieceMeta> pieces = op.ranks[2].shards.Pieces();
  pieces[0].mutable_tensor()->set_key("v");
  op.ranks[2].shards = RankPieces(pieces);
  auto plans = PlanExchangeLoad(op, LoadPlannerOptions{});
  ASSERT_FALSE(plans.ok());
  EXPECT_THAT(plans.status().message(), HasSubstr("rank 2 asks for tensor v"));
}

// ThreeRankLoad with every shard in device memory, each rank on its own GPU with NCCL.
Operation DeviceResidentLoad(const std::string& path) {
  Operation op = ThreeRankLoad(path);
  for (int r = 0; r < 3; ++r) {
    RankEntry& e = op.ranks[r];
    e.memory_kinds.assign(e.shards.size(), pb::MEMORY_DEVICE);
    e.location.worker_id = absl::StrCat("w-", r);
    e.location.host = "node0";
    e.location.gpu = r;
    e.location.nccl = true;
  }
  return op;
}

TEST(ChooseExchangeTransportTest, DeviceResidentRanksOnTheirOwnNcclGpusExchangeOnTheDevice) {
  const std::string path = WriteTwoRowCheckpoint("device");
  const Operation op = DeviceResidentLoad(path);
  const ExchangeTransport transport = ChooseExchangeTransport(op);
  EXPECT_TRUE(transport.device) << transport.reason;
  auto plans = PlanExchangeLoad(op, LoadPlannerOptions{pb::LOAD_BROADCAST, 1 << 20});
  ASSERT_TRUE(plans.ok()) << plans.status();
  for (const pb::LoadPlanPart& part : Parts(*plans)) {
    EXPECT_TRUE(part.device_exchange());
    EXPECT_EQ(part.transport_reason(), transport.reason);
  }
}

TEST(ChooseExchangeTransportTest, OneRankWithAHostTensorKeepsEveryRankOnGlooNamingIt) {
  const std::string path = WriteTwoRowCheckpoint("mixed");
  Operation op = DeviceResidentLoad(path);
  op.ranks[2].memory_kinds[0] = pb::MEMORY_HOST;
  const ExchangeTransport transport = ChooseExchangeTransport(op);
  EXPECT_FALSE(transport.device);
  EXPECT_EQ(transport.reason, "rank 2 has tensors in host memory (w)");
  auto plans = PlanExchangeLoad(op, LoadPlannerOptions{pb::LOAD_BROADCAST, 1 << 20});
  ASSERT_TRUE(plans.ok()) << plans.status();
  for (const pb::LoadPlanPart& part : Parts(*plans)) EXPECT_FALSE(part.device_exchange());
}

TEST(ChooseExchangeTransportTest, AWorkerWithoutNcclKeepsTheLoadOnGloo) {
  Operation op = DeviceResidentLoad(WriteTwoRowCheckpoint("nonccl"));
  op.ranks[1].location.nccl = false;
  const ExchangeTransport transport = ChooseExchangeTransport(op);
  EXPECT_FALSE(transport.device);
  EXPECT_THAT(transport.reason, HasSubstr("the worker of rank 1"));
  EXPECT_THAT(transport.reason, HasSubstr("cannot create an NCCL communicator"));
  op.ranks[1].location.nccl = true;
  op.ranks[1].location.gpu = -1;  // a worker that serves no GPU cannot, whatever it says
  EXPECT_FALSE(ChooseExchangeTransport(op).device);
}

TEST(ChooseExchangeTransportTest, TwoRanksOnOneGpuKeepTheLoadOnGlooBecauseNcclRefusesThem) {
  Operation op = DeviceResidentLoad(WriteTwoRowCheckpoint("shared-gpu"));
  op.ranks[2].location.gpu = 0;
  const ExchangeTransport transport = ChooseExchangeTransport(op);
  EXPECT_FALSE(transport.device);
  EXPECT_THAT(transport.reason, HasSubstr("ranks 0 and 2 share GPU 0 of host node0"));
  op.ranks[2].location.host = "node1";  // GPU 0 of another host is another GPU
  EXPECT_TRUE(ChooseExchangeTransport(op).device);
}

TEST(ChooseExchangeTransportTest, RanksThatDidNotSayWhereTheirTensorsLiveStayOnGloo) {
  Operation op = DeviceResidentLoad(WriteTwoRowCheckpoint("unsaid"));
  op.ranks[0].memory_kinds.clear();
  EXPECT_EQ(ChooseExchangeTransport(op).reason, "rank 0 did not say where its tensors live");
  Operation empty = DeviceResidentLoad(WriteTwoRowCheckpoint("empty"));
  for (RankEntry& e : empty.ranks) {
    e.shards.clear();
    e.memory_kinds.clear();
  }
  EXPECT_EQ(ChooseExchangeTransport(empty).reason, "no rank has device tensors");
}

// The rule stated as a whole (a brute-force twin of ChooseExchangeTransport's walk): the
// device exchange iff every rank said where each shard lives, all of it in device memory, at
// least one shard, every worker serves a GPU with NCCL, and the (host, GPU) pairs are distinct.
bool DeviceExchangeTwin(const Operation& op) {
  std::set<std::pair<std::string, int>> gpus;
  int64_t shards = 0;
  for (const RankEntry& e : op.ranks) {
    if (e.memory_kinds.size() != static_cast<size_t>(e.shards.size())) return false;
    if (std::count(e.memory_kinds.begin(), e.memory_kinds.end(), pb::MEMORY_DEVICE) !=
        static_cast<int64_t>(e.memory_kinds.size())) {
      return false;
    }
    if (!e.location.nccl || e.location.gpu < 0) return false;
    gpus.emplace(e.location.host, e.location.gpu);
    shards += static_cast<int64_t>(e.shards.size());
  }
  return shards > 0 && gpus.size() == op.ranks.size();
}

TEST(ChooseExchangeTransportTest, AgreesWithTheRuleOnRandomOperations) {
  std::mt19937 random(13);
  auto pick = [&random](int n) { return static_cast<int>(random() % n); };
  int device = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    Operation op;
    op.world_size = 1 + pick(5);
    op.ranks.resize(op.world_size);
    for (RankEntry& e : op.ranks) {
      const int shards = pick(3);
      e.shards = RankPieces(std::vector<pb::PieceMeta>(shards, Rows(0, 1)));
      // Mostly device memory, so that the device case is common.
      for (int i = 0; i < shards; ++i) {
        e.memory_kinds.push_back(pick(8) == 0 ? pb::MEMORY_HOST : pb::MEMORY_DEVICE);
      }
      if (pick(16) == 0) e.memory_kinds.clear();
      e.location.host = absl::StrCat("node", pick(2));
      e.location.gpu = pick(9) - 1;
      e.location.nccl = pick(10) != 0;
    }
    const ExchangeTransport got = ChooseExchangeTransport(op);
    ASSERT_EQ(got.device, DeviceExchangeTwin(op)) << "trial " << trial << ": " << got.reason;
    EXPECT_FALSE(got.reason.empty());
    device += got.device ? 1 : 0;
  }
  EXPECT_GT(device, 100);  // both outcomes are exercised
  EXPECT_LT(device, 4900);
}

}  // namespace
}  // namespace ckpt::coordinator
