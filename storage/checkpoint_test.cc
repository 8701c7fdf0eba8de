#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// A tensor with deterministic contents and helpers to cut pieces out of it.
struct TestTensor {
  TensorMeta spec;
  std::string bytes;  // row-major, whole tensor

  TestTensor(std::string key, DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    spec = {std::move(key), dtype, std::move(shape)};
    int64_t n = 1;
    for (int64_t d : spec.global_shape) n *= d;
    bytes.resize(n * DTypeSize(dtype));
    std::mt19937 rng(seed);
    for (auto& c : bytes) c = static_cast<char>(rng());
  }
  int64_t es() const { return DTypeSize(spec.dtype); }
  // Bytes of `r` in storage order (row-major box, narrowed to flat), by brute force.
  std::string Extract(const Region& r) const {
    std::string out;
    const int nd = r.ndim();
    int64_t box = r.BoxElements();
    std::vector<int64_t> idx(nd, 0);
    for (int64_t i = 0; i < box; ++i) {
      if (!r.flat || (i >= r.flat->start && i < r.flat->stop)) {
        int64_t g = 0;
        for (int d = 0; d < nd; ++d) g = g * spec.global_shape[d] + r.offsets[d] + idx[d];
        out.append(bytes.data() + g * es(), es());
      }
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < r.lengths[d]) break;
        idx[d] = 0;
      }
    }
    return out;
  }
};

// Holds piece bytes alive for the writer.
struct Pieces {
  std::vector<std::unique_ptr<std::string>> storage;
  PieceData Make(const TestTensor& t, const Region& r) {
    storage.push_back(std::make_unique<std::string>(t.Extract(r)));
    return {t.spec.key, r, storage.back()->data(), static_cast<int64_t>(storage.back()->size())};
  }
};

Region Box(std::vector<int64_t> off, std::vector<int64_t> len) {
  return Region{std::move(off), std::move(len), std::nullopt};
}

TEST(CheckpointTest, RoundTripsEveryDTypeAndOddShapes) {
  const std::string dir = TestDir("rt");
  std::vector<TestTensor> tensors;
  uint32_t seed = 1;
  for (DType d : kAllDTypes) {
    tensors.emplace_back(std::string("t.") + std::string(DTypeName(d)), d,
                         std::vector<int64_t>{5, 7}, seed++);
  }
  tensors.emplace_back("scalar", DType::kF64, std::vector<int64_t>{}, seed++);
  tensors.emplace_back("empty", DType::kBF16, std::vector<int64_t>{0, 4}, seed++);
  tensors.emplace_back(std::string(5000, 'k') + ".long", DType::kU8, std::vector<int64_t>{3},
                       seed++);
  tensors.emplace_back("模型.层.0.权重|ü%😀", DType::kF16, std::vector<int64_t>{2, 3}, seed++);
  tensors.emplace_back("../../../escape/../x", DType::kI32, std::vector<int64_t>{4}, seed++);

  Pieces pieces;
  CheckpointContents c;
  c.step = 42;
  c.user_metadata = {{"run", "unit-test"}};
  c.saved_layout.set_world_size(2);
  std::vector<PieceData> rank0, rank1;
  for (const TestTensor& t : tensors) {
    c.tensors.push_back(t.spec);
    if (t.spec.global_shape == std::vector<int64_t>{5, 7}) {
      rank0.push_back(pieces.Make(t, Box({0, 0}, {2, 7})));
      rank1.push_back(pieces.Make(t, Region{{2, 0}, {3, 7}, FlatRange{0, 9}}));
      rank1.push_back(pieces.Make(t, Region{{2, 0}, {3, 7}, FlatRange{9, 21}}));
    } else {
      rank0.push_back(pieces.Make(t, WholeRegion(t.spec.global_shape)));
    }
  }
  c.files = BalanceIntoFiles(rank0, 3, 0);
  for (DataFilePlan& f : BalanceIntoFiles(rank1, 2, 1)) c.files.push_back(std::move(f));
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, c, WriteOptions{});
  ASSERT_TRUE(m.ok()) << m.status();

  // Only the checkpoint itself exists next to it; every file is inside data/.
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});
  auto data_files = ListDir(JoinPath(path, "data"));
  ASSERT_TRUE(data_files.ok());
  EXPECT_EQ(data_files->size(), 5u);
  EXPECT_EQ(*ListDir(path), (std::vector<std::string>{"data", "manifest.pb"}));

  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().step(), 42);
  EXPECT_EQ((*reader)->manifest().user_metadata().at("run"), "unit-test");
  for (const TestTensor& t : tensors) {
    std::string out(t.bytes.size(), '\x55');
    absl::Status s =
        (*reader)->ReadRegion(t.spec.key, WholeRegion(t.spec.global_shape), out.data());
    ASSERT_TRUE(s.ok()) << t.spec.key.substr(0, 40) << ": " << s;
    EXPECT_TRUE(out == t.bytes) << t.spec.key.substr(0, 40);
  }
  // A region crossing box and flat pieces, assembled from three pieces.
  const TestTensor& f32 = tensors[11];
  ASSERT_EQ(f32.spec.dtype, DType::kF32);
  Region want{{1, 2}, {3, 4}, FlatRange{1, 11}};
  std::string out(want.NumElements() * 4, '\0');
  ASSERT_TRUE((*reader)->ReadRegion(f32.spec.key, want, out.data()).ok());
  EXPECT_TRUE(out == f32.Extract(want));
}

