#include "storage/manifest_file.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checksum.h"
#include "storage/file_util.h"
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
  if (rng() % 2 == 0) m.set_object_generation("g0123456789abcdef");
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

// A valid manifest: tensor "w" (int32, rows x 4), one piece per row in one data file.
pb::Manifest ValidManifest(int rows) {
  pb::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_checksum_block_bytes(4096);
  m.set_step(3);
  m.set_writer_version(kWriterVersion);
  (*m.mutable_user_metadata())["run"] = "piece-files";
  pb::TensorMeta* t = m.add_tensors();
  t->set_key("w");
  t->set_dtype(pb::DTYPE_I32);
  t->add_global_shape(rows);
  t->add_global_shape(4);
  pb::DataFile* file = m.add_files();
  file->set_name(DataFileName(0, 0));
  file->set_data_start(64);
  file->set_size_bytes(64 + 16 * static_cast<int64_t>(rows));
  for (int r = 0; r < rows; ++r) {
    const Region region{{r, 0}, {1, 4}, std::nullopt};
    pb::StoredPiece* p = m.add_pieces();
    p->set_key("w");
    *p->mutable_region() = RegionToProto(region);
    p->set_file(file->name());
    p->set_entry_name(EncodeEntryName("w", region));
    p->set_byte_offset(64 + 16 * static_cast<int64_t>(r));
    p->set_byte_length(16);
    p->set_xxh3_64(0x9E3779B97F4A7C15ull * (r + 1));
  }
  return m;
}

// Options that split any manifest over `max_single` bytes into piece files of `budget` bytes.
ManifestFileOptions Split(int64_t max_single, int64_t budget) {
  ManifestFileOptions options;
  options.max_single_file_bytes = max_single;
  options.piece_file_bytes = budget;
  return options;
}

// The bytes of m's pieces section: what its piece files hold, concatenated.
std::string PiecesSection(const pb::Manifest& m) {
  pb::Manifest pieces;
  *pieces.mutable_pieces() = m.pieces();
  return SerializeManifest(pieces);
}

// Writes `m` into a fresh directory `name` with `options`; returns the directory.
std::string WriteInto(const std::string& name, const pb::Manifest& m,
                      const ManifestFileOptions& options) {
  const std::string dir = TestDir(name);
  absl::Status s = WriteManifestFiles(dir, kManifestFileName, m, options);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

// A manifest that fits is one format-1 file: exactly SerializeManifest's bytes, as before
// piece files existed, every field included.
TEST(ManifestFileTest, ManifestThatFitsIsOneFormat1FileOfTheSerializedBytes) {
  std::mt19937_64 rng(11);
  for (int num_pieces : {0, 1, 300, 20000}) {
    const pb::Manifest m = RandomManifest(rng, num_pieces);
    const std::string dir = WriteInto("manifest-fits", m, ManifestFileOptions());
    EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"manifest.pb"});
    EXPECT_TRUE(ReadAll(dir + "/manifest.pb") == SerializeManifest(m)) << num_pieces;
  }
}

// The writer copies the manifest's fields one by one (never its pieces): a new field must be
// added there (FieldsAfter in manifest_file.cc) and then here.
TEST(ManifestFileTest, WriterKnowsEveryManifestField) {
  EXPECT_EQ(pb::Manifest::descriptor()->field_count(), 12);
}

