// Multi-process tests of compressed cluster saves (issue 40 item 6): real ckpt_coordinator and
// ckpt_worker processes on loopback, trainer processes saving with SaveOptions::compression
// (and an operator's `ckptctl save --compression`); the manifest records the codec, the stored
// bytes are fewer than the raw ones, and loads through the workers (also into other layouts)
// and the storage reader are bit-exact. Bad specs are refused naming the option.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

// Raw and stored bytes of a checkpoint's pieces, and how many pieces carry a codec.
struct StoredBytes {
  int64_t raw = 0;
  int64_t stored = 0;
  int compressed_pieces = 0;
  int pieces = 0;
};

StoredBytes CountStored(const pb::Manifest& manifest) {
  StoredBytes out;
  for (const pb::StoredPiece& p : manifest.pieces()) {
    ++out.pieces;
    out.raw += p.byte_length();
    out.stored += p.codec() != 0 ? p.stored_length() : p.byte_length();
    if (p.codec() != 0) ++out.compressed_pieces;
  }
  return out;
}

// Every element of probe.weight (shape rows x elements, int32) is its global flat index.
void ExpectFlatIndexes(const std::string& path, int64_t rows, int64_t elements) {
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<int32_t> values(rows * elements, -1);
  ASSERT_TRUE(
      (*reader)->ReadRegion("probe.weight", WholeRegion({rows, elements}), values.data()).ok());
  for (int64_t i = 0; i < rows * elements; ++i) ASSERT_EQ(values[i], i) << "element " << i;
}

TEST(CompressedSaveTest, SaveWithCompressionStoresFewerBytesAndLoadsBackBitExactInOtherLayouts) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=5000"}));
  for (int i = 0; i < 4; ++i) cluster.StartWorker(i);
  const std::string path = cluster.dir() + "/packed";
  const std::vector<std::string> shape = {"--global_rows", "5", "--elements", "20000"};
  std::vector<std::string> save_args = {"--layout", "dtensor", "--compression", "zstd:3"};
  save_args.insert(save_args.end(), shape.begin(), shape.end());
  for (Child* t : RunRanks(cluster, "train", 2, "save", path, save_args)) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  {
    auto reader = CheckpointReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    const StoredBytes bytes = CountStored((*reader)->manifest());
    EXPECT_EQ(bytes.raw, 5 * 20000 * 4);
    EXPECT_EQ(bytes.compressed_pieces, bytes.pieces);
    EXPECT_GT(bytes.pieces, 0);
    // Consecutive int32 indexes: the high bytes compress away (64% kept when measured).
    EXPECT_LT(bytes.stored * 4, bytes.raw * 3) << bytes.stored << " stored of " << bytes.raw;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectFlatIndexes(path, 5, 20000));
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
  EXPECT_EQ(cluster.RunCkptctl({"inspect", path}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("zstd"));

  // Loaded through the workers by 3 ranks (rows across the saved boundary), by 4 ranks holding
  // flat ranges (each worker reading what it needs) and by 2 ranks over an exchange (one
  // worker reads, broadcasts); every element is checked by the trainers.
  auto job_left = [&] {
    pb::GetStatusResponse st = cluster.Status();
    return st.jobs_size() == 1 && st.jobs(0).ranks_size() == 0;
  };
  struct Target {
    int world;
    std::string layout, algorithm;
  };
  for (const Target& target : {Target{3, "dtensor", "overlap_all_to_all"},
                               Target{4, "flat", "direct"}, Target{2, "cols", "broadcast"}}) {
    const int world = target.world;
    ASSERT_TRUE(WaitFor(job_left));
    std::vector<std::string> load_args = {"--layout", target.layout, "--algorithm",
                                          target.algorithm};
    load_args.insert(load_args.end(), shape.begin(), shape.end());
    for (Child* t : RunRanks(cluster, "train", world, "load", path, load_args)) {
      EXPECT_EQ(Result(*t).first, 0) << world << " ranks: " << Result(*t).second;
      EXPECT_FALSE(LineValue(t->Stdout(), "verified").empty()) << world << ": " << t->Stdout();
    }
  }
}

TEST(CompressedSaveTest, ABadCompressionSpecIsRefusedNamingItAndNothingIsSaved) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=5000"}));
  cluster.StartWorker(0);
  const std::string path = cluster.dir() + "/refused";
  for (Child* t : RunRanks(cluster, "bad", 1, "save", path, {"--compression", "lz4"})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kInvalidArgument))
        << Result(*t).second;
    EXPECT_THAT(Result(*t).second, HasSubstr("compression \"lz4\""));
  }
  EXPECT_EQ(cluster.Status().operations_size(), 0);  // refused before the coordinator heard
  // A memory save does not compress: Unimplemented, naming the option.
  for (Child* t : RunRanks(cluster, "mem", 1, "save", "mem://refused", {"--compression", "zstd"})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kUnimplemented))
        << Result(*t).second;
    EXPECT_THAT(Result(*t).second, HasSubstr("compression \"zstd\""));
  }
}

TEST(CompressedSaveTest, CkptctlSaveWithCompressionWritesACompressedCheckpoint) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=5000"}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  std::string out;
  // A bad spec is a usage error naming the flag; nothing is requested.
  EXPECT_NE(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "polled",
                                "--compression", "gzip", cluster.dir() + "/never"},
                               &out),
            0);
  EXPECT_THAT(out, HasSubstr("--compression"));
  EXPECT_THAT(out, HasSubstr("\"gzip\""));
  const std::string path = cluster.dir() + "/operator-packed";
  ASSERT_EQ(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "polled",
                                "--compression", "zstd", "--timeout", "60s", path},
                               &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("committed at " + path));
  ASSERT_TRUE(WaitFor([&] { return Result(*trainer).first >= 0; }));
  EXPECT_EQ(Result(*trainer).first, 0) << Result(*trainer).second;
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const StoredBytes bytes = CountStored((*reader)->manifest());
  EXPECT_EQ(bytes.compressed_pieces, bytes.pieces);
  EXPECT_LT(bytes.stored, bytes.raw);
  ASSERT_NO_FATAL_FAILURE(ExpectFlatIndexes(path, 1, 1024));
  EXPECT_EQ(cluster.RunCkptctl({"verify", path}, &out), 0) << out;
}

}  // namespace
}  // namespace ckpt::testing