// Three tensors of `rows` x 7, each stored as one piece per row, spread over four files.
CheckpointContents RowPieces(Pieces& pieces, std::vector<TestTensor>& tensors, int rows) {
  CheckpointContents c;
  c.step = 5;
  std::vector<PieceData> all;
  for (int k = 0; k < 3; ++k) {
    tensors.emplace_back(absl::StrCat("layers.", k, ".w"), k == 1 ? DType::kBF16 : DType::kF32,
                         std::vector<int64_t>{rows, 7}, 40 + k);
  }
  for (const TestTensor& t : tensors) {
    c.tensors.push_back(t.spec);
    for (int r = 0; r < rows; ++r) all.push_back(pieces.Make(t, Box({r, 0}, {1, 7})));
  }
  c.files = BalanceIntoFiles(all, 4, 0);
  return c;
}

// A manifest forced into several piece files commits a checkpoint that loads bit-exact, with
// the pieces, in order, of the single-file manifest of the same contents.
TEST(CheckpointTest, ManifestInPieceFilesLoadsLikeTheSingleFileOne) {
  const std::string dir = TestDir("piece-files");
  std::vector<TestTensor> tensors;
  Pieces pieces;
  const CheckpointContents c = RowPieces(pieces, tensors, 30);
  const std::string single = JoinPath(dir, "single"), split = JoinPath(dir, "split");
  ASSERT_TRUE(WriteCheckpoint(single, c, WriteOptions{}).ok());
  WriteOptions options;
  options.manifest_files.max_single_file_bytes = 4096;
  options.manifest_files.piece_file_bytes = 1000;
  ASSERT_TRUE(WriteCheckpoint(split, c, options).ok());
  const std::vector<std::string> names = *ListDir(split);
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(names.front(), "data");
  EXPECT_EQ(names[1], "manifest-pieces-00000.pb");
  EXPECT_EQ(names.back(), "manifest.pb");

  auto one = CheckpointReader::Open(single);
  auto many = CheckpointReader::Open(split);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ((*one)->manifest().format_version(), kManifestFormatVersion);
  EXPECT_EQ((*many)->manifest().format_version(), kManifestPieceFilesFormatVersion);
  EXPECT_EQ((*many)->manifest().piece_files_size(), static_cast<int>(names.size()) - 2);
  pb::Manifest want, got;  // the pieces sections
  *want.mutable_pieces() = (*one)->manifest().pieces();
  *got.mutable_pieces() = (*many)->manifest().pieces();
  EXPECT_EQ(got.pieces_size(), 90);
  EXPECT_TRUE(SerializeManifest(got) == SerializeManifest(want)) << "the pieces differ";
  for (const TestTensor& t : tensors) {
    std::string out(t.bytes.size(), '\x55');
    ASSERT_TRUE((*many)->ReadRegion(t.spec.key, WholeRegion(t.spec.global_shape), out.data()).ok());
    EXPECT_TRUE(out == t.bytes) << t.spec.key;
  }
}

