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
    results[rank] = VerifyReceivedUnits(Part(), plan, rank, *mine, received, **comm,
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

TEST(TransferVerifyTest, AReaderMissingItsUnitIsAnInternalError) {
  ShardBuffers none;
  EXPECT_EQ(ChecksumsOfReadUnits(OneUnitPlan(), 0, none, "here").status().code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(ChecksumsOfReadUnits(OneUnitPlan(), 1, none, "here")->empty());
}

}  // namespace
}  // namespace ckpt::worker