// Over the limit, the pieces go into piece files of at most the budget (one piece alone when
// it is larger), in order: their bytes concatenated are the pieces section a single file
// would hold, and the manifest read back is the one written.
TEST(ManifestFileTest, ManifestOverTheLimitRoundTripsThroughPieceFiles) {
  const pb::Manifest m = ValidManifest(200);
  ASSERT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m);
  for (int64_t budget : {1, 64, 500, 4096, 1 << 20}) {
    const std::string dir = WriteInto("manifest-split", m, Split(1024, budget));
    pb::Manifest top;
    ASSERT_TRUE(top.ParseFromString(ReadAll(dir + "/manifest.pb")));
    EXPECT_EQ(top.format_version(), kManifestPieceFilesFormatVersion);
    EXPECT_EQ(top.pieces_size(), 0);
    std::string concatenated;
    for (const pb::ManifestPieceFile& f : top.piece_files()) {
      const std::string bytes = ReadAll(JoinPath(dir, f.name()));
      EXPECT_EQ(static_cast<int64_t>(bytes.size()), f.size_bytes());
      EXPECT_TRUE(bytes.size() <= static_cast<size_t>(budget) || f.piece_count() == 1) << budget;
      EXPECT_EQ(Xxh3(bytes.data(), bytes.size()), f.xxh3_64());
      concatenated += bytes;
    }
    EXPECT_EQ(top.piece_files_size() == 1, budget == 1 << 20) << budget;
    EXPECT_TRUE(concatenated == PiecesSection(m)) << budget;
    absl::StatusOr<pb::Manifest> got = ReadManifestFile(dir);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->piece_files_size(), top.piece_files_size());
    got->set_format_version(kManifestFormatVersion);
    got->clear_piece_files();
    EXPECT_TRUE(SerializeManifest(*got) == SerializeManifest(m)) << budget;
  }
}

// A format-1 manifest reads back through the same function.
TEST(ManifestFileTest, Format1ManifestReadsBack) {
  const pb::Manifest m = ValidManifest(5);
  const std::string dir = WriteInto("manifest-read-v1", m, ManifestFileOptions());
  absl::StatusOr<pb::Manifest> got = ReadManifestFile(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SerializeManifest(*got) == SerializeManifest(m));
}

// A split manifest directory: 20 pieces in piece files of about 2 pieces each.
std::string SplitManifestDir(const std::string& name) {
  return WriteInto(name, ValidManifest(20), Split(64, 100));
}

// StreamManifestFile with a visitor that keeps nothing.
absl::StatusOr<pb::Manifest> StreamIgnoringPieces(const std::string& dir) {
  return StreamManifestFile(dir, [](int64_t, pb::StoredPiece&) { return absl::OkStatus(); });
}

// Both readers fail with `code` and a message holding `what`.
void ExpectReadFails(const std::string& dir, absl::StatusCode code, const std::string& what) {
  absl::StatusOr<pb::Manifest> got = ReadManifestFile(dir);
  EXPECT_EQ(got.status().code(), code) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(what));
  absl::StatusOr<pb::Manifest> streamed = StreamIgnoringPieces(dir);
  EXPECT_EQ(streamed.status().code(), code) << streamed.status();
  EXPECT_THAT(streamed.status().message(), HasSubstr(what));
}

TEST(ManifestFileTest, MissingPieceFileIsNotFoundNamingIt) {
  const std::string dir = SplitManifestDir("manifest-missing-piece-file");
  const std::string victim = JoinPath(dir, ManifestPieceFileName(1));
  ASSERT_EQ(::unlink(victim.c_str()), 0);
  ExpectReadFails(dir, absl::StatusCode::kNotFound, victim);
}

TEST(ManifestFileTest, TruncatedPieceFileIsDataLossNamingIt) {
  const std::string dir = SplitManifestDir("manifest-truncated-piece-file");
  const std::string victim = JoinPath(dir, ManifestPieceFileName(2));
  const std::string bytes = ReadAll(victim);
  ASSERT_TRUE(WriteFileDurably(victim, bytes.substr(0, bytes.size() - 1)).ok());
  ExpectReadFails(dir, absl::StatusCode::kDataLoss, victim);
}