// The share of manifest `m` holding pieces `pieces` (in that order) with their tensors and
// data files, as a coordinator cuts one for a load.
pb::Manifest ShareOf(const pb::Manifest& m, const std::vector<int>& pieces) {
  pb::Manifest share;
  share.set_format_version(m.format_version());
  share.set_checksum_block_bytes(m.checksum_block_bytes());
  std::set<std::string> keys, files;
  for (int i : pieces) {
    *share.add_pieces() = m.pieces(i);
    keys.insert(m.pieces(i).key());
    files.insert(m.pieces(i).file());
  }
  for (const pb::TensorMeta& t : m.tensors()) {
    if (keys.count(t.key()) > 0) *share.add_tensors() = t;
  }
  for (const pb::DataFile& f : m.files()) {
    if (files.count(f.name()) > 0) *share.add_files() = f;
  }
  return share;
}

// Indices in `m` of the pieces of `key` rows [begin, end) (one piece per row), last row first.
std::vector<int> RowsOf(const pb::Manifest& m, const std::string& key, int begin, int end) {
  std::vector<int> out;
  for (int i = m.pieces_size() - 1; i >= 0; --i) {
    const Region r = PieceRegion(m.pieces(i));
    if (m.pieces(i).key() == key && r.offsets[0] >= begin && r.offsets[0] < end) out.push_back(i);
  }
  return out;
}

// A share of a few pieces, out of manifest order, opens without the rest of the manifest (in
// format 1 and in piece files) and reads its regions bit-exact; a region that needs a piece
// outside the share is NotFound, as is a tensor it does not hold.
TEST(CheckpointShareTest, ShareOfAFewPiecesReadsThoseRegionsBitExact) {
  const std::string dir = TestDir("share");
  std::vector<TestTensor> tensors;
  Pieces pieces;
  const CheckpointContents c = RowPieces(pieces, tensors, 12);
  WriteOptions split;
  split.manifest_files.max_single_file_bytes = 4096;
  split.manifest_files.piece_file_bytes = 1000;
  for (const WriteOptions& options : {WriteOptions{}, split}) {
    const std::string path = JoinPath(dir, "ckpt");
    ASSERT_TRUE(RemoveTree(path).ok());
    auto m = WriteCheckpoint(path, c, options);
    ASSERT_TRUE(m.ok()) << m.status();
    const TestTensor& t = tensors[1];
    pb::Manifest share = ShareOf(*m, RowsOf(*m, t.spec.key, 3, 8));
    ASSERT_EQ(share.pieces_size(), 5);
    auto reader = CheckpointReader::OpenShare(path, share);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->manifest().pieces_size(), 5);
    const Region rows = Box({3, 0}, {5, 7});
    std::string out(rows.NumElements() * t.es(), '\x55');
    ASSERT_TRUE((*reader)->ReadRegion(t.spec.key, rows, out.data()).ok());
    EXPECT_TRUE(out == t.Extract(rows));
    const Region inner{{4, 0}, {3, 7}, FlatRange{2, 17}};
    std::string part(inner.NumElements() * t.es(), '\0');
    ASSERT_TRUE((*reader)->ReadRegion(t.spec.key, inner, part.data()).ok());
    EXPECT_TRUE(part == t.Extract(inner));

    absl::Status outside = (*reader)->ReadRegion(t.spec.key, Box({2, 0}, {2, 7}), out.data());
    EXPECT_EQ(outside.code(), absl::StatusCode::kNotFound) << outside;
    EXPECT_THAT(std::string(outside.message()), HasSubstr(t.spec.key));
    EXPECT_EQ((*reader)->ReadRegion(tensors[0].spec.key, Box({0, 0}, {1, 7}), out.data()).code(),
              absl::StatusCode::kNotFound);
  }
}

