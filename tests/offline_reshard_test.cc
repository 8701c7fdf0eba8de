#include "reshard/offline_reshard.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <tuple>

#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reshard/wave_writer.h"
#include "sharding/piece_id.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/verify.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// An empty scratch directory for one test.
std::string TestDir(const std::string& name) { return ckpt::testing::FreshDir(name); }

LayoutSpec Layout(const std::string& json) {
  auto spec = LayoutSpec::Parse(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *std::move(spec);
}

std::vector<TensorMeta> SmallGpt() {
  GptConfig c;
  c.layers = 2;
  c.hidden = 64;
  c.vocab = 500;
  return *GptTensors(c);
}

using PieceKey =
    std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t>;

PieceKey IdOf(const std::string& key, const Region& r) {
  return {key, r.offsets, r.lengths, r.flat ? r.flat->start : -1, r.flat ? r.flat->stop : -1};
}

// The (key, region) of every stored piece of the checkpoint, with its checksum.
std::map<PieceKey, uint64_t> StoredPieces(const std::string& path) {
  auto reader = CheckpointReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::map<PieceKey, uint64_t> out;
  for (const pb::StoredPiece& p : (*reader)->manifest().pieces()) {
    Region r;
    r.offsets.assign(p.region().offsets().begin(), p.region().offsets().end());
    r.lengths.assign(p.region().lengths().begin(), p.region().lengths().end());
    if (p.region().has_flat())
      r.flat = FlatRange{p.region().flat().start(), p.region().flat().stop()};
    out[IdOf(p.key(), r)] = p.xxh3_64();
  }
  return out;
}

std::set<PieceKey> LayoutMainPieces(const LayoutSpec& layout,
                                    const std::vector<TensorMeta>& tensors) {
  std::set<PieceKey> out;
  const std::vector<TensorPiece> pieces = *layout.AllPieces(tensors, true);
  for (const TensorPiece& p : pieces) {
    if (p.is_main_replica()) out.insert(IdOf(p.key, p.region));
  }
  return out;
}

class OfflineReshardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir("reshard");
    tensors_ = SmallGpt();
    src_ = JoinPath(dir_, "src");
    auto written = WriteGptCheckpoint(src_, tensors_, source_, int64_t{256} << 10, WriteOptions{},
                                      42, {{"run", "gpt-test"}});
    ASSERT_TRUE(written.ok()) << written.status();
  }

  OfflineReshardOptions SmallBudget() {
    OfflineReshardOptions o;
    o.memory_budget_bytes = int64_t{1} << 20;
    return o;
  }

  std::string dir_, src_;
  std::vector<TensorMeta> tensors_;
  LayoutSpec source_ = Layout(GptLayoutJson(2, 2));
};

TEST_F(OfflineReshardTest, EveryTargetPieceHoldsTheRightElements) {
  for (auto [tp, dp, flat] :
       {std::tuple{4, 1, true}, {3, 1, true}, {1, 3, true}, {2, 3, false}, {1, 1, false}}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp, " dp ", dp));
    const LayoutSpec target = Layout(GptLayoutJson(tp, dp, flat));
    const std::string dst = JoinPath(dir_, absl::StrCat("dst_", tp, "x", dp));
    auto stats = OfflineReshard(src_, dst, target, SmallBudget());
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->write.waves, 1);
    EXPECT_LE(stats->write.peak_wave_bytes + stats->peak_staging_bytes, int64_t{1} << 20);
    EXPECT_EQ(stats->write.bytes_written, TotalBytes(tensors_));

    // Stored pieces are exactly the target's distinct pieces.
    std::set<PieceKey> stored;
    for (const auto& [id, sum] : StoredPieces(dst)) stored.insert(id);
    EXPECT_EQ(stored, LayoutMainPieces(target, tensors_));
    auto check = CheckGptCheckpoint(dst, tensors_, target);
    ASSERT_TRUE(check.ok()) << check.status();
    EXPECT_GT(check->elements, 0);
    auto verify = VerifyCheckpoint(dst, IoOptions{});
    ASSERT_TRUE(verify.ok()) << verify.status();
    EXPECT_TRUE(verify->problems.empty()) << verify->problems.front();

    auto reader = CheckpointReader::Open(dst);
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ((*reader)->manifest().step(), 42);
    EXPECT_EQ((*reader)->manifest().user_metadata().at("run"), "gpt-test");
    EXPECT_EQ((*reader)->manifest().saved_layout().world_size(), tp * dp);
  }
}

