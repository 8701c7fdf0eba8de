#include "coordinator/manifest_share.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

// Ten pieces: piece i of tensor "t<i % 3>" in file "data/r<i>_0.safetensors".
pb::Manifest TenPieces() {
  pb::Manifest m;
  m.set_format_version(2);
  m.set_checksum_block_bytes(1 << 20);
  m.set_step(7);
  (*m.mutable_user_metadata())["run"] = "a";
  for (int t = 0; t < 3; ++t) m.add_tensors()->set_key(absl::StrCat("t", t));
  for (int i = 0; i < 10; ++i) {
    pb::StoredPiece* p = m.add_pieces();
    p->set_key(absl::StrCat("t", i % 3));
    p->set_file(absl::StrCat("data/r", i, "_0.safetensors"));
    p->set_byte_length(64 + i);
    p->set_xxh3_64(1000 + i);
    pb::DataFile* f = m.add_files();
    f->set_name(p->file());
    f->set_size_bytes(128 + i);
  }
  return m;
}

TEST(ManifestShareTest, KeepsThePiecesOfThePartsUnitsAtTheirIndicesAndTheirTensorsAndFiles) {
  const pb::Manifest whole = TenPieces();
  pb::LoadPlanPart part;
  pb::LoadWaveEntry* wave = part.add_waves();
  wave->add_units()->set_piece(4);              // t1
  part.add_waves()->add_units()->set_piece(6);  // t0
  part.add_requests()->set_key("t2");           // requested, not read here
  const pb::Manifest share = ManifestShareFor(whole, part);
  ASSERT_EQ(share.pieces_size(), whole.pieces_size());
  for (int i = 0; i < whole.pieces_size(); ++i) {
    if (i == 4 || i == 6) {
      EXPECT_EQ(share.pieces(i).SerializeAsString(), whole.pieces(i).SerializeAsString()) << i;
    } else {
      EXPECT_EQ(share.pieces(i).ByteSizeLong(), 0u) << i;
    }
  }
  ASSERT_EQ(share.tensors_size(), 3);  // t0 and t1 (read), t2 (requested), in manifest order
  EXPECT_EQ(share.tensors(0).key(), "t0");
  EXPECT_EQ(share.tensors(2).key(), "t2");
  ASSERT_EQ(share.files_size(), 2);
  EXPECT_EQ(share.files(0).name(), "data/r4_0.safetensors");
  EXPECT_EQ(share.files(1).name(), "data/r6_0.safetensors");
  EXPECT_EQ(share.format_version(), 2u);
  EXPECT_EQ(share.checksum_block_bytes(), 1 << 20);
  EXPECT_TRUE(share.user_metadata().empty());
  EXPECT_LT(share.ByteSizeLong(), whole.ByteSizeLong() / 2);
}

TEST(ManifestShareTest, UnitsNamingNoPieceOfTheManifestAreLeftForTheWorkerToRefuse) {
  pb::LoadPlanPart part;
  part.add_waves()->add_units()->set_piece(99);
  part.add_waves()->add_units()->set_piece(-1);
  const pb::Manifest share = ManifestShareFor(TenPieces(), part);
  EXPECT_EQ(share.pieces_size(), 10);  // the worker refuses piece 99 against this count
  EXPECT_EQ(share.tensors_size(), 0);
}

}  // namespace
}  // namespace ckpt::coordinator