// A share that does not agree with itself or with the data files is refused, naming the piece
// (its index in the share) or the file; the data files' bytes are not read.
TEST(CheckpointShareTest, ShareThatDisagreesWithItselfOrTheDataFilesIsRefused) {
  const std::string dir = TestDir("share-bad");
  std::vector<TestTensor> tensors;
  Pieces pieces;
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, RowPieces(pieces, tensors, 12), WriteOptions{});
  ASSERT_TRUE(m.ok()) << m.status();
  const pb::Manifest good = ShareOf(*m, RowsOf(*m, "layers.0.w", 0, 3));
  ASSERT_TRUE(CheckpointReader::OpenShare(path, good).ok());
  // Another piece of the same file, not in the share: where the share's piece 1 claims to be.
  int other = -1;
  for (int i = 0; i < m->pieces_size(); ++i) {
    if (m->pieces(i).file() == good.pieces(1).file() && m->pieces(i).key() == "layers.2.w") {
      other = i;
    }
  }
  ASSERT_GE(other, 0);
  struct Case {
    std::string what;
    std::function<void(pb::Manifest*)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"past its file's data",
       [](pb::Manifest* s) {
         s->mutable_pieces(1)->set_byte_offset(s->files(0).size_bytes() + 4096);
       },
       absl::StatusCode::kDataLoss, "piece 1 (tensor \"layers.0.w\" region [1:2, 0:7]"},
      {"unknown file",
       [](pb::Manifest* s) { s->mutable_pieces(2)->set_file("data/r7_9.safetensors"); },
       absl::StatusCode::kDataLoss, "piece 2 (tensor \"layers.0.w\""},
      {"unknown tensor", [](pb::Manifest* s) { s->mutable_pieces(0)->set_key("layers.9.w"); },
       absl::StatusCode::kDataLoss, "piece 0 (tensor \"layers.9.w\""},
      {"byte length", [](pb::Manifest* s) { s->mutable_pieces(0)->set_byte_length(24); },
       absl::StatusCode::kDataLoss, "byte length 24 is not 7 elements of F32"},
      {"shared bytes",
       [](pb::Manifest* s) {
         s->mutable_pieces(1)->set_file(s->pieces(0).file());
         s->mutable_pieces(1)->set_byte_offset(s->pieces(0).byte_offset() + 4);
       },
       absl::StatusCode::kDataLoss, "overlap in bytes"},
      {"header offsets",
       [&](pb::Manifest* s) {
         s->mutable_pieces(1)->set_byte_offset(m->pieces(other).byte_offset());
       },
       absl::StatusCode::kDataLoss,
       absl::StrCat("data file ", good.pieces(1).file(), ", entry \"layers.0.w|1:2,0:7\"")},
      {"file size",
       [](pb::Manifest* s) { s->mutable_files(0)->set_size_bytes(s->files(0).size_bytes() + 8); },
       absl::StatusCode::kDataLoss, " bytes; the manifest says "},
      {"piece files",
       [](pb::Manifest* s) { s->add_piece_files()->set_name(ManifestPieceFileName(0)); },
       absl::StatusCode::kDataLoss, "a share lists 1 piece files"},
  };
  for (const Case& c : cases) {
    pb::Manifest share = good;
    c.edit(&share);
    auto reader = CheckpointReader::OpenShare(path, share);
    EXPECT_EQ(reader.status().code(), c.code) << c.what << ": " << reader.status();
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(c.message))
        << c.what << ": " << reader.status();
  }
}

// A share of a missing, incomplete or non-directory checkpoint gets Open's errors.
TEST(CheckpointShareTest, ShareOfAMissingOrIncompleteCheckpointFailsAsOpenDoes) {
  const std::string dir = TestDir("share-missing");
  const std::string incomplete = JoinPath(dir, "incomplete");
  ASSERT_TRUE(MakeDir(incomplete).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(dir, "file"), "x").ok());
  for (const std::string& path : {JoinPath(dir, "none"), incomplete, JoinPath(dir, "file")}) {
    const absl::Status open = CheckpointReader::Open(path).status();
    const absl::Status share = CheckpointReader::OpenShare(path, pb::Manifest()).status();
    EXPECT_FALSE(share.ok()) << path;
    EXPECT_EQ(share, open) << path;
  }
}

