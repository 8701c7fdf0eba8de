#include "storage/manifest_codec.h"

#include <functional>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checksum.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

pb::StoredPiece* AddPiece(pb::Manifest* m, const std::string& key, const Region& r,
                          const std::string& file, int64_t offset, int64_t elem) {
  pb::StoredPiece* p = m->add_pieces();
  p->set_key(key);
  *p->mutable_region() = RegionToProto(r);
  p->set_file(file);
  p->set_entry_name(EncodeEntryName(key, r));
  p->set_byte_offset(offset);
  p->set_byte_length(r.NumElements() * elem);
  return p;
}

// Tensor "w" F32 (4, 6) in two row pieces in one file; scalar "s" I64 in a second file.
pb::Manifest ValidManifest() {
  pb::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_checksum_block_bytes(4096);
  auto* w = m.add_tensors();
  w->set_key("w");
  w->set_dtype(pb::DTYPE_F32);
  w->add_global_shape(4);
  w->add_global_shape(6);
  auto* s = m.add_tensors();
  s->set_key("s");
  s->set_dtype(pb::DTYPE_I64);
  auto* f0 = m.add_files();
  f0->set_name("data/r0_0.safetensors");
  f0->set_data_start(64);
  f0->set_size_bytes(64 + 96);
  auto* f1 = m.add_files();
  f1->set_name("data/r1_0.safetensors");
  f1->set_data_start(64);
  f1->set_size_bytes(72);
  AddPiece(&m, "w", Region{{0, 0}, {2, 6}, std::nullopt}, f0->name(), 64, 4);
  AddPiece(&m, "w", Region{{2, 0}, {2, 6}, std::nullopt}, f0->name(), 112, 4);
  AddPiece(&m, "s", Region{}, f1->name(), 64, 8);
  return m;
}

TEST(ManifestCodecTest, ValidManifestRoundTripsThroughBytes) {
  pb::Manifest m = ValidManifest();
  ASSERT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
  auto parsed = ParseManifest(SerializeManifest(m), "ck/manifest.pb");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->pieces_size(), 3);
  EXPECT_EQ(SerializeManifest(*parsed), SerializeManifest(m));
}

// The shape ignores what a repeat save changes (checksums, time, step, metadata, layout) and
// changes with anything else ValidateManifest reads.
TEST(ManifestCodecTest, ShapeIgnoresChecksumsAndTimeButNotWhereBytesLie) {
  const pb::Manifest base = ValidManifest();
  const ManifestShape shape = ManifestShapeOf(base);
  pb::Manifest same = base;
  same.mutable_pieces(0)->set_xxh3_64(12345);
  same.set_created_unix_micros(99);
  same.set_step(7);
  (*same.mutable_user_metadata())["run"] = "b";
  same.mutable_saved_layout()->set_world_size(2);
  EXPECT_EQ(ManifestShapeOf(same), shape);
  const std::vector<std::function<void(pb::Manifest*)>> changes = {
      [](pb::Manifest* m) { m->set_checksum_block_bytes(8192); },
      [](pb::Manifest* m) { m->mutable_tensors(0)->set_global_shape(0, 5); },
      [](pb::Manifest* m) { m->mutable_tensors(1)->set_dtype(pb::DTYPE_F64); },
      [](pb::Manifest* m) { m->mutable_files(0)->set_size_bytes(64 + 100); },
      [](pb::Manifest* m) { m->mutable_files(1)->set_name("data/r1_1.safetensors"); },
      [](pb::Manifest* m) { m->mutable_pieces(0)->set_key("s"); },
      [](pb::Manifest* m) { m->mutable_pieces(0)->mutable_region()->set_offsets(0, 1); },
      [](pb::Manifest* m) { m->mutable_pieces(1)->set_file("data/r1_0.safetensors"); },
      [](pb::Manifest* m) { m->mutable_pieces(1)->set_entry_name("x"); },
      [](pb::Manifest* m) { m->mutable_pieces(1)->set_byte_offset(64); },
      [](pb::Manifest* m) { m->mutable_pieces(2)->set_byte_length(4); },
      [](pb::Manifest* m) { m->mutable_pieces(2)->add_block_xxh3(1); },
      [](pb::Manifest* m) { m->mutable_pieces()->SwapElements(0, 1); },
      [](pb::Manifest* m) { m->mutable_pieces()->RemoveLast(); },
  };
  for (size_t c = 0; c < changes.size(); ++c) {
    pb::Manifest changed = base;
    changes[c](&changed);
    EXPECT_NE(ManifestShapeOf(changed), shape) << "change " << c;
  }
}