// Every single-bit flip of a piece file is caught by its checksum.
TEST(ManifestFileTest, BitFlippedPieceFileIsDataLossNamingIt) {
  const std::string dir = SplitManifestDir("manifest-flipped-piece-file");
  const std::string victim = JoinPath(dir, ManifestPieceFileName(0));
  const std::string bytes = ReadAll(victim);
  for (size_t bit = 0; bit < bytes.size() * 8; bit += 5) {
    std::string flipped = bytes;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    ASSERT_TRUE(WriteFileDurably(victim, flipped).ok());
    ExpectReadFails(dir, absl::StatusCode::kDataLoss, victim + " does not match its checksum");
  }
}

// Rewrites dir's manifest.pb after `edit`.
void EditManifest(const std::string& dir, const std::function<void(pb::Manifest*)>& edit) {
  pb::Manifest top;
  ASSERT_TRUE(top.ParseFromString(ReadAll(dir + "/manifest.pb")));
  edit(&top);
  ASSERT_TRUE(WriteFileDurably(dir + "/manifest.pb", SerializeManifest(top)).ok());
}

TEST(ManifestFileTest, PieceFileWithAnotherPieceCountIsDataLossNamingIt) {
  const std::string dir = SplitManifestDir("manifest-piece-count");
  EditManifest(dir, [](pb::Manifest* m) {
    m->mutable_piece_files(0)->set_piece_count(m->piece_files(0).piece_count() + 1);
  });
  ExpectReadFails(dir, absl::StatusCode::kDataLoss,
                  JoinPath(dir, ManifestPieceFileName(0)) + " holds");
}

TEST(ManifestFileTest, PieceFileThatIsNotAProtobufIsDataLossNamingIt) {
  const std::string dir = SplitManifestDir("manifest-piece-garbage");
  const std::string victim = JoinPath(dir, ManifestPieceFileName(0));
  const std::string garbage = "\xff\xff\xff\xff";
  ASSERT_TRUE(WriteFileDurably(victim, garbage).ok());
  EditManifest(dir, [&](pb::Manifest* m) {
    m->mutable_piece_files(0)->set_size_bytes(4);
    m->mutable_piece_files(0)->set_piece_count(1);
    m->mutable_piece_files(0)->set_xxh3_64(Xxh3(garbage.data(), garbage.size()));
  });
  ExpectReadFails(dir, absl::StatusCode::kDataLoss, victim + " is not a valid protobuf");
}

// Piece-file names come from the writer, never from the manifest's reader: anything but
// ManifestPieceFileName(i) for the i-th file is refused before any file is opened, even when
// the named file exists and matches its record.
TEST(ManifestFileTest, PieceFileNamesOutsideTheExpectedFormAreRefused) {
  const std::string dir = SplitManifestDir("manifest-hostile-names");
  const std::string first = ReadAll(JoinPath(dir, ManifestPieceFileName(0)));
  ASSERT_TRUE(WriteFileDurably(JoinPath(ParentDir(dir), "outside.pb"), first).ok());
  for (const std::string& name :
       {std::string("../outside.pb"), JoinPath(ParentDir(dir), "outside.pb"),
        std::string("./manifest-pieces-00000.pb"), std::string("manifest-pieces-0000.pb"),
        std::string("manifest-pieces-00001.pb"), std::string("data/manifest-pieces-00000.pb"),
        std::string("manifest-pieces-../00.pb"), std::string("")}) {
    const std::string case_dir = SplitManifestDir("manifest-hostile-name");
    EditManifest(case_dir, [&](pb::Manifest* m) { m->mutable_piece_files(0)->set_name(name); });
    ExpectReadFails(case_dir, absl::StatusCode::kDataLoss, "piece file 0 is named");
  }
}