// A safetensors reader written here from the format description, sharing no code with
// storage/: every data file must open and every entry must hold the piece's bytes.
TEST(CheckpointTest, DataFilesOpenWithAnIndependentSafetensorsParser) {
  const std::string dir = TestDir("indep");
  TestTensor a("layers.0.w", DType::kBF16, {6, 4}, 5), b("bias", DType::kF32, {6}, 6);
  Pieces pieces;
  CheckpointContents c;
  c.tensors = {a.spec, b.spec};
  c.files = {{0, {pieces.Make(a, Box({0, 0}, {3, 4})), pieces.Make(b, WholeRegion({6}))}},
             {1, {pieces.Make(a, Box({3, 0}, {3, 4}))}}};
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, c, WriteOptions{});
  ASSERT_TRUE(m.ok()) << m.status();
  std::map<std::string, std::string> found;  // entry name -> bytes
  const std::vector<std::string> names = *ListDir(JoinPath(path, "data"));
  for (const std::string& name : names) {
    auto file = ReadWholeFile(JoinPath(path, "data/" + name), 1 << 20);
    ASSERT_TRUE(file.ok());
    const std::string& f = *file;
    ASSERT_GE(f.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(f[i]);
    ASSERT_LE(8 + n, f.size());
    EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
    auto header = nlohmann::json::parse(f.substr(8, n), nullptr, false);
    ASSERT_FALSE(header.is_discarded());
    EXPECT_EQ(header["__metadata__"]["format"], "ckpt");
    uint64_t expected_begin = 0;
    std::vector<std::pair<uint64_t, std::string>> by_offset;
    for (auto& [k, v] : header.items()) {
      if (k == "__metadata__") continue;
      by_offset.emplace_back(v["data_offsets"][0].get<uint64_t>(), k);
    }
    std::sort(by_offset.begin(), by_offset.end());
    for (auto& [begin, k] : by_offset) {
      const auto& v = header[k];
      EXPECT_EQ(begin, expected_begin) << k;
      uint64_t end = v["data_offsets"][1].get<uint64_t>();
      uint64_t elems = 1;
      for (auto& d : v["shape"]) elems *= d.get<uint64_t>();
      const std::string dt = v["dtype"];
      EXPECT_EQ(end - begin, elems * (dt == "BF16" ? 2 : 4)) << k;
      found[k] = f.substr(8 + n + begin, end - begin);
      expected_begin = end;
    }
    EXPECT_EQ(8 + n + expected_begin, f.size());
  }
  ASSERT_EQ(found.size(), 3u);
  EXPECT_TRUE(found.at("layers.0.w|0:3,0:4") == a.Extract(Box({0, 0}, {3, 4})));
  EXPECT_TRUE(found.at("layers.0.w|3:6,0:4") == a.Extract(Box({3, 0}, {3, 4})));
  EXPECT_TRUE(found.at("bias|0:6") == b.bytes);
}

TEST(CheckpointTest, PartialReadsVerifyOnlyTheBlocksTheyTouch) {
  const std::string dir = TestDir("blocks");
  TestTensor t("big", DType::kU8, {100000}, 9);
  Pieces pieces;
  CheckpointContents c;
  c.tensors = {t.spec};
  c.files = {{0, {pieces.Make(t, WholeRegion({100000}))}}};
  WriteOptions wo;
  wo.checksum_block_bytes = 4096;
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, c, wo);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->pieces(0).block_xxh3_size(), 25);
  // Corrupt one byte in block 20.
  const pb::StoredPiece& p = m->pieces(0);
  const std::string file = JoinPath(path, p.file());
  std::string bytes = *ReadWholeFile(file, 1 << 20);
  bytes[p.byte_offset() + 20 * 4096 + 17] ^= 0x40;
  ASSERT_TRUE(WriteFileDurably(file, bytes).ok());

  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string out(5000, '\0');
  ASSERT_TRUE((*reader)->ReadPieces({{0, 1000, 6000, out.data()}}).ok());
  EXPECT_TRUE(out == t.bytes.substr(1000, 5000));
  absl::Status bad = (*reader)->ReadPieces({{0, 80000, 85000, out.data()}});
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("\"big|0:100000\""));
  EXPECT_THAT(std::string(bad.message()), HasSubstr("tensor \"big\""));
  // Explicitly skipping verification returns the bytes as stored.
  ASSERT_TRUE((*reader)->ReadPieces({{0, 80000, 85000, out.data()}}, /*verify=*/false).ok());
  std::string whole(100000, '\0');
  EXPECT_EQ((*reader)->ReadRegion("big", WholeRegion({100000}), whole.data()).code(),
            absl::StatusCode::kDataLoss);
}

CheckpointContents OneTensor(Pieces& pieces, const TestTensor& t) {
  CheckpointContents c;
  c.tensors = {t.spec};
  c.files = {{0, {pieces.Make(t, WholeRegion(t.spec.global_shape))}}};
  return c;
}

