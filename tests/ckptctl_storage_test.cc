// Runs the real `ckptctl inspect|verify|import|export` binary on checkpoints written by the
// storage library and on safetensors files written here by hand.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

using ckpt::testing::Ckptctl;
using Result = ckpt::testing::CommandResult;

// An empty scratch directory for one test.
std::string TestDir(const std::string& name) { return ckpt::testing::FreshDir(name); }

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A safetensors file built by hand (independent of storage/): entries in the given order.
struct HfTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string data;
};
void WriteHfFile(const std::string& path, const std::vector<HfTensor>& tensors) {
  Json h = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  for (const HfTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {data.size(), data.size() + t.data.size()}}};
    data += t.data;
  }
  std::string json = h.dump();
  while (json.size() % 8) json += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  ASSERT_TRUE(WriteFileDurably(path, out + json + data).ok());
}

// Parses a safetensors file by hand: name -> (dtype, shape, bytes).
std::map<std::string, HfTensor> ReadHfFile(const std::string& path) {
  std::string f = *ReadWholeFile(path, 1 << 28);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(f[i]);
  Json h = Json::parse(f.substr(8, n));
  std::map<std::string, HfTensor> out;
  for (auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    const uint64_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    out[k] = {k, v["dtype"], v["shape"].get<std::vector<int64_t>>(), f.substr(8 + n + b, e - b)};
  }
  return out;
}

// A sharded checkpoint: "w" F32 (8, 6) in two row pieces + flat pieces, "b" BF16 (6) whole.
struct Sharded {
  std::string w = Bytes(8 * 6 * 4, 1), b = Bytes(12, 2);
  std::string w_top = w.substr(0, 4 * 6 * 4), w_bottom = w.substr(4 * 6 * 4);
  CheckpointContents Contents() {
    CheckpointContents c;
    c.tensors = {{"w", DType::kF32, {8, 6}}, {"b", DType::kBF16, {6}}};
    c.step = 7;
    c.user_metadata = {{"model", "tiny"}};
    c.saved_layout.set_world_size(2);
    c.files = {{0, {{"w", Region{{0, 0}, {4, 6}, std::nullopt}, w_top.data(), 96}}},
               {1,
                {{"w", Region{{4, 0}, {4, 6}, FlatRange{0, 10}}, w_bottom.data(), 40},
                 {"w", Region{{4, 0}, {4, 6}, FlatRange{10, 24}}, w_bottom.data() + 40, 56},
                 {"b", WholeRegion({6}), b.data(), 12}}}};
    return c;
  }
};

std::string MakeSharded(const std::string& dir, Sharded& s) {
  const std::string path = JoinPath(dir, "ckpt");
  auto m = WriteCheckpoint(path, s.Contents(), WriteOptions{});
  EXPECT_TRUE(m.ok()) << m.status();
  return path;
}

// Crafting checkpoints the writer refuses to produce, with every checksum still valid: data
// file `name` dropped from the manifest (with its pieces) and from the disk.
void DropDataFile(const std::string& path, const std::string& name) {
  const std::string manifest_path = JoinPath(path, "manifest.pb");
  pb::Manifest m = *ParseManifest(*ReadWholeFile(manifest_path, 1 << 26), manifest_path);
  pb::Manifest out = m;
  out.clear_pieces();
  out.clear_files();
  for (const auto& p : m.pieces()) {
    if (p.file() != name) *out.add_pieces() = p;
  }
  for (const auto& f : m.files()) {
    if (f.name() != name) *out.add_files() = f;
  }
  ASSERT_TRUE(WriteFileDurably(manifest_path, SerializeManifest(out)).ok());
  ASSERT_EQ(std::remove(JoinPath(path, name).c_str()), 0);
}