TEST(ManifestFileTest, FormatsAndPieceFilesMustAgree) {
  {  // format 2 with pieces of its own
    const std::string dir = SplitManifestDir("manifest-v2-inline");
    EditManifest(dir, [](pb::Manifest* m) { *m->add_pieces() = ValidManifest(1).pieces(0); });
    ExpectReadFails(dir, absl::StatusCode::kDataLoss, "also holds 1 pieces itself");
  }
  {  // format 2 without piece files
    const std::string dir = SplitManifestDir("manifest-v2-none");
    EditManifest(dir, [](pb::Manifest* m) { m->clear_piece_files(); });
    ExpectReadFails(dir, absl::StatusCode::kDataLoss, "format version 2 lists 0 piece files");
  }
  {  // format 1 with piece files
    const std::string dir = SplitManifestDir("manifest-v1-listing");
    EditManifest(dir, [](pb::Manifest* m) { m->set_format_version(kManifestFormatVersion); });
    ExpectReadFails(dir, absl::StatusCode::kDataLoss, "format version 1 lists");
  }
  {  // an unknown format
    const std::string dir = SplitManifestDir("manifest-v3");
    EditManifest(dir, [](pb::Manifest* m) { m->set_format_version(3); });
    ExpectReadFails(dir, absl::StatusCode::kUnimplemented, "unknown manifest format version 3");
  }
}

// ParseManifest takes only a self-contained manifest: a format-2 manifest.pb needs its files.
TEST(ManifestFileTest, ParseManifestSendsAFormat2ManifestToReadManifestFile) {
  const std::string dir = SplitManifestDir("manifest-parse-v2");
  absl::StatusOr<pb::Manifest> m = ParseManifest(ReadAll(dir + "/manifest.pb"), "x/manifest.pb");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("ReadManifestFile"));
}

// A piece-file write that fails leaves no piece file behind.
TEST(ManifestFileTest, FailedSplitWriteRemovesItsPieceFiles) {
  const std::string dir = TestDir("manifest-split-fails");
  const pb::Manifest m = ValidManifest(20);
  int handed = 0;
  absl::Status s = WriteManifestFiles(
      dir, kManifestFileName, m, /*pieces_bytes=*/1000,
      [&](ManifestPieceSink sink) {
        for (const pb::StoredPiece& p : m.pieces()) {
          if (++handed == 15) return absl::CancelledError("source stops");
          if (absl::Status added = sink(p); !added.ok()) return added;
        }
        return absl::OkStatus();
      },
      Split(64, 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{});
}

// What StreamManifestFile handed out: each piece's bytes, in order, after checking the indices
// count up from 0.
struct Visited {
  std::vector<std::string> pieces;
  absl::Status Visit(int64_t index, pb::StoredPiece& piece) {
    EXPECT_EQ(index, static_cast<int64_t>(pieces.size()));
    pieces.push_back(piece.SerializeAsString());
    return absl::OkStatus();
  }
};

std::vector<std::string> PieceBytes(const pb::Manifest& m) {
  std::vector<std::string> out;
  for (const pb::StoredPiece& p : m.pieces()) out.push_back(p.SerializeAsString());
  return out;
}

// The manifest without its pieces, serialized.
std::string HeadBytes(pb::Manifest m) {
  m.clear_pieces();
  return SerializeManifest(m);
}

// StreamManifestFile hands out exactly ReadManifestFile's pieces, in order, with their indices,
// and returns the head without pieces (its format version and piece-file records kept), for a
// format-1 manifest and for piece files of every budget.
TEST(StreamManifestFileTest, VisitsExactlyReadManifestFilesPiecesInOrder) {
  const pb::Manifest m = ValidManifest(200);
  std::vector<ManifestFileOptions> layouts = {ManifestFileOptions()};
  for (int64_t budget : {1, 64, 500, 4096, 1 << 20}) layouts.push_back(Split(1024, budget));
  for (const ManifestFileOptions& options : layouts) {
    const std::string dir = WriteInto("stream-visits", m, options);
    absl::StatusOr<pb::Manifest> whole = ReadManifestFile(dir);
    ASSERT_TRUE(whole.ok()) << whole.status();
    Visited visited;
    absl::StatusOr<pb::Manifest> head =
        StreamManifestFile(dir, [&](int64_t i, pb::StoredPiece& p) { return visited.Visit(i, p); });
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->pieces_size(), 0);
    EXPECT_EQ(head->piece_files_size(), whole->piece_files_size());
    EXPECT_EQ(head->piece_files_size() > 0, options.max_single_file_bytes == 1024);
    EXPECT_TRUE(SerializeManifest(*head) == HeadBytes(*whole));
    EXPECT_TRUE(visited.pieces == PieceBytes(*whole)) << options.piece_file_bytes;
    EXPECT_TRUE(PieceBytes(*whole) == PieceBytes(m));
  }
}