TEST(CheckpointTest, OverwriteNeedsTheFlagAndReplacesAtomically) {
  const std::string dir = TestDir("overwrite");
  const std::string path = JoinPath(dir, "ckpt");
  TestTensor v1("w", DType::kF32, {16}, 1), v2("w", DType::kF32, {16}, 2);
  Pieces pieces;
  ASSERT_TRUE(WriteCheckpoint(path, OneTensor(pieces, v1), WriteOptions{}).ok());
  auto again = WriteCheckpoint(path, OneTensor(pieces, v2), WriteOptions{});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("overwrite"));
  std::string out(64, '\0');
  ASSERT_TRUE((*CheckpointReader::Open(path))->ReadRegion("w", WholeRegion({16}), out.data()).ok());
  EXPECT_TRUE(out == v1.bytes);

  WriteOptions ow;
  ow.overwrite = true;
  ASSERT_TRUE(WriteCheckpoint(path, OneTensor(pieces, v2), ow).ok());
  ASSERT_TRUE((*CheckpointReader::Open(path))->ReadRegion("w", WholeRegion({16}), out.data()).ok());
  EXPECT_TRUE(out == v2.bytes);
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});  // old one removed, no leftovers
}

// DCP writes into the directory it is given, which callers often create first (mkdtemp,
// makedirs): an empty directory is replaced by the committed checkpoint, atomically.
TEST(CheckpointTest, AnEmptyDirectoryAtThePathIsReplacedByTheCommit) {
  const std::string dir = TestDir("empty-dir");
  const std::string path = JoinPath(dir, "ckpt");
  ASSERT_TRUE(MakeDir(path).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0710), 0);  // the checkpoint keeps the directory's mode
  TestTensor t("w", DType::kF32, {16}, 3);
  Pieces pieces;
  WriteOptions options;
  options.after_step = [&](CommitStep step) {
    // Until the rename, a reader sees the empty directory, never a partial checkpoint.
    if (step == CommitStep::kManifestDirSynced) {
      EXPECT_EQ(*ListDir(path), std::vector<std::string>{});
    }
  };
  auto written = WriteCheckpoint(path, OneTensor(pieces, t), options);
  ASSERT_TRUE(written.ok()) << written.status();
  std::string out(64, '\0');
  ASSERT_TRUE((*CheckpointReader::Open(path))->ReadRegion("w", WholeRegion({16}), out.data()).ok());
  EXPECT_TRUE(out == t.bytes);
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});  // no staging left behind
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0710u);
}

TEST(CheckpointTest, ADirectoryHoldingAnythingIsRefusedNamingItsEntries) {
  const std::string dir = TestDir("full-dir");
  const std::string path = JoinPath(dir, "ckpt");
  ASSERT_TRUE(MakeDir(path).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "notes.txt"), "keep me").ok());
  TestTensor t("w", DType::kF32, {16}, 3);
  Pieces pieces;
  auto refused = WriteCheckpoint(path, OneTensor(pieces, t), WriteOptions{});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("is not an empty directory (it holds notes.txt)"));
  EXPECT_EQ(*ListDir(path), std::vector<std::string>{"notes.txt"});
}