TEST(ManifestCodecTest, PieceChecksumsMustCombineToThePieceChecksum) {
  pb::Manifest m = ValidManifest();
  pb::StoredPiece* p = m.mutable_pieces(0);
  p->add_block_xxh3(1);
  p->add_block_xxh3(2);
  p->set_xxh3_64(CombineBlockHashes({1, 2}));
  EXPECT_TRUE(CheckPieceChecksums(m, 0).ok());
  p->set_xxh3_64(CombineBlockHashes({1, 3}));
  EXPECT_THAT(CheckPieceChecksums(m, 0).message(), HasSubstr("piece 0 (tensor \"w\" region"));
  EXPECT_EQ(CheckPieceChecksums(m, 0).code(), absl::StatusCode::kDataLoss);
}

TEST(ManifestCodecTest, PieceRegionOfValidatedPieces) {
  pb::Manifest m = ValidManifest();
  EXPECT_EQ(PieceRegion(m.pieces(1)), (Region{{2, 0}, {2, 6}, std::nullopt}));
  m.mutable_pieces(1)->mutable_region()->add_offsets(1);  // malformed: 3 offsets, 2 lengths
  EXPECT_EQ(PieceRegion(m.pieces(1)), Region{});
  EXPECT_FALSE(ValidateManifest(m).ok());
}

TEST(ManifestCodecTest, DataFileNamesMustStayInsideDataDir) {
  EXPECT_TRUE(ValidateDataFileName(DataFileName(3, 7)).ok());
  EXPECT_EQ(DataFileName(3, 7), "data/r3_7.safetensors");
  for (const char* bad :
       {"r0.safetensors", "data/../x.safetensors", "/data/a.safetensors", "data/sub/a.safetensors",
        "data/.hidden.safetensors", "data/a.bin", "data/.safetensors", "data/a b.safetensors"}) {
    EXPECT_FALSE(ValidateDataFileName(bad).ok()) << bad;
  }
}

struct Mutation {
  const char* what;
  std::function<void(pb::Manifest*)> apply;
  const char* message;
};