// A visitor may move from the piece it is handed (the reader reuses its own).
TEST(StreamManifestFileTest, VisitorMayMoveFromThePiece) {
  const pb::Manifest m = ValidManifest(30);
  for (const ManifestFileOptions& options : {ManifestFileOptions(), Split(64, 100)}) {
    const std::string dir = WriteInto("stream-moves", m, options);
    std::vector<pb::StoredPiece> kept;
    ASSERT_TRUE(StreamManifestFile(dir, [&](int64_t, pb::StoredPiece& p) {
                  kept.push_back(std::move(p));
                  return absl::OkStatus();
                }).ok());
    pb::Manifest got;
    for (pb::StoredPiece& p : kept) *got.add_pieces() = p;
    EXPECT_TRUE(PieceBytes(got) == PieceBytes(m));
  }
}

// The visitor's error ends the read at once and is what the read returns.
TEST(StreamManifestFileTest, VisitorErrorStopsTheReadAndIsReturned) {
  const pb::Manifest m = ValidManifest(40);
  for (const ManifestFileOptions& options : {ManifestFileOptions(), Split(64, 100)}) {
    const std::string dir = WriteInto("stream-visitor-error", m, options);
    int calls = 0;
    absl::StatusOr<pb::Manifest> got = StreamManifestFile(dir, [&](int64_t i, pb::StoredPiece&) {
      ++calls;
      return i == 7 ? absl::CancelledError("enough") : absl::OkStatus();
    });
    EXPECT_EQ(got.status(), absl::CancelledError("enough"));
    EXPECT_EQ(calls, 8);
  }
}

// A manifest whose pieces leave a hole is refused by the stream, after its pieces were handed
// out, naming manifest.pb, as by ReadManifestFile; the same for a piece that does not validate.
TEST(StreamManifestFileTest, InvalidManifestIsDataLossNamingManifestPb) {
  pb::Manifest holed = ValidManifest(20);
  holed.mutable_pieces()->DeleteSubrange(7, 1);
  pb::Manifest unknown_tensor = ValidManifest(20);
  unknown_tensor.mutable_pieces(9)->set_key("nobody");
  for (const ManifestFileOptions& options : {ManifestFileOptions(), Split(64, 100)}) {
    const std::string dir = WriteInto("stream-holed", holed, options);
    ExpectReadFails(dir, absl::StatusCode::kDataLoss,
                    JoinPath(dir, "manifest.pb") + ": invalid manifest: tensor \"w\"");
    const std::string bad = WriteInto("stream-unknown-tensor", unknown_tensor, options);
    ExpectReadFails(bad, absl::StatusCode::kDataLoss,
                    JoinPath(bad, "manifest.pb") + ": invalid manifest: piece 9");
  }
}