// Pieces whose entry names start with `from` moved to first-dim offset `row`, renamed to
// start with `to` (same length) in the manifest and in their safetensors headers.
void RelabelRows(const std::string& path, const std::string& from, const std::string& to,
                 int64_t row) {
  ASSERT_EQ(from.size(), to.size());
  const std::string manifest_path = JoinPath(path, "manifest.pb");
  pb::Manifest m = *ParseManifest(*ReadWholeFile(manifest_path, 1 << 26), manifest_path);
  std::set<std::string> files;
  for (auto& p : *m.mutable_pieces()) {
    if (p.entry_name().compare(0, from.size(), from) != 0) continue;
    p.set_entry_name(to + p.entry_name().substr(from.size()));
    p.mutable_region()->set_offsets(0, row);
    files.insert(p.file());
  }
  ASSERT_FALSE(files.empty());
  ASSERT_TRUE(WriteFileDurably(manifest_path, SerializeManifest(m)).ok());
  for (const std::string& f : files) {
    std::string bytes = *ReadWholeFile(JoinPath(path, f), 1 << 26);
    for (size_t at = bytes.find(from); at != std::string::npos; at = bytes.find(from, at)) {
      bytes.replace(at, from.size(), to);
    }
    ASSERT_TRUE(WriteFileDurably(JoinPath(path, f), bytes).ok());
  }
}

TEST(CkptctlStorageTest, InspectShowsTensorsPiecesAndMetadata) {
  const std::string dir = TestDir("inspect");
  Sharded s;
  const std::string path = MakeSharded(dir, s);
  Result r = Ckptctl("inspect " + path + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["state"], "complete");
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["user_metadata"]["model"], "tiny");
  EXPECT_EQ(j["saved_layout"]["world_size"], 2);
  ASSERT_EQ(j["tensors"].size(), 2u);
  const Json& w = j["tensors"][0];
  EXPECT_EQ(w["key"], "w");
  EXPECT_EQ(w["dtype"], "F32");
  EXPECT_EQ(w["shape"], Json::array({8, 6}));
  EXPECT_EQ(w["stored_bytes"], 192);
  EXPECT_EQ(w["pieces"].size(), 3u);
  EXPECT_EQ(w["pieces"][1]["entry"], "w|4:8,0:6|flat=0:10");
  EXPECT_EQ(j["files"].size(), 2u);

  Result text = Ckptctl("inspect " + path);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("w  F32 (8, 6)"));
  EXPECT_THAT(text.out, HasSubstr("w|0:4,0:6"));
}

// A checkpoint whose manifest keeps its pieces in piece files (format 2, forced by tiny
// budgets) inspects and verifies like any other, with its piece-file count shown; a damaged
// piece file is named.
TEST(CkptctlStorageTest, InspectAndVerifyShowManifestPieceFiles) {
  const std::string dir = TestDir("inspect_piece_files");
  Sharded s;
  const std::string path = JoinPath(dir, "ckpt");
  WriteOptions options;
  options.manifest_files.max_single_file_bytes = 1;
  options.manifest_files.piece_file_bytes = 1;
  ASSERT_TRUE(WriteCheckpoint(path, s.Contents(), options).ok());
  Result r = Ckptctl("inspect " + path + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  Json j = Json::parse(r.out);
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["manifest_piece_files"], 4);
  EXPECT_EQ(j["tensors"][0]["pieces"].size(), 3u);
  Result text = Ckptctl("inspect " + path);
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("manifest pieces in 4 piece files"));
  Result ok = Ckptctl("verify " + path);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("4 pieces, 2 files"));
  EXPECT_THAT(ok.out, HasSubstr("manifest in 4 piece files"));
  const std::string victim = JoinPath(path, "manifest-pieces-00002.pb");
  ASSERT_TRUE(WriteFileDurably(victim, "x").ok());
  Result bad = Ckptctl("verify " + path);
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr(victim));
}

