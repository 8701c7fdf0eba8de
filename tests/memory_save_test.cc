// KeepSnapshotInMemory (worker/memory_save.h) with both ranks of a memory save as threads of
// this process: the replication communicator formed through a real Rendezvous gRPC service on
// loopback, Gloo over loopback, each rank with its own MemoryTier (as its own worker).
#include "worker/memory_save.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/page_faults.h"
#include "gtest/gtest.h"
#include "rendezvous/loopback_rendezvous.h"

namespace ckpt::worker {
namespace {

constexpr int kRanks = 2;
// Over glibc's largest mmap threshold (32 MiB), so that every buffer of this size is mapped
// afresh and its first write faults its pages in.
constexpr int64_t kFileBytes = int64_t{40} << 20;

std::string Key(int rank) { return absl::StrCat("t", rank); }

// Rank r's trainer memory: one u8 tensor of kFileBytes.
std::vector<char> TrainerBytes(int rank) {
  std::vector<char> out(kFileBytes);
  for (int64_t i = 0; i < kFileBytes; ++i) out[i] = static_cast<char>(i * 7 + rank * 13);
  return out;
}

void FillSnapshot(int rank, const std::vector<char>& data, SaveSnapshot* snapshot) {
  snapshot->rank = rank;
  snapshot->job = "j";
  for (int r = 0; r < kRanks; ++r) {
    snapshot->tensors.push_back(TensorMeta{Key(r), DType::kU8, {kFileBytes}});
  }
  DataFilePlan file;
  file.writer_rank = rank;
  file.pieces.push_back(PieceData{Key(rank), Region{{0}, {kFileBytes}, {}}, data.data(),
                                  static_cast<int64_t>(data.size())});
  snapshot->files.push_back(file);
}

pb::SavePlanPart Part(int rank) {
  pb::SavePlanPart part;
  part.set_rank(rank);
  part.set_world_size(kRanks);
  part.set_group("memory-save-test");
  part.add_replica_ranks(1 - rank);
  part.set_memory_checkpoint("m");
  return part;
}

class MemorySaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(rendezvous_.ok());
    for (int r = 0; r < kRanks; ++r) {
      data_.push_back(TrainerBytes(r));
      tiers_.push_back(std::make_unique<MemoryTier>(MemoryTierOptions{int64_t{1} << 30, 2}));
      snapshots_.push_back(std::make_unique<SaveSnapshot>());
      FillSnapshot(r, data_[r], snapshots_[r].get());
    }
  }

  // Runs both ranks' memory save at once; each rank's status.
  std::vector<absl::Status> SaveBoth() {
    std::vector<absl::Status> statuses(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        MemorySaveContext context;
        context.tier = tiers_[r].get();
        context.rendezvous_address = rendezvous_.address();
        context.gloo_loop_thread_nice = 0;
        context.timeout = absl::Seconds(60);
        MemoryGate gate;
        statuses[r] = KeepSnapshotInMemory(Part(r), "op-1", *snapshots_[r], context, gate).status();
      });
    }
    for (std::thread& t : threads) t.join();
    return statuses;
  }

  LoopbackRendezvous rendezvous_;
  std::vector<std::vector<char>> data_;
  std::vector<std::unique_ptr<MemoryTier>> tiers_;
  std::vector<std::unique_ptr<SaveSnapshot>> snapshots_;
};

TEST_F(MemorySaveTest, EachReplicaHoldsItsPeersFilesByteForByte) {
  std::vector<absl::Status> statuses = SaveBoth();
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(statuses[r].ok()) << "rank " << r << statuses[r];
  for (int r = 0; r < kRanks; ++r) {
    std::vector<HeldCheckpoint> held = tiers_[r]->List();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_TRUE(held[0].complete);
    ASSERT_EQ(held[0].files.size(), 2u) << "rank " << r << " holds its file and its peer's";
    for (const std::string& file : held[0].files) {
      auto mine = tiers_[r]->Find("m", file);
      auto theirs = tiers_[1 - r]->Find("m", file);
      ASSERT_TRUE(mine.ok() && theirs.ok()) << file;
      EXPECT_TRUE(**mine == **theirs) << "rank " << r << " file " << file;
    }
  }
}

// Issue 40: replication copies each file into the receiving tier's buffer and nowhere else (no
// framing copy on the sender, no unframing copy on the receiver), so the pages faulted in are
// those of the encoded files and of the received ones: 4 files of kFileBytes here. Framing and
// unframing faulted in twice that.
TEST_F(MemorySaveTest, ReplicationFaultsInOnlyTheEncodedAndReceivedFiles) {
  const int64_t before = ProcessMinorFaults();
  std::vector<absl::Status> statuses = SaveBoth();
  const int64_t faults = ProcessMinorFaults() - before;
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(statuses[r].ok()) << "rank " << r << statuses[r];
  if (!kPageFaultsMeasureTheCode) GTEST_SKIP() << "ThreadSanitizer's shadow memory faults too";
  const int64_t file_pages = kFileBytes / 4096;
  EXPECT_GE(faults, 4 * file_pages * 9 / 10);  // the encoded and received files themselves
  EXPECT_LT(faults, 6 * file_pages) << "faults " << faults << ", pages of one file " << file_pages;
}

}  // namespace
}  // namespace ckpt::worker