// The head visitor sees the head, with its data files, once and before any piece, in both
// formats; its error ends the read before any piece is visited.
TEST(StreamManifestFileTest, HeadVisitorSeesTheHeadBeforeAnyPieceAndCanStopTheRead) {
  for (const ManifestFileOptions& options : {ManifestFileOptions(), Split(64, 100)}) {
    const std::string dir = WriteInto("stream-head-first", ValidManifest(20), options);
    int heads = 0, pieces = 0;
    absl::StatusOr<pb::Manifest> read = StreamManifestFile(
        dir,
        [&](const pb::Manifest& head) {
          EXPECT_EQ(pieces, 0);
          EXPECT_EQ(head.files_size(), 1);
          EXPECT_EQ(head.pieces_size(), 0);
          ++heads;
          return absl::OkStatus();
        },
        [&](int64_t, pb::StoredPiece&) {
          ++pieces;
          return absl::OkStatus();
        });
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(heads, 1);
    EXPECT_EQ(pieces, 20);
    pieces = 0;
    read = StreamManifestFile(
        dir, [](const pb::Manifest&) { return absl::CancelledError("enough"); },
        [&](int64_t, pb::StoredPiece&) {
          ++pieces;
          return absl::OkStatus();
        });
    EXPECT_EQ(read.status().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(pieces, 0);
  }
}

TEST(StreamManifestFileTest, MissingManifestIsNotFoundNamingIt) {
  const std::string dir = TestDir("stream-no-manifest");
  ExpectReadFails(dir, absl::StatusCode::kNotFound, JoinPath(dir, "manifest.pb"));
}

// Writes `bytes` as dir's manifest.pb (no fsync: a test file).
void PutManifest(const std::string& dir, const std::string& bytes) {
  std::ofstream out(dir + "/manifest.pb", std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Hostile manifest.pb bytes get the verdict of a whole-message parse (ParseManifest): refused
// with the same code, or accepted with the same head and pieces. Never a crash.
void ExpectStreamAgreesWithParse(const std::string& bytes, const std::string& what,
                                 const std::string& dir = "") {
  absl::StatusOr<pb::Manifest> parsed = ParseManifest(bytes, "m/manifest.pb");
  Visited visited;
  auto visit = [&](int64_t i, pb::StoredPiece& p) { return visited.Visit(i, p); };
  absl::StatusOr<pb::Manifest> streamed = StreamManifestBytes(bytes, "m/manifest.pb", visit);
  if (!dir.empty()) {
    PutManifest(dir, bytes);
    visited.pieces.clear();
    streamed = StreamManifestFile(dir, visit);
  }
  ASSERT_EQ(streamed.status().code(), parsed.status().code())
      << what << ": " << streamed.status() << " vs " << parsed.status();
  if (!parsed.ok()) {
    EXPECT_THAT(streamed.status().message(), HasSubstr("manifest.pb")) << what;
    return;
  }
  EXPECT_TRUE(SerializeManifest(*streamed) == HeadBytes(*parsed)) << what;
  EXPECT_TRUE(visited.pieces == PieceBytes(*parsed)) << what;
}

TEST(StreamManifestFileTest, TruncatedFormat1ManifestAgreesWithAWholeParse) {
  const std::string bytes = SerializeManifest(ValidManifest(12));
  const std::string dir = TestDir("stream-truncated");
  for (size_t n = 0; n <= bytes.size(); ++n) {
    ExpectStreamAgreesWithParse(bytes.substr(0, n), absl::StrCat("first ", n, " bytes"),
                                n % 17 == 0 ? dir : "");
  }
  ExpectStreamAgreesWithParse(bytes.substr(0, bytes.size() - 1), "one byte short", dir);
}

TEST(StreamManifestFileTest, BitFlippedFormat1ManifestAgreesWithAWholeParse) {
  const std::string bytes = SerializeManifest(ValidManifest(6));
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    std::string flipped = bytes;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    ExpectStreamAgreesWithParse(flipped, absl::StrCat("bit ", bit));
  }
}

// Garbage, and hand-made records: overlong and truncated varints, lengths past the end,
// pieces (field 3) with other wire types, groups, field 0, unknown fields between pieces,
// fields out of order.
TEST(StreamManifestFileTest, HostileFormat1BytesAgreeWithAWholeParse) {
  const std::string valid = SerializeManifest(ValidManifest(3));
  const std::string dir = TestDir("stream-hostile");
  std::mt19937_64 rng(3);
  std::vector<std::string> cases = {
      std::string("\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11),  // overlong length
      std::string("\x1a\xff\xff", 3),                                   // truncated varint
      std::string("\x1a\x7f\x0a\x01w", 5),                              // length past the end
      std::string("\x1a\xff\xff\xff\xff\x07", 6) + valid,               // 2 GiB length
      std::string("\x18\x05", 2) + valid,                               // field 3 as a varint
      std::string("\x1d\x01\x02\x03\x04", 5) + valid,                   // field 3 as fixed32
      std::string("\x1b\x1c", 2) + valid,                               // field 3 as a group
      std::string("\x1c", 1) + valid,                                   // an end-group at the top
      std::string("\x00\x01", 2) + valid,                               // field 0
      std::string("\xf8\xff\xff\xff\x7f\x00", 6) + valid,               // the largest field number
      // a tag of 6 bytes whose low 32 bits name a valid fixed64 field (the fuzzer's find)
      std::string("\xb9\xc9\xdf\xa0\xf2\x07\x01\x02\x03\x04\x05\x06\x07\x08", 14) + valid,
      valid +
          std::string("\xa2\x06\x03"
                      "abc",
                      6) +
          valid,  // unknown field, twice over
      valid.substr(valid.find('\x1a')) + valid.substr(0, valid.find('\x1a')),  // reordered
      std::string("\x1a\x00", 2) + valid,  // an empty piece first
  };
  // Unknown groups (field 15) nested around the recursion limit, at the top and in a piece.
  for (int depth : {98, 99, 100, 101, 102}) {
    const std::string nested = std::string(depth, '\x7b') + std::string(depth, '\x7c');
    cases.push_back(nested + valid);
    std::string piece = "\x0a\x01w" + nested;
    cases.push_back(valid + "\x1a" + static_cast<char>(0x80 | (piece.size() & 0x7f)) +
                    static_cast<char>(piece.size() >> 7) + piece);
  }
  for (int i = 0; i < 200; ++i) {
    std::string garbage(rng() % 64, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    cases.push_back(garbage);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    ExpectStreamAgreesWithParse(cases[i], absl::StrCat("case ", i), i < 13 ? dir : "");
  }
}

// Bytes of an unknown field (number 99, length-delimited) of `n` bytes.
std::string UnknownField(int64_t n) {
  std::string out = "\x9a\x06";  // (99 << 3) | 2
  uint8_t varint[10];
  const uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(n, varint);
  out.append(reinterpret_cast<const char*>(varint), end - varint);
  out.append(static_cast<size_t>(n), 'u');
  return out;
}

// Pieces past 64 MiB into a file (protobuf's old default limit, and where the reader hands
// over to a fresh coded stream) are read, in manifest.pb and in a piece file.
TEST(StreamManifestFileTest, ReadsPiecesPastSixtyFourMebibytes) {
  const pb::Manifest m = ValidManifest(10);
  const std::string padding = UnknownField(int64_t{70} << 20);
  const std::string dir = TestDir("stream-large");
  PutManifest(dir, padding + SerializeManifest(m));
  Visited visited;
  auto visit = [&](int64_t i, pb::StoredPiece& p) { return visited.Visit(i, p); };
  absl::StatusOr<pb::Manifest> got = StreamManifestFile(dir, visit);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(visited.pieces == PieceBytes(m));

  const std::string split = WriteInto("stream-large-split", m, Split(64, 100));
  const std::string victim = JoinPath(split, ManifestPieceFileName(1));
  const std::string bytes = padding + ReadAll(victim);
  ASSERT_TRUE(WriteFileDurably(victim, bytes).ok());
  EditManifest(split, [&](pb::Manifest* top) {
    top->mutable_piece_files(1)->set_size_bytes(static_cast<int64_t>(bytes.size()));
    top->mutable_piece_files(1)->set_xxh3_64(Xxh3(bytes.data(), bytes.size()));
  });
  visited.pieces.clear();
  got = StreamManifestFile(split, visit);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(visited.pieces == PieceBytes(m));
}

}  // namespace
}  // namespace ckpt