// Above --max-listed-pieces, inspect streams the manifest into per-tensor figures only: the
// same tensors, bytes and piece counts, no piece lines, and the JSON says so.
TEST(CkptctlStorageTest, InspectListsPiecesOnlyUpToTheLimit) {
  const std::string dir = TestDir("inspect_limit");
  Sharded s;
  const std::string path = MakeSharded(dir, s);
  Result all = Ckptctl("inspect " + path + " --json --max-listed-pieces 4");
  ASSERT_EQ(all.code, 0) << all.err;
  Json listed = Json::parse(all.out);
  EXPECT_EQ(listed["pieces_listed"], true);
  EXPECT_EQ(listed["piece_count"], 4);
  EXPECT_EQ(listed["tensors"][0]["pieces"].size(), 3u);
  Result few = Ckptctl("inspect " + path + " --json --max-listed-pieces 3");
  ASSERT_EQ(few.code, 0) << few.err;
  Json j = Json::parse(few.out);
  EXPECT_EQ(j["pieces_listed"], false);
  EXPECT_EQ(j["piece_count"], 4);
  ASSERT_EQ(j["tensors"].size(), 2u);
  EXPECT_EQ(j["tensors"][0]["key"], "w");
  EXPECT_EQ(j["tensors"][0]["stored_bytes"], 192);
  EXPECT_EQ(j["tensors"][0]["piece_count"], 3);
  EXPECT_FALSE(j["tensors"][0].contains("pieces"));
  EXPECT_EQ(j["tensors"][1]["piece_count"], 1);
  Result text = Ckptctl("inspect " + path + " --max-listed-pieces 0");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("w  F32 (8, 6)  192 B in 3 piece(s)"));
  EXPECT_THAT(text.out, HasSubstr("pieces not listed: more than 0"));
  EXPECT_THAT(text.out, Not(HasSubstr("w|0:4,0:6")));
  EXPECT_EQ(Ckptctl("inspect " + path + " --max-listed-pieces -1").code, 2);
}

TEST(CkptctlStorageTest, InspectReportsIncompleteAndUsageErrors) {
  const std::string dir = TestDir("inspect_bad");
  ASSERT_TRUE(MakeDir(JoinPath(dir, "half")).ok());
  Result r = Ckptctl("inspect " + JoinPath(dir, "half"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("incomplete checkpoint"));
  Result j = Ckptctl("inspect --json " + JoinPath(dir, "half"));
  EXPECT_EQ(j.code, 1);
  EXPECT_EQ(Json::parse(j.out)["state"], "incomplete");
  EXPECT_EQ(Ckptctl("inspect").code, 2);
  EXPECT_EQ(Ckptctl("inspect a b").code, 2);
  EXPECT_EQ(Ckptctl("inspect --bogus x").code, 2);
  Result help = Ckptctl("inspect --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: ckptctl inspect"));
  Result missing = Ckptctl("inspect " + JoinPath(dir, "nothing"));
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1);
}

