#include "examples/gpt_state.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/layout_spec.h"
#include "sharding/layout.h"
#include "sharding/overlap.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::vector<char> Fill(const TensorMeta& t, const Region& r) {
  std::vector<char> out(r.NumElements() * DTypeSize(t.dtype));
  absl::Status s = FillPiece(t, r, absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

Region RandomRegion(std::mt19937& rng, const std::vector<int64_t>& shape, bool flat) {
  Region r;
  for (int64_t dim : shape) {
    const int64_t a = rng() % (dim + 1), b = rng() % (dim + 1);
    r.offsets.push_back(std::min(a, b));
    r.lengths.push_back(std::max(a, b) - std::min(a, b));
  }
  if (flat) {
    const int64_t n = r.BoxElements();
    const int64_t a = rng() % (n + 1), b = rng() % (n + 1);
    r.flat = FlatRange{std::min(a, b), std::max(a, b)};
  }
  return r;
}

// Brute-force twin: a piece's content equals the matching elements of the whole tensor.
TEST(GptStateTest, PieceContentMatchesTheWholeTensor) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    const DType dtype = (DType[]){DType::kBF16, DType::kF32, DType::kU8, DType::kF64}[rng() % 4];
    std::vector<int64_t> shape;
    const int nd = rng() % 4;
    for (int d = 0; d < nd; ++d) shape.push_back(1 + rng() % 5);
    const TensorMeta t{"t" + std::to_string(iter % 3), dtype, shape};
    const std::vector<char> whole = Fill(t, WholeRegion(shape));
    const Region r = RandomRegion(rng, shape, rng() % 2);
    const std::vector<char> piece = Fill(t, r);
    auto runs = OverlapRuns(WholeRegion(shape), r, shape);
    ASSERT_TRUE(runs.ok());
    std::vector<char> expected(piece.size());
    CopyRuns(*runs, DTypeSize(dtype), whole.data(), expected.data());
    ASSERT_EQ(piece, expected) << ShapeString(shape) << " " << r.DebugString();
    ASSERT_TRUE(VerifyPiece(t, r, piece).ok());
  }
}

TEST(GptStateTest, ContentDependsOnKeyAndIndex) {
  const TensorMeta a{"a", DType::kF32, {16}}, b{"b", DType::kF32, {16}};
  const std::vector<char> fa = Fill(a, WholeRegion(a.global_shape));
  const std::vector<char> fb = Fill(b, WholeRegion(b.global_shape));
  EXPECT_NE(fa, fb);
  EXPECT_NE(std::vector<char>(fa.begin(), fa.begin() + 4),
            std::vector<char>(fa.begin() + 4, fa.begin() + 8));
  EXPECT_FALSE(VerifyPiece(b, WholeRegion(b.global_shape), fa).ok());
}

TEST(GptStateTest, MismatchNamesKeyIndexCoordinatesAndBytes) {
  const TensorMeta t{"layers.0.mlp.fc1.weight", DType::kBF16, {4, 6}};
  const Region r{{1, 2}, {2, 3}, FlatRange{1, 5}};
  std::vector<char> data = Fill(t, r);
  data[2 * 2] ^= 0x01;  // local element 2 = box-flat 3 = box (1, 0) = global (2, 2)
  absl::Status s = VerifyPiece(t, r, data);
  ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("\"layers.0.mlp.fc1.weight\""));
  EXPECT_THAT(s.message(), HasSubstr("global index 14 (2, 2)"));
  EXPECT_THAT(s.message(), HasSubstr("local index 2"));
  EXPECT_THAT(s.message(), HasSubstr("expected 0x"));
  EXPECT_THAT(s.message(), HasSubstr("got 0x"));
}

TEST(GptStateTest, WrongBufferSizeOrRegionIsAnError) {
  const TensorMeta t{"x", DType::kF32, {4}};
  std::vector<char> small(8);
  EXPECT_EQ(FillPiece(t, WholeRegion(t.global_shape), absl::MakeSpan(small)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifyPiece(t, Region{{3}, {2}, std::nullopt}, small).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GptStateTest, TensorsAndSizes) {
  GptConfig c;
  c.layers = 2;
  c.hidden = 8;
  c.vocab = 32;
  auto tensors = GptTensors(c);
  ASSERT_TRUE(tensors.ok());
  // 4 + 12 per layer weights, times 4 with the optimizer state.
  EXPECT_EQ(tensors->size(), 4u * (4 + 12 * 2));
  EXPECT_EQ((*tensors)[0].key, "embedding.word_embeddings.weight");
  EXPECT_EQ(tensors->back().key, "optimizer.exp_avg_sq.output_layer.weight");
  EXPECT_EQ(tensors->back().dtype, DType::kF32);
  const int64_t params = 2 * 32 * 8 + 2 * 8 + 2 * (12 * 64 + 13 * 8);
  EXPECT_EQ(TotalBytes(*tensors), params * 14);
}

TEST(GptStateTest, ConfigForBytesIsNearTheTarget) {
  for (int64_t target : {int64_t{200} << 20, int64_t{1} << 30, int64_t{3} << 30}) {
    auto tensors = GptTensors(GptConfigForBytes(target));
    ASSERT_TRUE(tensors.ok());
    const double ratio = static_cast<double>(TotalBytes(*tensors)) / target;
    EXPECT_GT(ratio, 0.6) << target;
    EXPECT_LT(ratio, 1.5) << target;
  }
}

// The Megatron layout JSON parses, gives every tensor a rule and a complete layout, for even
// and uneven meshes.
TEST(GptStateTest, MegatronLayoutIsCompleteForSeveralMeshes) {
  GptConfig c;
  c.layers = 2;
  c.hidden = 12;
  c.vocab = 50;
  auto tensors = GptTensors(c);
  ASSERT_TRUE(tensors.ok());
  for (auto [tp, dp] : {std::pair{2, 2}, {4, 1}, {3, 1}, {1, 3}, {2, 3}}) {
    for (bool flat : {true, false}) {
      auto spec = LayoutSpec::Parse(GptLayoutJson(tp, dp, flat));
      ASSERT_TRUE(spec.ok()) << spec.status();
      auto pieces = spec->AllPieces(*tensors);
      ASSERT_TRUE(pieces.ok()) << pieces.status();
      EXPECT_TRUE(ValidateLayout(*pieces).ok()) << tp << "x" << dp;
    }
  }
  auto spec = LayoutSpec::Parse(GptLayoutJson(2, 2));
  ASSERT_TRUE(spec.ok());
  // rank = dp * 2 + tp: rank 1 holds the second tp half of qkv; optimizer flat over dp.
  auto pieces = spec->PiecesOf({"layers.1.attention.qkv.weight", DType::kBF16, {36, 12}});
  ASSERT_TRUE(pieces.ok());
  EXPECT_EQ((*pieces)[1].region, (Region{{18, 0}, {18, 12}, std::nullopt}));
  EXPECT_EQ((*pieces)[2].replica_id, (std::vector<int64_t>{1}));
  pieces =
      spec->PiecesOf({"optimizer.exp_avg.layers.1.attention.proj.weight", DType::kF32, {12, 12}});
  ASSERT_TRUE(pieces.ok());
  EXPECT_EQ((*pieces)[3].region, (Region{{0, 6}, {12, 6}, FlatRange{36, 72}}));
}

}  // namespace
}  // namespace ckpt
