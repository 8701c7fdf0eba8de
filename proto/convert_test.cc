#include "proto/convert.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

bool Mentions(const absl::Status& s, absl::string_view text) {
  return s.message().find(text) != absl::string_view::npos;
}

TEST(ConvertTest, EveryDTypeRoundTripsThroughItsProtoName) {
  for (DType d : kAllDTypes) {
    const pb::DType p = DTypeToProto(d);
    EXPECT_NE(p, pb::DTYPE_UNSPECIFIED) << DTypeName(d);
    EXPECT_EQ(pb::DType_Name(p), "DTYPE_" + std::string(DTypeName(d)));
    auto back = DTypeFromProto(p);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(DTypeToProto(DType::kF8E4M3), pb::DTYPE_F8_E4M3);
  EXPECT_EQ(DTypeToProto(DType::kBF16), pb::DTYPE_BF16);
}

TEST(ConvertTest, EveryProtoDTypeHasAShardingDType) {
  const google::protobuf::EnumDescriptor* desc = pb::DType_descriptor();
  for (int i = 0; i < desc->value_count(); ++i) {
    const int v = desc->value(i)->number();
    if (v == pb::DTYPE_UNSPECIFIED) continue;
    EXPECT_TRUE(DTypeFromProto(v).ok()) << desc->value(i)->name();
  }
}

TEST(ConvertTest, UnspecifiedAndUnknownDTypesAreErrors) {
  auto s = DTypeFromProto(pb::DTYPE_UNSPECIFIED);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s.status(), "UNSPECIFIED"));
  s = DTypeFromProto(999);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s.status(), "999"));
}

TEST(ConvertTest, RegionRoundTripsWithAndWithoutFlatRange) {
  Region box{{0, 8}, {4, 8}, std::nullopt};
  auto back = RegionFromProto(RegionToProto(box));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, box);
  EXPECT_FALSE(RegionToProto(box).has_flat());
  Region flat{{0, 8}, {4, 8}, FlatRange{3, 30}};
  back = RegionFromProto(RegionToProto(flat));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, flat);
  // An explicit [0, 0) flat range is kept (it holds nothing), not dropped.
  Region empty_flat{{0}, {4}, FlatRange{0, 0}};
  back = RegionFromProto(RegionToProto(empty_flat));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, empty_flat);
  Region scalar{{}, {}, std::nullopt};
  back = RegionFromProto(RegionToProto(scalar));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, scalar);
}

TEST(ConvertTest, MalformedRegionsAreErrors) {
  pb::Region r;
  r.add_offsets(0);
  EXPECT_FALSE(RegionFromProto(r).ok());
  r.add_lengths(-1);
  EXPECT_FALSE(RegionFromProto(r).ok());
  r.set_lengths(0, 4);
  r.mutable_flat()->set_start(3);
  r.mutable_flat()->set_stop(2);
  EXPECT_FALSE(RegionFromProto(r).ok());
  r.mutable_flat()->set_start(-1);
  EXPECT_FALSE(RegionFromProto(r).ok());
}

TEST(ConvertTest, PieceMetaRoundTrips) {
  PieceMeta meta{TensorMeta{"decoder.w", DType::kBF16, {8, 16}},
                 Region{{4, 0}, {4, 16}, FlatRange{5, 60}},
                 {0, 2}};
  auto back = PieceMetaFromProto(PieceMetaToProto(meta));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, meta);
  TensorPiece piece = ToTensorPiece(*back, 7);
  EXPECT_EQ(piece.rank, 7);
  EXPECT_FALSE(piece.is_main_replica());
  EXPECT_EQ(ToPieceMeta(piece), meta);
}

TEST(ConvertTest, PieceMetaErrorsNameTheTensor) {
  PieceMeta meta{TensorMeta{"decoder.w", DType::kF32, {8, 16}}, Region{{4, 0}, {5, 16}, {}}, {}};
  auto s = PieceMetaFromProto(PieceMetaToProto(meta));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(s.status(), "tensor 'decoder.w'")) << s.status();
  EXPECT_TRUE(Mentions(s.status(), "dim 0")) << s.status();

  pb::PieceMeta p = PieceMetaToProto(
      PieceMeta{TensorMeta{"decoder.w", DType::kF32, {8}}, Region{{0}, {8}, {}}, {}});
  p.mutable_tensor()->set_dtype(pb::DTYPE_UNSPECIFIED);
  s = PieceMetaFromProto(p);
  EXPECT_TRUE(Mentions(s.status(), "tensor 'decoder.w'")) << s.status();
  EXPECT_TRUE(Mentions(s.status(), "UNSPECIFIED")) << s.status();

  p = PieceMetaToProto(PieceMeta{TensorMeta{"w", DType::kF32, {8}}, Region{{0}, {8}, {}}, {}});
  p.add_replica_id(-1);
  EXPECT_FALSE(PieceMetaFromProto(p).ok());
  p.clear_replica_id();
  p.mutable_tensor()->set_key("");
  EXPECT_FALSE(PieceMetaFromProto(p).ok());
  p.mutable_tensor()->set_key("w");
  p.mutable_tensor()->set_global_shape(0, -8);
  EXPECT_FALSE(PieceMetaFromProto(p).ok());
  p.mutable_tensor()->set_global_shape(0, 8);
  p.mutable_region()->add_offsets(0);
  p.mutable_region()->add_lengths(1);
  s = PieceMetaFromProto(p);
  EXPECT_TRUE(Mentions(s.status(), "tensor 'w'")) << s.status();  // rank mismatch
}

TEST(ConvertTest, TensorMetaRoundTrips) {
  TensorMeta meta{"emb", DType::kF8E5M2, {128256, 8192}};
  auto back = TensorMetaFromProto(TensorMetaToProto(meta));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, meta);
}

}  // namespace
}  // namespace ckpt