TEST(CkptctlStorageTest, VerifyPassesAndCatchesCorruptionAndGaps) {
  const std::string dir = TestDir("verify");
  Sharded s;
  const std::string path = MakeSharded(dir, s);
  Result ok = Ckptctl("verify " + path);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("OK"));
  EXPECT_EQ(Ckptctl("verify --no-uring --direct-io --threads 1 " + path).code, 0);

  // Flip one byte inside the piece of "b".
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok());
  const pb::StoredPiece& b = (*reader)->manifest().pieces((*reader)->PiecesOf("b")[0]);
  const std::string file = JoinPath(path, b.file());
  std::string bytes = *ReadWholeFile(file, 1 << 20);
  bytes[b.byte_offset() + 3] ^= 1;
  ASSERT_TRUE(WriteFileDurably(file, bytes).ok());
  Result bad = Ckptctl("verify " + path);
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("checksum mismatch"));
  EXPECT_THAT(bad.err, HasSubstr("entry \"b|0:6\""));

  // A checkpoint missing the bottom half of "w" and all of "b" (their data file dropped from
  // the manifest; the writer refuses to produce one).
  const std::string gap = JoinPath(dir, "gap");
  ASSERT_TRUE(WriteCheckpoint(gap, s.Contents(), WriteOptions{}).ok());
  DropDataFile(gap, "data/r1_0.safetensors");
  Result g = Ckptctl("verify " + gap);
  EXPECT_EQ(g.code, 1);
  EXPECT_THAT(g.err, HasSubstr("tensor \"w\" (8, 6): elements [24, 48) in row-major order are "
                               "stored by no piece (a hole from (4, 0) to (7, 5))"));

  // Overlapping pieces: the flat pieces of rows 4:8 relabelled rows 3:7 (checksums valid).
  const std::string overlap = JoinPath(dir, "overlap");
  ASSERT_TRUE(WriteCheckpoint(overlap, s.Contents(), WriteOptions{}).ok());
  RelabelRows(overlap, "w|4:8,0:6", "w|3:7,0:6", 3);
  Result ov = Ckptctl("verify " + overlap);
  EXPECT_EQ(ov.code, 1);
  EXPECT_THAT(ov.err, HasSubstr("tensor \"w\" (8, 6): element (3, 0) is stored by 2 pieces (an "
                                "overlap): tensor \"w\" region [0:4, 0:6] in "
                                "data/r0_0.safetensors and tensor \"w\" region [3:7, 0:6] "
                                "flat[0:10) in data/r1_0.safetensors"));

  // A stray file in data/.
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "data/stray.safetensors"), "x").ok());
  Result stray = Ckptctl("verify " + path);
  EXPECT_EQ(stray.code, 1);
  EXPECT_THAT(stray.err, HasSubstr("stray.safetensors is not listed in the manifest"));

  EXPECT_EQ(Ckptctl("verify " + JoinPath(dir, "none")).code, 1);
  EXPECT_EQ(Ckptctl("verify --threads 0 " + path).code, 2);
}

TEST(CkptctlStorageTest, CopyVerifiesEveryByteAndRefusesACorruptSource) {
  const std::string dir = TestDir("copy");
  Sharded s;
  const std::string path = MakeSharded(dir, s);
  const std::string to = JoinPath(dir, "copied");
  Result ok = Ckptctl("copy --parallelism 2 --chunk-size 4KiB " + path + " file://" + to);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("2 files"));
  EXPECT_THAT(ok.out, HasSubstr("4 pieces verified"));
  EXPECT_EQ(Ckptctl("verify " + to).code, 0);
  Result again = Ckptctl("copy " + path + " " + to);
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err, HasSubstr(to));

  // A flipped byte in the source: DataLoss naming the tensor; the earlier copy is intact.
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok());
  const pb::StoredPiece& b = (*reader)->manifest().pieces((*reader)->PiecesOf("b")[0]);
  const std::string file = JoinPath(path, b.file());
  std::string bytes = *ReadWholeFile(file, 1 << 20);
  bytes[b.byte_offset() + 3] ^= 1;
  ASSERT_TRUE(WriteFileDurably(file, bytes).ok());
  Result bad = Ckptctl("copy --overwrite " + path + " " + to);
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("do not match their XXH3-64 checksum"));
  EXPECT_THAT(bad.err, HasSubstr("tensor \"b\" region [0:6]"));
  EXPECT_EQ(Ckptctl("verify " + to).code, 0);

  EXPECT_EQ(Ckptctl("copy --parallelism 0 " + path + " " + to).code, 2);
  Result scheme = Ckptctl("copy " + path + " gopher://x/y");
  EXPECT_EQ(scheme.code, 1);
  EXPECT_THAT(scheme.err, HasSubstr("gopher://x/y"));
}

