#include "worker/transfer_verify.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "exchange/communicator_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

// One unit of "w" read by rank 0 (a serving participant) and needed by rank 1.
ExchangePlan OneUnitPlan() {
  PieceSpec unit;
  unit.id.key = "w";
  unit.id.offsets = {0, 0};
  unit.dtype = DType::kU8;
  unit.global_shape = {4, 8};
  unit.region = Region{{0, 0}, {4, 8}, std::nullopt};
  ExchangePlan plan;
  plan.num_ranks = 2;
  plan.distribution.push_back(DistributedPiece{unit, 0});
  plan.needs.resize(2);
  plan.needs[1].push_back(unit);
  return plan;
}

pb::LoadPlanPart Part() {
  pb::LoadPlanPart part;
  part.set_transfer_name("policy");
  part.set_transfer_version(3);
  part.set_transfer_verify(true);
  part.add_transfer_rank_workers("w-src");  // rank 0: the serving participant
  part.add_transfer_rank_workers("w-dst");
  return part;
}

// Runs the verification on both ranks over a real Gloo pair; rank 1 receives `delivered`.
std::pair<absl::Status, absl::Status> VerifyBoth(const std::string& delivered) {
  const ExchangePlan plan = OneUnitPlan();
  const std::string bytes(32, 'x');
  InMemoryStore store;
  absl::Status results[2];
  auto run = [&](int rank) {
    CommunicatorOptions options;
    auto comm = CreateCommunicator(&store, rank, 2, options, absl::Now() + absl::Seconds(30));
    if (!comm.ok()) {
      results[rank] = comm.status();
      return;
    }
    ShardBuffers loaded, received;
    if (rank == 0) loaded[plan.distribution[0].spec.id] = bytes;
    if (rank == 1) received[plan.distribution[0].spec.id] = delivered;
    absl::StatusOr<std::vector<uint64_t>> mine = ChecksumsOfReadUnits(plan, rank, loaded, "here");
    if (!mine.ok()) {
      results[rank] = mine.status();
      return;
    }
    pb::LoadWaveEntry wave;
    wave.add_units()->set_reader(0);
    results[rank] = VerifyReceivedUnits(Part(), wave, plan, rank, *mine, received, **comm,
                                        absl::Now() + absl::Seconds(30), "here");
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  return {results[0], results[1]};
}

TEST(TransferVerifyTest, IntactDeliveriesPass) {
  auto [reader, receiver] = VerifyBoth(std::string(32, 'x'));
  EXPECT_TRUE(reader.ok()) << reader;
  EXPECT_TRUE(receiver.ok()) << receiver;
}

TEST(TransferVerifyTest, AFlippedByteIsDataLossNamingTensorVersionAndReader) {
  std::string corrupt(32, 'x');
  corrupt[17] ^= 0x01;
  auto [reader, receiver] = VerifyBoth(corrupt);
  EXPECT_TRUE(reader.ok()) << reader;
  EXPECT_EQ(receiver.code(), absl::StatusCode::kDataLoss) << receiver;
  EXPECT_THAT(receiver.message(), HasSubstr("\"w\""));
  EXPECT_THAT(receiver.message(), HasSubstr("xfer://policy@3"));
  EXPECT_THAT(receiver.message(), HasSubstr("rank 0 (worker w-src"));
}

PieceSpec Row(int row) {
  PieceSpec unit;
  unit.id.key = "w";
  unit.id.offsets = {row, 0};
  unit.dtype = DType::kU8;
  unit.global_shape = {4, 8};
  unit.region = Region{{row, 0}, {1, 8}, std::nullopt};
  return unit;
}

// Own-share parts: rank 0 reads rows 0 and 1; rank 1 receives row 1 and its part lists only
// that unit (its reader's second, reader_ordinal 1). Rank 1 receives `delivered` for row 1.
absl::Status VerifyOwnShares(const std::string& delivered) {
  ExchangePlan plans[2];
  pb::LoadWaveEntry waves[2];
  for (int rank = 0; rank < 2; ++rank) {
    plans[rank].num_ranks = 2;
    plans[rank].needs.resize(2);
  }
  plans[0].distribution = {DistributedPiece{Row(0), 0}, DistributedPiece{Row(1), 0}};
  waves[0].add_units()->set_reader_ordinal(0);
  waves[0].add_units()->set_reader_ordinal(1);
  plans[1].distribution = {DistributedPiece{Row(1), 0}};
  plans[1].needs[1].push_back(Row(1));
  waves[1].add_units()->set_reader_ordinal(1);
  pb::LoadPlanPart part = Part();
  part.set_own_share(true);
  InMemoryStore store;
  absl::Status results[2];
  auto run = [&](int rank) {
    auto comm =
        CreateCommunicator(&store, rank, 2, CommunicatorOptions(), absl::Now() + absl::Seconds(30));
    if (!comm.ok()) {
      results[rank] = comm.status();
      return;
    }
    ShardBuffers loaded, received;
    if (rank == 0) {
      loaded[Row(0).id] = std::string(8, 'a');
      loaded[Row(1).id] = std::string(8, 'b');
    } else {
      received[Row(1).id] = delivered;
    }
    absl::StatusOr<std::vector<uint64_t>> mine =
        ChecksumsOfReadUnits(plans[rank], rank, loaded, "here");
    results[rank] = mine.ok()
                        ? VerifyReceivedUnits(part, waves[rank], plans[rank], rank, *mine, received,
                                              **comm, absl::Now() + absl::Seconds(30), "here")
                        : mine.status();
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  EXPECT_TRUE(results[0].ok()) << results[0];
  return results[1];
}

TEST(TransferVerifyTest, OwnSharePartsFindEachChecksumByItsReaderOrdinal) {
  EXPECT_TRUE(VerifyOwnShares(std::string(8, 'b')).ok());
  EXPECT_EQ(VerifyOwnShares(std::string(8, 'a')).code(), absl::StatusCode::kDataLoss);
}

TEST(TransferVerifyTest, AReaderMissingItsUnitIsAnInternalError) {
  ShardBuffers none;
  EXPECT_EQ(ChecksumsOfReadUnits(OneUnitPlan(), 0, none, "here").status().code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(ChecksumsOfReadUnits(OneUnitPlan(), 1, none, "here")->empty());
}

}  // namespace
}  // namespace ckpt::worker