TEST(CheckpointTest, AFileAppearingInTheEmptyDirectoryBeforeTheCommitIsKept) {
  const std::string dir = TestDir("filled-dir");
  const std::string path = JoinPath(dir, "ckpt");
  ASSERT_TRUE(MakeDir(path).ok());
  TestTensor t("w", DType::kF32, {16}, 3);
  Pieces pieces;
  WriteOptions options;
  options.after_step = [&](CommitStep step) {
    if (step == CommitStep::kStagingCreated) {
      ASSERT_TRUE(WriteFileDurably(JoinPath(path, "late.txt"), "keep me").ok());
    }
  };
  auto refused = WriteCheckpoint(path, OneTensor(pieces, t), options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("late.txt"));
  EXPECT_EQ(*ListDir(path), std::vector<std::string>{"late.txt"});
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(CheckpointTest, IncompleteAndDamagedCheckpointsAreRefused) {
  const std::string dir = TestDir("damaged");
  const std::string incomplete = JoinPath(dir, "incomplete");
  ASSERT_TRUE(MakeDir(incomplete).ok());
  EXPECT_EQ(ProbeCheckpoint(incomplete).state, CheckpointState::kIncomplete);
  auto r = CheckpointReader::Open(incomplete);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("incomplete"));
  EXPECT_EQ(CheckpointReader::Open(JoinPath(dir, "none")).status().code(),
            absl::StatusCode::kNotFound);

  TestTensor t("w", DType::kF32, {1000}, 3);
  Pieces pieces;
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, OneTensor(pieces, t), WriteOptions{});
  ASSERT_TRUE(m.ok());
  const std::string data = JoinPath(path, m->files(0).name());
  std::string bytes = *ReadWholeFile(data, 1 << 20);

  ASSERT_TRUE(WriteFileDurably(data, bytes.substr(0, bytes.size() - 10)).ok());
  auto truncated = CheckpointReader::Open(path);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(truncated.status().message()), HasSubstr("truncated"));

  // Same size, but the header says a different dtype for the entry.
  std::string lied = bytes;
  size_t at = lied.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  lied.replace(at, 5, "\"I32\"");
  ASSERT_TRUE(WriteFileDurably(data, lied).ok());
  auto disagree = CheckpointReader::Open(path);
  EXPECT_EQ(disagree.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(disagree.status().message()), HasSubstr("entry \"w|0:1000\""));

  ASSERT_TRUE(WriteFileDurably(data, bytes).ok());
  pb::Manifest future = *m;
  future.set_format_version(7);
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "manifest.pb"), SerializeManifest(future)).ok());
  EXPECT_EQ(CheckpointReader::Open(path).status().code(), absl::StatusCode::kUnimplemented);
}

// The protocol in parts, as a multi-process save uses it: ranks write their data files into
// one staging directory independently, then one process commits the merged manifest.
TEST(CheckpointTest, RanksWriteDataFilesSeparatelyThenOneCommits) {
  const std::string dir = TestDir("parts");
  const std::string path = JoinPath(dir, "ckpt");
  TestTensor t("w", DType::kBF16, {4, 8}, 11);
  Pieces pieces;
  CheckpointContents info;
  info.tensors = {t.spec};
  info.step = 3;
  auto staging = CreateStagingDir(path, /*overwrite=*/false);
  ASSERT_TRUE(staging.ok()) << staging.status();
  WrittenData all;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<DataFilePlan> files = {{rank, {pieces.Make(t, Box({2 * rank, 0}, {2, 8}))}}};
    auto written = WriteDataFiles(*staging, info.tensors, files, 0, WriteOptions{});
    ASSERT_TRUE(written.ok()) << written.status();
    all.pieces.insert(all.pieces.end(), written->pieces.begin(), written->pieces.end());
    all.files.insert(all.files.end(), written->files.begin(), written->files.end());
  }
  EXPECT_EQ(ProbeCheckpoint(path).state, CheckpointState::kMissing);  // nothing visible yet
  pb::Manifest m = BuildManifest(info.tensors, all, info, kDefaultChecksumBlockBytes);
  ASSERT_TRUE(CommitCheckpoint(*staging, path, m, WriteOptions{}).ok());
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string out(t.bytes.size(), '\0');
  ASSERT_TRUE((*reader)->ReadRegion("w", WholeRegion({4, 8}), out.data()).ok());
  EXPECT_TRUE(out == t.bytes);
  EXPECT_EQ(*ListDir(JoinPath(path, "data")),
            (std::vector<std::string>{"r0_0.safetensors", "r1_0.safetensors"}));
}

TEST(CheckpointTest, PiecesThatDoNotTileATensorAreRefusedBeforeAnythingIsWritten) {
  const std::string dir = TestDir("coverage");
  TestTensor t("w", DType::kF32, {4, 4}, 3);
  Pieces pieces;
  CheckpointContents c;
  c.tensors = {t.spec};
  c.files = {{0, {pieces.Make(t, Box({0, 0}, {2, 4}))}}};
  auto hole = WriteCheckpoint(JoinPath(dir, "ckpt"), c, WriteOptions{});
  EXPECT_EQ(hole.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(hole.status().message()),
              HasSubstr("tensor \"w\" (4, 4): elements [8, 16) in row-major order are stored by "
                        "no piece"));
  // Rows 0:3 and 1:4: 24 elements for 16, [1:3] twice.
  c.files = {{0, {pieces.Make(t, Box({0, 0}, {3, 4})), pieces.Make(t, Box({1, 0}, {3, 4}))}}};
  auto overlap = WriteCheckpoint(JoinPath(dir, "ckpt"), c, WriteOptions{});
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overlap.status().message()),
              HasSubstr("element (1, 0) is stored by 2 pieces (an overlap): [0:3, 0:4] and "
                        "[1:4, 0:4]"));
  EXPECT_TRUE(ListDir(dir)->empty());
}