TEST(CkptctlStorageTest, ImportFileDirAndIndexThenExportRoundTrips) {
  const std::string dir = TestDir("import");
  const std::string hf = JoinPath(dir, "hf");
  ASSERT_TRUE(MakeDir(hf).ok());
  std::vector<HfTensor> part1 = {{"model.embed.weight", "F16", {10, 4}, Bytes(80, 3)},
                                 {"model.norm", "F32", {4}, Bytes(16, 4)}};
  std::vector<HfTensor> part2 = {{"lm_head.weight", "BF16", {3, 4}, Bytes(24, 5)},
                                 {"scalar", "I64", {}, Bytes(8, 6)}};
  WriteHfFile(JoinPath(hf, "model-00001-of-00002.safetensors"), part1);
  WriteHfFile(JoinPath(hf, "model-00002-of-00002.safetensors"), part2);
  Json index = {{"metadata", {{"total_size", 128}}}, {"weight_map", Json::object()}};
  for (auto& t : part1) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (auto& t : part2) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  ASSERT_TRUE(WriteFileDurably(JoinPath(hf, "model.safetensors.index.json"), index.dump()).ok());

  for (const std::string& source : {JoinPath(hf, "model.safetensors.index.json"), hf,
                                    JoinPath(hf, "model-00002-of-00002.safetensors")}) {
    const std::string ck = JoinPath(dir, "ck");
    Result imp = Ckptctl("import " + source + " " + ck + " --overwrite");
    ASSERT_EQ(imp.code, 0) << source << ": " << imp.err;
    ASSERT_EQ(Ckptctl("verify " + ck).code, 0);
    auto reader = CheckpointReader::Open(ck);
    ASSERT_TRUE(reader.ok());
    const bool all = source != JoinPath(hf, "model-00002-of-00002.safetensors");
    EXPECT_EQ((*reader)->manifest().tensors_size(), all ? 4 : 2) << source;
    std::string got(24, '\0');
    ASSERT_TRUE((*reader)->ReadRegion("lm_head.weight", WholeRegion({3, 4}), got.data()).ok());
    EXPECT_TRUE(got == part2[0].data);
  }
  // Import refuses to replace without --overwrite.
  Result again = Ckptctl("import " + hf + " " + JoinPath(dir, "ck"));
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err, HasSubstr("overwrite"));

  // Export back to one file and compare with the originals.
  const std::string ck = JoinPath(dir, "ck_all");
  ASSERT_EQ(Ckptctl("import " + hf + " " + ck).code, 0);
  const std::string out = JoinPath(dir, "out.safetensors");
  Result ex = Ckptctl("export " + ck + " " + out);
  ASSERT_EQ(ex.code, 0) << ex.err;
  auto tensors = ReadHfFile(out);
  ASSERT_EQ(tensors.size(), 4u);
  for (const auto& t : part1) EXPECT_TRUE(tensors.at(t.name).data == t.data) << t.name;
  for (const auto& t : part2) EXPECT_TRUE(tensors.at(t.name).data == t.data) << t.name;
  EXPECT_EQ(tensors.at("scalar").shape, std::vector<int64_t>{});
  EXPECT_EQ(Ckptctl("export " + ck + " " + out).code, 1);  // exists, no --overwrite
}

// import --overwrite replaces only a committed checkpoint: a directory of someone's files,
// a regular file, an incomplete checkpoint and a link are refused by name and survive.
TEST(CkptctlStorageTest, ImportOverwriteRefusesWhatIsNotACheckpoint) {
  const std::string dir = TestDir("import_overwrite");
  const std::string source = JoinPath(dir, "model.safetensors");
  WriteHfFile(source, {{"w", "F32", {4}, Bytes(16, 9)}});
  const std::string home = JoinPath(dir, "home");
  ASSERT_TRUE(MakeDir(home).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(home, "notes.txt"), "keep").ok());
  const std::string file = JoinPath(dir, "file");
  ASSERT_TRUE(WriteFileDurably(file, "plain").ok());
  const std::string half = JoinPath(dir, "half");
  ASSERT_TRUE(MakeDir(half).ok());
  ASSERT_TRUE(MakeDir(JoinPath(half, "data")).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(half, "data/r0_0.safetensors"), "partial").ok());
  const std::string ck = JoinPath(dir, "ck");
  ASSERT_EQ(Ckptctl("import " + source + " " + ck).code, 0);
  const std::string link = JoinPath(dir, "link");
  ASSERT_EQ(::symlink("ck", link.c_str()), 0);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {home, "not a ckpt checkpoint (no manifest.pb)"},
      {file, "a regular file"},
      {half, "an incomplete checkpoint"},
      {link, "a symbolic link"}};
  for (const auto& [victim, what] : cases) {
    Result r = Ckptctl("import " + source + " " + victim + " --overwrite");
    EXPECT_EQ(r.code, 1) << victim;
    EXPECT_THAT(r.err, HasSubstr(victim));
    EXPECT_THAT(r.err, HasSubstr(what));
  }
  EXPECT_EQ(ReadWholeFile(JoinPath(home, "notes.txt"), 1 << 20).value_or(""), "keep");
  EXPECT_EQ(ReadWholeFile(file, 1 << 20).value_or(""), "plain");
  EXPECT_EQ(ReadWholeFile(JoinPath(half, "data/r0_0.safetensors"), 1 << 20).value_or(""),
            "partial");
  char target[64] = {};
  ASSERT_GT(::readlink(link.c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "ck");
  EXPECT_EQ(*ListDir(dir),
            (std::vector<std::string>{"ck", "file", "half", "home", "link", "model.safetensors"}));
  // A committed checkpoint is replaced.
  EXPECT_EQ(Ckptctl("import " + source + " " + ck + " --overwrite").code, 0);
}