TEST_F(OfflineReshardTest, RoundTripReproducesTheSourcePiecesBitExactly) {
  const std::string mid = JoinPath(dir_, "mid"), back = JoinPath(dir_, "back");
  ASSERT_TRUE(OfflineReshard(src_, mid, Layout(GptLayoutJson(3, 1)), SmallBudget()).ok());
  ASSERT_TRUE(OfflineReshard(mid, back, source_, SmallBudget()).ok());
  EXPECT_EQ(StoredPieces(back), StoredPieces(src_));
}

TEST_F(OfflineReshardTest, CorruptSourceIsDataLossNamingTheTensor) {
  auto reader = CheckpointReader::Open(src_);
  ASSERT_TRUE(reader.ok());
  const pb::StoredPiece piece = (*reader)->manifest().pieces(0);
  const std::string file = JoinPath(src_, piece.file());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(piece.byte_offset());
    char c = 0;
    f.read(&c, 1);
    c ^= 0x40;
    f.seekp(piece.byte_offset());
    f.write(&c, 1);
  }
  const std::string dst = JoinPath(dir_, "from_corrupt");
  auto stats = OfflineReshard(src_, dst, Layout(GptLayoutJson(4, 1)), SmallBudget());
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(stats.status().message(), HasSubstr(piece.key()));
  EXPECT_THAT(stats.status().message(), HasSubstr(piece.file()));
  EXPECT_FALSE(PathExists(dst));
}

TEST_F(OfflineReshardTest, ExistingDestinationNeedsOverwrite) {
  const std::string dst = JoinPath(dir_, "existing");
  ASSERT_TRUE(OfflineReshard(src_, dst, Layout(GptLayoutJson(4, 1)), SmallBudget()).ok());
  const auto before = StoredPieces(dst);
  auto again = OfflineReshard(src_, dst, Layout(GptLayoutJson(1, 2)), SmallBudget());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(StoredPieces(dst), before);
  OfflineReshardOptions o = SmallBudget();
  o.overwrite = true;
  ASSERT_TRUE(OfflineReshard(src_, dst, Layout(GptLayoutJson(1, 2)), o).ok());
  EXPECT_NE(StoredPieces(dst), before);
  EXPECT_TRUE(CheckGptCheckpoint(dst, tensors_, Layout(GptLayoutJson(1, 2))).ok());
}

TEST_F(OfflineReshardTest, TensorWithoutRuleIsNamedAndNothingIsWritten) {
  const std::string dst = JoinPath(dir_, "norule");
  auto stats = OfflineReshard(
      src_, dst,
      Layout(
          R"J({"mesh": {"tp": 2}, "rules": [{"match": "*.weight", "placements": ["Shard(0)"]}]})J"),
      SmallBudget());
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(stats.status().message(), HasSubstr("\"layers.0.input_layernorm.bias\""));
  EXPECT_FALSE(PathExists(dst));
}

TEST_F(OfflineReshardTest, BudgetSmallerThanAPieceIsExplained) {
  OfflineReshardOptions o;
  o.memory_budget_bytes = int64_t{1} << 20;
  // The bf16 embedding (2048 x 256, 1 MiB) alone exceeds half of a 1 MiB budget.
  GptConfig c;
  c.layers = 1;
  c.hidden = 256;
  c.vocab = 2048;
  c.with_optimizer = false;
  const std::vector<TensorMeta> big = *GptTensors(c);
  const std::string src = JoinPath(dir_, "big");
  ASSERT_TRUE(
      WriteGptCheckpoint(src, big, Layout(GptLayoutJson(1, 1)), int64_t{8} << 20, WriteOptions{})
          .ok());
  auto stats = OfflineReshard(src, JoinPath(dir_, "big_out"), Layout(GptLayoutJson(1, 1)), o);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(stats.status().message(), HasSubstr("memory budget"));
  EXPECT_THAT(stats.status().message(), HasSubstr("tensor \""));
}

