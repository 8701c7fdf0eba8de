#include "storage/manifest_file.h"

#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/manifest_codec.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A manifest shaped like a large save's (not necessarily valid): `num_pieces` pieces of a few
// tensors over several files, some with block checksums, a saved layout and user metadata
// (a map: the deterministic serialization sorts it).
pb::Manifest RandomManifest(std::mt19937_64& rng, int num_pieces) {
  pb::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_checksum_block_bytes(4096);
  m.set_step(static_cast<int64_t>(rng() % 100000));
  m.set_created_unix_micros(static_cast<int64_t>(rng() >> 2));
  m.set_writer_version(kWriterVersion);
  for (int t = 0; t < 5; ++t) {
    pb::TensorMeta* meta = m.add_tensors();
    meta->set_key(absl::StrCat("decoder.layers.", t, ".self_attention.linear_qkv.weight"));
    meta->set_dtype(pb::DTYPE_BF16);
    meta->add_global_shape(12288 * 3);
    meta->add_global_shape(12288);
  }
  for (int f = 0; f < 1 + num_pieces / 100; ++f) {
    pb::DataFile* file = m.add_files();
    file->set_name(DataFileName(f, static_cast<int>(rng() % 3)));
    file->set_writer_rank(f);
    file->set_data_start(4096);
    file->set_size_bytes(static_cast<int64_t>(rng() % (int64_t{1} << 40)));
  }
  for (int i = 0; i < num_pieces; ++i) {
    pb::StoredPiece* p = m.add_pieces();
    p->set_key(m.tensors(static_cast<int>(rng() % 5)).key());
    const Region region{{static_cast<int64_t>(rng() % 4096), 0}, {4608, 12288}, std::nullopt};
    *p->mutable_region() = RegionToProto(region);
    p->set_file(m.files(i / 100).name());
    p->set_entry_name(EncodeEntryName(p->key(), region));
    p->set_byte_offset(static_cast<int64_t>(rng() % (int64_t{1} << 40)));
    p->set_byte_length(4608 * 12288 * 2);
    p->set_xxh3_64(rng());
    p->set_writer_rank(i / 100);
    for (int b = static_cast<int>(rng() % 4); b > 0; --b) p->add_block_xxh3(rng());
  }
  m.mutable_saved_layout()->set_world_size(static_cast<int>(num_pieces / 7 + 1));
  for (int k = 0; k < 6; ++k) {
    (*m.mutable_user_metadata())[absl::StrCat("key", rng() % 1000)] = absl::StrCat(rng());
  }
  return m;
}

// The streamed file holds exactly SerializeManifest's bytes, for manifests from a few bytes to
// several times the write buffer.
TEST(ManifestFileTest, StreamedFileHoldsExactlyTheSerializedManifest) {
  const std::string dir = TestDir("manifest-file");
  std::mt19937_64 rng(16);
  for (int num_pieces : {0, 1, 7, 300, 20000}) {
    const pb::Manifest m = RandomManifest(rng, num_pieces);
    const std::string path = absl::StrCat(dir, "/manifest-", num_pieces, ".pb");
    ASSERT_TRUE(WriteManifestDurably(path, m).ok());
    const std::string want = SerializeManifest(m);
    const std::string got = ReadAll(path);
    EXPECT_EQ(got.size(), want.size()) << num_pieces << " pieces";
    EXPECT_TRUE(got == want) << num_pieces << " pieces: the bytes differ";
  }
}

// An empty manifest gives an empty file (not a missing one); rewriting truncates.
TEST(ManifestFileTest, RewritingTruncatesTheEarlierManifest) {
  const std::string dir = TestDir("manifest-file-rewrite");
  std::mt19937_64 rng(5);
  const std::string path = dir + "/manifest.pb";
  ASSERT_TRUE(WriteManifestDurably(path, RandomManifest(rng, 50)).ok());
  ASSERT_TRUE(WriteManifestDurably(path, pb::Manifest()).ok());
  EXPECT_EQ(ReadAll(path), "");
}

TEST(ManifestFileTest, UncreatableFileIsNamedInTheError) {
  const std::string path = TestDir("manifest-file-missing") + "/no/such/dir/manifest.pb";
  absl::Status s = WriteManifestDurably(path, pb::Manifest());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

}  // namespace
}  // namespace ckpt