// export --overwrite replaces only the files an export writes (regular files with export
// names), removes an earlier export's shards it does not rewrite, and touches nothing else.
TEST(CkptctlStorageTest, ExportOverwriteReplacesOnlyItsOwnFiles) {
  const std::string dir = TestDir("export_overwrite");
  Sharded s;
  const std::string path = MakeSharded(dir, s);
  const std::string out = JoinPath(dir, "out");
  ASSERT_EQ(Ckptctl("export " + path + " " + out + " --max-file-size 100B").code, 0);
  ASSERT_TRUE(WriteFileDurably(JoinPath(out, "README.md"), "model card").ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(out, "model-extra.safetensors"), "not ours").ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(out, "model.safetensors.tmp-1"), "not ours").ok());

  // Without --overwrite an earlier export in the directory is refused, whatever the split.
  Result again = Ckptctl("export " + path + " " + out);
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err, HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT(again.err, HasSubstr("--overwrite"));

  // One file now: the two shards and the index of the split export go, the rest stays.
  Result one = Ckptctl("export " + path + " " + out + " --overwrite");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(*ListDir(out),
            (std::vector<std::string>{"README.md", "model-extra.safetensors", "model.safetensors",
                                      "model.safetensors.tmp-1"}));
  EXPECT_TRUE(ReadHfFile(JoinPath(out, "model.safetensors")).at("w").data == s.w);
  EXPECT_EQ(ReadWholeFile(JoinPath(out, "README.md"), 1 << 20).value_or(""), "model card");

  // A directory or a link under an export name is never replaced or followed.
  ASSERT_EQ(::unlink(JoinPath(out, "model.safetensors").c_str()), 0);
  ASSERT_TRUE(MakeDir(JoinPath(out, "model.safetensors")).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(out, "model.safetensors/inside"), "x").ok());
  Result dir_named = Ckptctl("export " + path + " " + out + " --overwrite");
  EXPECT_EQ(dir_named.code, 1);
  EXPECT_THAT(dir_named.err, HasSubstr("model.safetensors: it is a directory"));
  EXPECT_EQ(ReadWholeFile(JoinPath(out, "model.safetensors/inside"), 1 << 20).value_or(""), "x");
  const std::string elsewhere = JoinPath(dir, "elsewhere.txt");
  ASSERT_TRUE(WriteFileDurably(elsewhere, "someone's").ok());
  const std::string single = JoinPath(dir, "single.safetensors");
  ASSERT_EQ(::symlink(elsewhere.c_str(), single.c_str()), 0);
  Result link = Ckptctl("export " + path + " " + single + " --overwrite");
  EXPECT_EQ(link.code, 1);
  EXPECT_THAT(link.err, HasSubstr("a symbolic link"));
  EXPECT_EQ(ReadWholeFile(elsewhere, 1 << 20).value_or(""), "someone's");
}