TEST_F(OfflineReshardTest, InPlaceWithOverwriteReplacesTheSource) {
  const std::string copy = JoinPath(dir_, "inplace");
  ASSERT_TRUE(OfflineReshard(src_, copy, source_, SmallBudget()).ok());
  OfflineReshardOptions o = SmallBudget();
  o.overwrite = true;
  const LayoutSpec tp4 = Layout(GptLayoutJson(4, 1));
  auto stats = OfflineReshard(copy, copy, tp4, o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(CheckGptCheckpoint(copy, tensors_, tp4).ok());
  EXPECT_TRUE(ProbeCheckpoint(copy).leftovers.empty());
}

TEST_F(OfflineReshardTest, FailedWaveCommitsNothingAndLeavesNoStaging) {
  const std::string dst = JoinPath(dir_, "failed");
  auto pieces = source_.AllPieces(tensors_, true);
  ASSERT_TRUE(pieces.ok());
  SavePlanOptions sp;
  sp.target_file_bytes = 64 << 10;
  auto plan = BuildSavePlan(*pieces, source_.world_size(), sp);
  ASSERT_TRUE(plan.ok());
  std::vector<TensorMeta> specs;
  for (const TensorMeta& t : tensors_) specs.push_back({t.key, t.dtype, t.global_shape});
  int calls = 0;
  WaveOptions wave;
  wave.wave_bytes = 128 << 10;
  auto stats = WriteCheckpointInWaves(
      dst, specs, *plan, CheckpointContents{},
      [&](absl::Span<const PlannedPiece* const> wave_pieces, absl::Span<char* const> buffers) {
        if (++calls == 3) return absl::UnavailableError("source went away");
        for (size_t i = 0; i < wave_pieces.size(); ++i) {
          std::memset(buffers[i], 0, wave_pieces[i]->size_bytes);
        }
        return absl::OkStatus();
      },
      wave, WriteOptions{});
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(stats.status().message(), HasSubstr("source went away"));
  EXPECT_EQ(calls, 3);
  const CheckpointProbe probe = ProbeCheckpoint(dst);
  EXPECT_EQ(probe.state, CheckpointState::kMissing);
  EXPECT_TRUE(probe.leftovers.empty()) << probe.leftovers.front();
}

TEST_F(OfflineReshardTest, WavesReadEachSourcePieceAboutOnce) {
  auto stats =
      OfflineReshard(src_, JoinPath(dir_, "once"), Layout(GptLayoutJson(3, 1)), SmallBudget());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->write.waves, 2);
  // Only pieces cut by a wave boundary are read twice.
  EXPECT_LT(stats->bytes_read, TotalBytes(tensors_) * 12 / 10);
  EXPECT_GE(stats->bytes_read, TotalBytes(tensors_));
}

