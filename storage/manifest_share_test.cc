#include "storage/manifest_share.h"

#include <string>

#include "gtest/gtest.h"
#include "proto/convert.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

// A share of one 4x4 f32 tensor (id 7) stored as two row halves in one file (id 3).
pb::ManifestShare TwoPieceShare() {
  pb::ManifestShare share;
  share.set_format_version(1);
  share.set_checksum_block_bytes(1 << 20);
  pb::TensorMeta* t = share.add_tensors();
  t->set_key("layer.w");
  t->set_dtype(pb::DTYPE_F32);
  t->add_global_shape(4);
  t->add_global_shape(4);
  share.add_tensor_ids(7);
  share.add_files()->set_name("data/r0_0.safetensors");
  share.add_file_ids(3);
  for (int half = 0; half < 2; ++half) {
    pb::SharedPiece* p = share.add_pieces();
    p->set_tensor_id(7);
    p->set_file_id(3);
    Region region{{2 * half, 0}, {2, 4}, std::nullopt};
    *p->mutable_region() = RegionToProto(region);
    p->set_byte_offset(100 + 32 * half);
    p->set_byte_length(32);
    p->set_xxh3_64(11 + half);
    p->set_writer_rank(0);
  }
  return share;
}

TEST(ManifestShareTest, ExpandsIdsIntoKeysFilesAndEntryNames) {
  absl::StatusOr<pb::Manifest> m = ExpandManifestShare(TwoPieceShare());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format_version(), 1u);
  EXPECT_EQ(m->checksum_block_bytes(), 1 << 20);
  ASSERT_EQ(m->tensors_size(), 1);
  ASSERT_EQ(m->files_size(), 1);
  ASSERT_EQ(m->pieces_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const pb::StoredPiece& p = m->pieces(i);
    EXPECT_EQ(p.key(), "layer.w");
    EXPECT_EQ(p.file(), "data/r0_0.safetensors");
    EXPECT_EQ(p.entry_name(), EncodeEntryName("layer.w", *RegionFromProto(p.region())));
    EXPECT_EQ(p.byte_offset(), 100 + 32 * i);
    EXPECT_EQ(p.xxh3_64(), static_cast<uint64_t>(11 + i));
  }
}

void ExpectDataLossMentioning(const pb::ManifestShare& share, const std::string& words) {
  absl::StatusOr<pb::Manifest> m = ExpandManifestShare(share);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_NE(m.status().message().find(words), std::string::npos) << m.status();
}

TEST(ManifestShareTest, AnInconsistentShareIsDataLossNamingTheId) {
  pb::ManifestShare unknown_tensor = TwoPieceShare();
  unknown_tensor.mutable_pieces(1)->set_tensor_id(8);
  ExpectDataLossMentioning(unknown_tensor, "tensor id 8");
  pb::ManifestShare unknown_file = TwoPieceShare();
  unknown_file.mutable_pieces(0)->set_file_id(4);
  ExpectDataLossMentioning(unknown_file, "file id 4");
  pb::ManifestShare twice = TwoPieceShare();
  *twice.add_files() = twice.files(0);
  twice.add_file_ids(3);
  ExpectDataLossMentioning(twice, "file id 3 is listed twice");
  pb::ManifestShare unpaired = TwoPieceShare();
  unpaired.add_tensor_ids(9);
  ExpectDataLossMentioning(unpaired, "1 tensors but 2 tensor ids");
  pb::ManifestShare bad_region = TwoPieceShare();
  bad_region.mutable_pieces(0)->mutable_region()->add_lengths(-1);
  ExpectDataLossMentioning(bad_region, "piece 0");
}

// An exchange share: TwoPieceShare's pieces read, and the other 2x4 half of a second tensor
// (id 2) only described.
pb::ManifestShare ShareWithUnreadPiece() {
  pb::ManifestShare share = TwoPieceShare();
  pb::TensorMeta* t = share.add_tensors();
  t->set_key("layer.b");
  t->set_dtype(pb::DTYPE_I32);
  t->add_global_shape(4);
  t->add_global_shape(4);
  share.add_tensor_ids(2);
  pb::SharedPiece* p = share.add_unread_pieces();
  p->set_tensor_id(2);
  *p->mutable_region() = RegionToProto(Region{{2, 0}, {2, 4}, std::nullopt});
  return share;
}

TEST(ManifestShareTest, UnreadPiecesExpandToTheirKeyAndRegionOnly) {
  const pb::ManifestShare share = ShareWithUnreadPiece();
  absl::StatusOr<std::vector<pb::StoredPiece>> unread = ExpandUnreadPieces(share);
  ASSERT_TRUE(unread.ok()) << unread.status();
  ASSERT_EQ(unread->size(), 1u);
  EXPECT_EQ((*unread)[0].key(), "layer.b");
  EXPECT_EQ(*RegionFromProto((*unread)[0].region()), (Region{{2, 0}, {2, 4}, std::nullopt}));
  EXPECT_TRUE((*unread)[0].file().empty());
  absl::StatusOr<pb::Manifest> read = ExpandManifestShare(share);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->pieces_size(), 2);  // the unread piece is not among those opened
}

TEST(ManifestShareTest, AHostileUnreadPieceIsDataLossNamingIt) {
  auto expect = [](const pb::ManifestShare& share, const std::string& words) {
    absl::StatusOr<std::vector<pb::StoredPiece>> unread = ExpandUnreadPieces(share);
    ASSERT_FALSE(unread.ok());
    EXPECT_EQ(unread.status().code(), absl::StatusCode::kDataLoss) << unread.status();
    EXPECT_NE(unread.status().message().find(words), std::string::npos) << unread.status();
  };
  pb::ManifestShare unknown = ShareWithUnreadPiece();
  unknown.mutable_unread_pieces(0)->set_tensor_id(5);
  expect(unknown, "unread piece 0 names tensor id 5");
  pb::ManifestShare outside = ShareWithUnreadPiece();
  outside.mutable_unread_pieces(0)->mutable_region()->set_offsets(0, 3);  // rows 3-4 of 4
  expect(outside, "unread piece 0 of tensor layer.b");
  pb::ManifestShare bad = ShareWithUnreadPiece();
  bad.mutable_unread_pieces(0)->mutable_region()->add_lengths(-1);
  expect(bad, "unread piece 0");
  pb::ManifestShare unpaired = ShareWithUnreadPiece();
  unpaired.add_tensor_ids(9);
  expect(unpaired, "2 tensors but 3 tensor ids");
}

}  // namespace
}  // namespace ckpt