// Each kind of inconsistency ValidateManifest finds in ValidManifest(), with its message.
std::vector<Mutation> Inconsistencies() {
  return {
      {"version", [](pb::Manifest* m) { m->set_format_version(2); }, "format version 2"},
      {"dup tensor", [](pb::Manifest* m) { *m->add_tensors() = m->tensors(0); }, "twice"},
      {"empty key", [](pb::Manifest* m) { m->mutable_tensors(1)->set_key(""); }, "empty key"},
      {"bad dtype",
       [](pb::Manifest* m) { m->mutable_tensors(0)->set_dtype(pb::DTYPE_UNSPECIFIED); }, "dtype"},
      {"unknown tensor", [](pb::Manifest* m) { m->mutable_pieces(0)->set_key("zz"); },
       "not listed"},
      {"region out of tensor",
       [](pb::Manifest* m) { m->mutable_pieces(1)->mutable_region()->set_offsets(0, 3); },
       "tensor \"w\""},
      {"length", [](pb::Manifest* m) { m->mutable_pieces(0)->set_byte_length(40); }, "byte length"},
      {"file name",
       [](pb::Manifest* m) { m->mutable_files(0)->set_name("data/../../etc.safetensors"); },
       "data file name"},
      {"unknown file",
       [](pb::Manifest* m) { m->mutable_pieces(2)->set_file("data/r9_0.safetensors"); },
       "data file is not listed"},
      {"outside file", [](pb::Manifest* m) { m->mutable_pieces(2)->set_byte_offset(70); },
       "outside the data section"},
      {"in header", [](pb::Manifest* m) { m->mutable_pieces(0)->set_byte_offset(8); },
       "outside the data section"},
      {"entry name", [](pb::Manifest* m) { m->mutable_pieces(0)->set_entry_name("w"); },
       "entry name"},
      {"overlap", [](pb::Manifest* m) { m->mutable_pieces(1)->set_byte_offset(100); }, "overlap"},
      {"duplicate piece",
       [](pb::Manifest* m) {
         *m->add_pieces() = m->pieces(0);
         m->mutable_pieces(3)->set_file("data/r1_0.safetensors");
         m->mutable_pieces(3)->set_byte_offset(72);
         m->mutable_files(1)->set_size_bytes(200);
       },
       "is stored by 2 pieces (an overlap): tensor \"w\" region [0:2, 0:6] in "
       "data/r0_0.safetensors and tensor \"w\" region [0:2, 0:6] in data/r1_0.safetensors"},
      {"duplicate empty piece",
       [](pb::Manifest* m) {
         m->mutable_tensors(0)->set_global_shape(0, 0);
         m->mutable_files(0)->set_size_bytes(64);
         for (int i : {0, 1}) {
           auto* p = m->mutable_pieces(i);
           *p->mutable_region() = RegionToProto(Region{{0, 0}, {0, 6}, std::nullopt});
           p->set_entry_name(EncodeEntryName("w", PieceRegion(*p)));
           p->set_byte_offset(64);
           p->set_byte_length(0);
         }
       },
       "stored twice"},
      {"blocks",
       [](pb::Manifest* m) {
         m->mutable_pieces(0)->add_block_xxh3(1);
         m->mutable_pieces(0)->set_xxh3_64(CombineBlockHashes({1}));
       },
       "block checksums"},
      {"block size", [](pb::Manifest* m) { m->set_checksum_block_bytes(100); }, "block size"},
      {"hash list",
       [](pb::Manifest* m) {
         m->mutable_pieces(0)->add_block_xxh3(1);
         m->mutable_pieces(0)->add_block_xxh3(2);
       },
       "does not match its block checksums"},
      {"data start", [](pb::Manifest* m) { m->mutable_files(1)->set_data_start(3); }, "data start"},
  };
}

TEST(ManifestCodecTest, ValidationRejectsEachKindOfInconsistency) {
  for (const Mutation& c : Inconsistencies()) {
    pb::Manifest m = ValidManifest();
    c.apply(&m);
    absl::Status s = ValidateManifest(m);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what << ": " << s;
  }
}

TEST(ManifestCodecTest, HeaderMustAgreeWithManifest) {
  pb::Manifest m = ValidManifest();
  SafetensorsHeader h;
  h.data_start = 64;
  h.data_bytes = 8;
  h.entries.push_back({"s|", DType::kI64, {}, 0, 8});
  EXPECT_TRUE(CheckHeaderAgainstManifest(m, m.files(1), h).ok());
  SafetensorsHeader wrong_dtype = h;
  wrong_dtype.entries[0].dtype = DType::kF64;
  EXPECT_THAT(std::string(CheckHeaderAgainstManifest(m, m.files(1), wrong_dtype).message()),
              HasSubstr("entry \"s|\""));
  SafetensorsHeader extra = h;
  extra.entries[0].end = 0;
  extra.entries[0].shape = {0};
  extra.entries[0].name = "other|0:0";
  extra.entries.push_back({"s|", DType::kI64, {}, 0, 8});
  EXPECT_THAT(std::string(CheckHeaderAgainstManifest(m, m.files(1), extra).message()),
              HasSubstr("not listed in the manifest"));
  SafetensorsHeader missing;
  missing.data_start = 64;
  missing.data_bytes = 8;
  EXPECT_THAT(std::string(CheckHeaderAgainstManifest(m, m.files(1), missing).message()),
              HasSubstr("missing"));
}