// A checkpoint whose checksums are all valid but whose pieces leave a hole or overlap (a piece
// relabelled in the manifest and in its safetensors entry name, or a data file dropped from
// the manifest) is refused by Open, naming the tensor and the region.
TEST(CheckpointTest, OpenRefusesACheckpointWhosePiecesDoNotTileATensor) {
  const std::string dir = TestDir("crafted");
  TestTensor t("w", DType::kF32, {4, 3}, 5);
  Pieces pieces;
  CheckpointContents c;
  c.tensors = {t.spec};
  c.files = {{0, {pieces.Make(t, Box({0, 0}, {2, 3}))}},
             {1, {pieces.Make(t, Box({2, 0}, {2, 3}))}}};
  const std::string good = JoinPath(dir, "good");
  auto m = WriteCheckpoint(good, c, WriteOptions{});
  ASSERT_TRUE(m.ok()) << m.status();

  // Relabel rows 2:4 as rows 1:3: same byte count, same bytes, valid checksums.
  const std::string relabelled = JoinPath(dir, "relabelled");
  ASSERT_EQ(std::system(("cp -r " + good + " " + relabelled).c_str()), 0);
  pb::Manifest r = *m;
  pb::StoredPiece* moved = r.mutable_pieces(1);
  ASSERT_EQ(moved->entry_name(), "w|2:4,0:3");
  moved->mutable_region()->set_offsets(0, 1);
  moved->set_entry_name("w|1:3,0:3");
  ASSERT_TRUE(WriteFileDurably(JoinPath(relabelled, "manifest.pb"), SerializeManifest(r)).ok());
  const std::string data = JoinPath(relabelled, moved->file());
  std::string bytes = *ReadWholeFile(data, 1 << 20);
  const size_t at = bytes.find("w|2:4,0:3");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 9, "w|1:3,0:3");
  ASSERT_TRUE(WriteFileDurably(data, bytes).ok());
  auto overlap = CheckpointReader::Open(relabelled);
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(overlap.status().message()),
              HasSubstr("tensor \"w\" (4, 3): element (1, 0) is stored by 2 pieces (an "
                        "overlap): tensor \"w\" region [0:2, 0:3] in data/r0_0.safetensors and "
                        "tensor \"w\" region [1:3, 0:3] in data/r1_0.safetensors"));

  // Drop the second data file from the manifest (and the disk): a hole.
  const std::string holed = JoinPath(dir, "holed");
  ASSERT_EQ(std::system(("cp -r " + good + " " + holed).c_str()), 0);
  pb::Manifest h = *m;
  h.mutable_pieces()->RemoveLast();
  h.mutable_files()->RemoveLast();
  ASSERT_TRUE(WriteFileDurably(JoinPath(holed, "manifest.pb"), SerializeManifest(h)).ok());
  ASSERT_EQ(std::remove(JoinPath(holed, "data/r1_0.safetensors").c_str()), 0);
  auto hole = CheckpointReader::Open(holed);
  EXPECT_EQ(hole.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(hole.status().message()),
              HasSubstr("tensor \"w\" (4, 3): elements [6, 12) in row-major order are stored by "
                        "no piece (a hole from (2, 0) to (3, 2))"));
}

TEST(CheckpointTest, BadPiecesAreRejectedBeforeAnythingIsCommitted) {
  const std::string dir = TestDir("badpieces");
  TestTensor t("w", DType::kF32, {4}, 3);
  Pieces pieces;
  CheckpointContents c = OneTensor(pieces, t);
  c.files[0].pieces[0].size_bytes = 12;
  auto m = WriteCheckpoint(JoinPath(dir, "ckpt"), c, WriteOptions{});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("tensor \"w\""));
  EXPECT_TRUE(ListDir(dir)->empty());  // staging directory cleaned up
}

}  // namespace
}  // namespace ckpt