TEST(CkptctlStorageTest, ImportRejectsBadSources) {
  const std::string dir = TestDir("import_bad");
  const std::string f = JoinPath(dir, "bad.safetensors");
  ASSERT_TRUE(WriteFileDurably(f, std::string("\x10\0\0\0\0\0\0\0{\"a\":1}         ", 24)).ok());
  Result r = Ckptctl("import " + f + " " + JoinPath(dir, "ck"));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("bad.safetensors"));
  EXPECT_FALSE(PathExists(JoinPath(dir, "ck")));
  ASSERT_TRUE(WriteFileDurably(JoinPath(dir, "idx.json"),
                               R"({"weight_map":{"a":"../../etc/x.safetensors"}})")
                  .ok());
  Result idx = Ckptctl("import " + JoinPath(dir, "idx.json") + " " + JoinPath(dir, "ck"));
  EXPECT_EQ(idx.code, 1);
  EXPECT_THAT(idx.err, HasSubstr("plain .safetensors file names"));
  EXPECT_EQ(Ckptctl("import onlyone").code, 2);
}

TEST(CkptctlStorageTest, ExportConsolidatesShardsAndSplitsWithAnIndex) {
  const std::string dir = TestDir("export");
  Sharded s;
  const std::string path = MakeSharded(dir, s);
  const std::string one = JoinPath(dir, "one");
  Result r = Ckptctl("export " + path + " " + one);
  ASSERT_EQ(r.code, 0) << r.err;
  auto t = ReadHfFile(JoinPath(one, "model.safetensors"));
  EXPECT_TRUE(t.at("w").data == s.w);
  EXPECT_EQ(t.at("w").shape, (std::vector<int64_t>{8, 6}));
  EXPECT_TRUE(t.at("b").data == s.b);

  const std::string split = JoinPath(dir, "split");
  Result sp = Ckptctl("export " + path + " " + split + " --max-file-size 100B");
  ASSERT_EQ(sp.code, 0) << sp.err;
  Json index =
      Json::parse(*ReadWholeFile(JoinPath(split, "model.safetensors.index.json"), 1 << 20));
  EXPECT_EQ(index["metadata"]["total_size"], 192 + 12);
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["w"], "model-00002-of-00002.safetensors");
  EXPECT_TRUE(ReadHfFile(JoinPath(split, "model-00002-of-00002.safetensors")).at("w").data == s.w);

  // Re-import of the split export gives back the same tensors.
  const std::string back = JoinPath(dir, "back");
  ASSERT_EQ(Ckptctl("import " + JoinPath(split, "model.safetensors.index.json") + " " + back).code,
            0);
  auto reader = CheckpointReader::Open(back);
  ASSERT_TRUE(reader.ok());
  std::string w(192, '\0');
  ASSERT_TRUE((*reader)->ReadRegion("w", WholeRegion({8, 6}), w.data()).ok());
  EXPECT_TRUE(w == s.w);

  Result too_small =
      Ckptctl("export " + path + " " + JoinPath(dir, "x.safetensors") + " --max-file-size 100B");
  EXPECT_EQ(too_small.code, 1);
  EXPECT_THAT(too_small.err, HasSubstr("give a directory"));
  EXPECT_EQ(Ckptctl("export " + path + " " + JoinPath(dir, "y") + " --max-file-size lots").code, 2);

  // A checkpoint with a gap cannot be exported: the error names the tensor and the hole.
  const std::string gap = JoinPath(dir, "gap");
  ASSERT_TRUE(WriteCheckpoint(gap, s.Contents(), WriteOptions{}).ok());
  DropDataFile(gap, "data/r0_0.safetensors");
  Result g = Ckptctl("export " + gap + " " + JoinPath(dir, "g.safetensors"));
  EXPECT_EQ(g.code, 1);
  EXPECT_THAT(g.err, HasSubstr("tensor \"w\" (8, 6): elements [0, 24) in row-major order are "
                               "stored by no piece"));
  EXPECT_FALSE(PathExists(JoinPath(dir, "g.safetensors")));
}

}  // namespace
}  // namespace ckpt