// A share (some of a manifest's pieces, in any order) passes without tiling its tensors, in
// format 1 or 2 (without piece files); everything else ValidateManifest checks of the head and
// of each piece, and bytes shared by two pieces, are refused with ValidateManifest's message.
TEST(ManifestCodecTest, ShareValidationChecksEachPieceButNotCoverage) {
  pb::Manifest share = ValidManifest();
  share.mutable_pieces()->SwapElements(0, 2);
  share.mutable_pieces()->DeleteSubrange(1, 1);  // rows 2:4 of "w": a hole
  EXPECT_FALSE(ValidateManifest(share).ok());
  EXPECT_TRUE(ValidateManifestShare(share).ok()) << ValidateManifestShare(share);
  share.set_format_version(kManifestPieceFilesFormatVersion);
  EXPECT_TRUE(ValidateManifestShare(share).ok()) << ValidateManifestShare(share);
  share.clear_pieces();
  EXPECT_TRUE(ValidateManifestShare(share).ok()) << ValidateManifestShare(share);

  for (const Mutation& c : Inconsistencies()) {
    const std::string what = c.what;
    if (what == "version" || what == "duplicate piece") continue;  // a share may
    pb::Manifest m = ValidManifest();
    c.apply(&m);
    absl::Status s = ValidateManifestShare(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.what << ": " << s;
  }
  pb::Manifest listed = ValidManifest();
  listed.add_piece_files()->set_name(ManifestPieceFileName(0));
  EXPECT_THAT(std::string(ValidateManifestShare(listed).message()),
              HasSubstr("a share lists 1 piece files"));
  pb::Manifest future = ValidManifest();
  future.set_format_version(3);
  EXPECT_EQ(ValidateManifestShare(future).code(), absl::StatusCode::kUnimplemented);
}

// A share's data file may hold entries the share does not know; the share's own must be there
// at their offsets, and the file of its size.
TEST(ManifestCodecTest, ShareHeaderNeedsOnlyTheSharesEntries) {
  pb::Manifest share = ValidManifest();
  share.mutable_pieces()->DeleteSubrange(1, 2);  // only w rows 0:2, in file 0
  const ManifestIndex index(share);
  SafetensorsHeader h;
  h.data_start = 64;
  h.data_bytes = 96;
  h.entries.push_back({"w|0:2,0:6", DType::kF32, {2, 6}, 0, 48});
  h.entries.push_back({"w|2:4,0:6", DType::kF32, {2, 6}, 48, 96});
  EXPECT_TRUE(CheckHeaderAgainstShare(index, share.files(0), h).ok());
  EXPECT_THAT(std::string(CheckHeaderAgainstManifest(index, share.files(0), h).message()),
              HasSubstr("not listed in the manifest"));
  SafetensorsHeader moved = h;
  std::swap(moved.entries[0].begin, moved.entries[1].begin);
  std::swap(moved.entries[0].end, moved.entries[1].end);
  EXPECT_THAT(std::string(CheckHeaderAgainstShare(index, share.files(0), moved).message()),
              HasSubstr("entry \"w|0:2,0:6\": header has dtype F32 shape (2, 6) at [112, 160)"));
  SafetensorsHeader missing = h;
  missing.entries.erase(missing.entries.begin());
  EXPECT_THAT(std::string(CheckHeaderAgainstShare(index, share.files(0), missing).message()),
              HasSubstr("entry \"w|0:2,0:6\": listed in the manifest but missing"));
  SafetensorsHeader longer = h;
  longer.data_bytes = 100;
  EXPECT_THAT(std::string(CheckHeaderAgainstShare(index, share.files(0), longer).message()),
              HasSubstr("data file data/r0_0.safetensors: header says data starts at 64 with 100"));
}

// Random byte flips and truncations of a serialized manifest: errors or a manifest that
// still validates; never a crash (also run under ASan).
TEST(ManifestCodecTest, FuzzedManifestBytesNeverCrash) {
  const std::string good = SerializeManifest(ValidManifest());
  std::mt19937 rng(99);
  int rejected = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    std::string bytes = good;
    const int flips = 1 + rng() % 3;
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    auto m = ParseManifest(bytes, "fuzz/manifest.pb");
    if (!m.ok()) {
      ++rejected;
      continue;
    }
    ASSERT_TRUE(ValidateManifest(*m).ok());
  }
  EXPECT_GT(rejected, 2500);
}

}  // namespace
}  // namespace ckpt