TEST(RepackForWavesTest, ConsecutiveWavesOneFilePerWriterPieceKeepsItsWriter) {
  auto layout = LayoutSpec::Parse(GptLayoutJson(2, 2));
  ASSERT_TRUE(layout.ok());
  auto pieces = layout->AllPieces(SmallGpt(), true);
  ASSERT_TRUE(pieces.ok());
  auto plan = BuildSavePlan(*pieces, 4);
  ASSERT_TRUE(plan.ok());
  std::map<PieceKey, int64_t> writer_of;
  int64_t total = 0;
  for (const WriterPlan& w : plan->writers) {
    for (const PlannedFile& f : w.files) {
      for (const PlannedPiece& p : f.pieces) {
        writer_of[IdOf(p.key, p.region)] = w.rank;
        total += p.size_bytes;
      }
    }
  }
  const int64_t wave_bytes = 300 << 10;
  auto waves = RepackForWaves(&*plan, wave_bytes);
  ASSERT_TRUE(waves.ok()) << waves.status();
  EXPECT_GE(*waves, total / wave_bytes);
  std::vector<int64_t> wave_total(*waves, 0);
  std::vector<std::pair<PieceKey, int64_t>> order;  // (piece, wave)
  size_t count = 0;
  for (const WriterPlan& w : plan->writers) {
    ASSERT_EQ(static_cast<int64_t>(w.files.size()), *waves);
    for (int64_t k = 0; k < *waves; ++k) {
      const PlannedFile& f = w.files[k];
      EXPECT_EQ(f.path, absl::StrCat("data/r", w.rank, "_", k, ".safetensors"));
      int64_t bytes = 0;
      for (const PlannedPiece& p : f.pieces) {
        EXPECT_EQ(writer_of.at(IdOf(p.key, p.region)), w.rank);
        bytes += p.size_bytes;
        order.push_back({IdOf(p.key, p.region), k});
        ++count;
      }
      EXPECT_EQ(bytes, f.total_bytes);
      wave_total[k] += bytes;
    }
  }
  EXPECT_EQ(count, writer_of.size());
  for (int64_t t : wave_total) EXPECT_LE(t, wave_bytes);
  // Waves are consecutive in shard-id order: every piece of wave k precedes every piece of k+1.
  for (const auto& [a, ka] : order) {
    for (const auto& [b, kb] : order) {
      if (ka < kb) {
        ASSERT_TRUE(PieceIdLess()(
            PieceId{std::get<0>(a), std::get<1>(a),
                    std::get<3>(a) < 0
                        ? std::nullopt
                        : std::optional<FlatRange>(FlatRange{std::get<3>(a), std::get<4>(a)})},
            PieceId{std::get<0>(b), std::get<1>(b),
                    std::get<3>(b) < 0
                        ? std::nullopt
                        : std::optional<FlatRange>(FlatRange{std::get<3>(b), std::get<4>(b)})}));
      }
    }
  }
  auto too_big = BuildSavePlan(*pieces, 4);
  ASSERT_TRUE(too_big.ok());
  auto refused = RepackForWaves(&*too_big, 1024);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("more than a wave of 1024"));
}

TEST_F(OfflineReshardTest, ScalarsAndEmptyTensorsSurviveFlatAndBoxLayouts) {
  const std::vector<TensorMeta> odd = {{"step", DType::kI64, {}},
                                       {"scale", DType::kF32, {1}},
                                       {"empty", DType::kBF16, {0, 8}},
                                       {"w", DType::kBF16, {5, 7}}};
  const LayoutSpec flat = Layout(R"J({"mesh": {"dp": 3}, "rules": [
      {"match": "*", "flat": {"over": "dp"}}]})J");
  const LayoutSpec box = Layout(R"J({"mesh": {"tp": 2}, "rules": [
      {"match": "w", "placements": ["Shard(1)"]},
      {"match": "*", "placements": ["Replicate()"]}]})J");
  const std::string a = JoinPath(dir_, "odd_flat"), b = JoinPath(dir_, "odd_box");
  auto written = WriteGptCheckpoint(a, odd, flat, 1 << 20, WriteOptions{});
  ASSERT_TRUE(written.ok()) << written.status();
  auto stats = OfflineReshard(a, b, box, SmallBudget());
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto check = CheckGptCheckpoint(b, odd, box);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->elements, 1 + 1 + 35);
  auto verify = VerifyCheckpoint(b, IoOptions{});
  ASSERT_TRUE(verify.ok()) << verify.status();
  EXPECT_TRUE(verify->problems.empty()) << verify->problems.front();
}

TEST_F(OfflineReshardTest, MissingSourceIsAnError) {
  auto stats =
      OfflineReshard(JoinPath(dir_, "nope"), JoinPath(dir_, "out"), source_, SmallBudget());
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(stats.status().message(), HasSubstr("nope"));
}

}  // namespace
}  // namespace ckpt
