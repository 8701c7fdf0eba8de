// Overwriting commits replace only a committed ckpt checkpoint: everything else at the
// destination (files, links, arbitrary, empty or incomplete directories, checkpoints holding
// foreign files) is refused with a message naming it, and survives byte for byte.
#include "storage/overwrite_guard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// A one-tensor checkpoint whose float data is all `value`.
struct Contents {
  std::vector<float> data = std::vector<float>(16, 0.0f);
  CheckpointContents Make(float value) {
    data.assign(16, value);
    CheckpointContents c;
    c.tensors = {{"w", DType::kF32, {16}}};
    c.files = {{0, {{"w", WholeRegion({16}), data.data(), 64}}}};
    return c;
  }
};

WriteOptions Overwrite() {
  WriteOptions o;
  o.overwrite = true;
  return o;
}

float FirstValue(const std::string& path) {
  auto reader = CheckpointReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return -1;
  std::vector<float> out(16);
  EXPECT_TRUE((*reader)->ReadRegion("w", WholeRegion({16}), out.data()).ok());
  return out[0];
}

// Writes `dir`/`name` with `text` (making `dir` first).
void Put(const std::string& dir, const std::string& name, const std::string& text) {
  ASSERT_TRUE(MakeDir(dir, /*exist_ok=*/true).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(dir, name), text).ok());
}

std::string Read(const std::string& path) {
  return ReadWholeFile(path, 1 << 20).value_or("<gone>");
}

// Expects an overwriting write to `path` to be refused with a message naming the path and
// `what`, and the parent directory to hold no staging leftovers.
void ExpectRefused(const std::string& path, const std::string& what,
                   const std::string& named = "") {
  Contents c;
  auto m = WriteCheckpoint(path, c.Make(2), Overwrite());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(named.empty() ? path : named));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(what));
  const std::vector<std::string> names =
      ListDir(ParentDir(path)).value_or(std::vector<std::string>{});
  for (const std::string& n : names) {
    EXPECT_EQ(n.find(".tmp-"), std::string::npos) << "leftover staging " << n;
  }
}

TEST(OverwriteGuardTest, OverwriteReplacesACommittedCheckpoint) {
  const std::string dir = TestDir("replaces");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), WriteOptions{}).ok());
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(2), Overwrite()).ok());
  EXPECT_EQ(FirstValue(path), 2.0f);
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});
  // Nothing there yet: overwrite is a plain commit.
  ASSERT_TRUE(WriteCheckpoint(JoinPath(dir, "fresh"), c.Make(3), Overwrite()).ok());
  EXPECT_EQ(FirstValue(JoinPath(dir, "fresh")), 3.0f);
}

TEST(OverwriteGuardTest, OverwriteRefusesARegularFile) {
  const std::string dir = TestDir("file");
  Put(dir, "ckpt", "my thesis");
  ExpectRefused(JoinPath(dir, "ckpt"), "a regular file");
  EXPECT_EQ(Read(JoinPath(dir, "ckpt")), "my thesis");
}

TEST(OverwriteGuardTest, OverwriteRefusesADirectoryThatIsNotACheckpoint) {
  const std::string dir = TestDir("arbitrary");
  const std::string victim = JoinPath(dir, "ckpt");
  Put(victim, "notes.txt", "keep me");
  Put(JoinPath(victim, "sub"), "deep.txt", "me too");  // victim exists by now
  ExpectRefused(victim, "a directory that is not a ckpt checkpoint (no manifest.pb)");
  EXPECT_EQ(Read(JoinPath(victim, "notes.txt")), "keep me");
  EXPECT_EQ(Read(JoinPath(victim, "sub/deep.txt")), "me too");
}

// An empty directory is committed over with or without overwrite (as DCP writes into the
// directory it is given, storage/checkpoint_writer.h), keeping its permission bits.
TEST(OverwriteGuardTest, OverwriteReplacesAnEmptyDirectoryKeepingItsMode) {
  const std::string dir = TestDir("empty");
  const std::string target = JoinPath(dir, "ckpt");
  ASSERT_TRUE(MakeDir(target).ok());
  ::chmod(target.c_str(), 0700);
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(target, c.Make(2), Overwrite()).ok());
  EXPECT_EQ(FirstValue(target), 2.0f);
  struct stat st;
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);  // still private
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(OverwriteGuardTest, OverwriteRefusesAnIncompleteCheckpoint) {
  const std::string dir = TestDir("incomplete");
  const std::string victim = JoinPath(dir, "ckpt");
  ASSERT_TRUE(MakeDir(victim).ok());
  Put(JoinPath(victim, "data"), "r0_0.safetensors", "partial");
  ExpectRefused(victim, "an incomplete checkpoint");
  EXPECT_EQ(Read(JoinPath(victim, "data/r0_0.safetensors")), "partial");
}

TEST(OverwriteGuardTest, OverwriteRefusesADirectoryWithAnInvalidManifest) {
  const std::string dir = TestDir("garbage");
  const std::string victim = JoinPath(dir, "ckpt");
  Put(victim, "manifest.pb", "not a protobuf \xff\xff");
  Put(victim, "results.csv", "1,2,3");
  ExpectRefused(victim, "an invalid checkpoint");
  EXPECT_EQ(Read(JoinPath(victim, "results.csv")), "1,2,3");
}

TEST(OverwriteGuardTest, OverwriteRefusesACheckpointThatAlsoHoldsOtherFiles) {
  const std::string dir = TestDir("extra");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), WriteOptions{}).ok());
  Put(path, "README", "what this run was");
  ExpectRefused(path, "also holds README");
  EXPECT_EQ(Read(JoinPath(path, "README")), "what this run was");
  EXPECT_EQ(FirstValue(path), 1.0f);
  ASSERT_EQ(::unlink(JoinPath(path, "README").c_str()), 0);
  Put(JoinPath(path, "data"), "r9_9.safetensors", "a stranger");
  ExpectRefused(path, "also holds data/r9_9.safetensors");
  EXPECT_EQ(Read(JoinPath(path, "data/r9_9.safetensors")), "a stranger");
}

// Write options that put the manifest's pieces into piece files (format 2).
WriteOptions InPieceFiles(bool overwrite) {
  WriteOptions o;
  o.overwrite = overwrite;
  o.manifest_files.max_single_file_bytes = 1;
  o.manifest_files.piece_file_bytes = 1;
  return o;
}

TEST(OverwriteGuardTest, OverwriteReplacesACheckpointWithPieceFiles) {
  const std::string dir = TestDir("replaces-piece-files");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), InPieceFiles(false)).ok());
  const std::vector<std::string> v2 = {"data", "manifest-pieces-00000.pb", "manifest.pb"};
  EXPECT_EQ(*ListDir(path), v2);
  ASSERT_TRUE(CheckReplaceable(path).ok()) << CheckReplaceable(path).status();
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(2), InPieceFiles(true)).ok());
  EXPECT_EQ(FirstValue(path), 2.0f);
  EXPECT_EQ(*ListDir(path), v2);
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(3), Overwrite()).ok());  // back to one file
  EXPECT_EQ(FirstValue(path), 3.0f);
  EXPECT_EQ(*ListDir(path), (std::vector<std::string>{"data", "manifest.pb"}));
  EXPECT_EQ(*ListDir(dir), std::vector<std::string>{"ckpt"});
}

TEST(OverwriteGuardTest, OverwriteRefusesAPieceFileCheckpointThatAlsoHoldsOtherFiles) {
  const std::string dir = TestDir("extra-piece-files");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), InPieceFiles(false)).ok());
  const std::string listed = JoinPath(path, "manifest-pieces-00000.pb");
  const std::string bytes = Read(listed);
  Put(path, "manifest-pieces-00001.pb", bytes);  // well-formed name, not listed
  ExpectRefused(path, "also holds manifest-pieces-00001.pb");
  EXPECT_EQ(Read(JoinPath(path, "manifest-pieces-00001.pb")), bytes);
  EXPECT_EQ(FirstValue(path), 1.0f);
  ASSERT_EQ(::unlink(JoinPath(path, "manifest-pieces-00001.pb").c_str()), 0);
  // A listed piece file that is a link (to an identical file) is not part of the checkpoint.
  Put(dir, "elsewhere.pb", bytes);
  ASSERT_EQ(::unlink(listed.c_str()), 0);
  ASSERT_EQ(::symlink(JoinPath(dir, "elsewhere.pb").c_str(), listed.c_str()), 0);
  ExpectRefused(path, "also holds manifest-pieces-00000.pb");
  EXPECT_EQ(Read(JoinPath(dir, "elsewhere.pb")), bytes);
}

TEST(OverwriteGuardTest, OverwriteRefusesAPieceFileCheckpointMissingAPieceFile) {
  const std::string dir = TestDir("missing-piece-file");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), InPieceFiles(false)).ok());
  const std::string manifest = Read(JoinPath(path, "manifest.pb"));
  ASSERT_EQ(::unlink(JoinPath(path, "manifest-pieces-00000.pb").c_str()), 0);
  ExpectRefused(path, "an invalid checkpoint: ");
  ExpectRefused(path, "manifest-pieces-00000.pb");
  EXPECT_EQ(Read(JoinPath(path, "manifest.pb")), manifest);
  EXPECT_EQ(*ListDir(path), (std::vector<std::string>{"data", "manifest.pb"}));
}

// The guard streams the manifest without keeping its pieces, but still validates every one:
// a piece the manifest's tensors do not know (format 1) and a damaged piece file (format 2)
// make the directory an invalid checkpoint, left as it was.
TEST(OverwriteGuardTest, OverwriteRefusesACheckpointWhosePiecesDoNotValidate) {
  const std::string dir = TestDir("invalid-pieces");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), WriteOptions{}).ok());
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(Read(JoinPath(path, "manifest.pb"))));
  m.mutable_pieces(0)->set_key("v");
  const std::string relabelled = m.SerializeAsString();
  ASSERT_TRUE(WriteFileDurably(JoinPath(path, "manifest.pb"), relabelled).ok());
  ExpectRefused(path, "an invalid checkpoint: ");
  ExpectRefused(path, "its tensor is not listed");
  EXPECT_EQ(Read(JoinPath(path, "manifest.pb")), relabelled);

  const std::string split = JoinPath(dir, "split");
  ASSERT_TRUE(WriteCheckpoint(split, c.Make(1), InPieceFiles(false)).ok());
  const std::string piece_file = JoinPath(split, "manifest-pieces-00000.pb");
  std::string bytes = Read(piece_file);
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileDurably(piece_file, bytes).ok());
  ExpectRefused(split, "an invalid checkpoint: ");
  ExpectRefused(split, "manifest-pieces-00000.pb does not match its checksum");
  EXPECT_EQ(Read(piece_file), bytes);
}

TEST(OverwriteGuardTest, OverwriteNeverFollowsOrReplacesASymbolicLink) {
  const std::string dir = TestDir("symlink");
  const std::string real = JoinPath(dir, "real");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(real, c.Make(1), WriteOptions{}).ok());
  const std::string link = JoinPath(dir, "ckpt");
  ASSERT_EQ(::symlink("real", link.c_str()), 0);
  ExpectRefused(link, "a symbolic link (to \"real\")");
  // A trailing slash does not make the link's target the destination either.
  ExpectRefused(link + "/", "a symbolic link", link);
  char target[64] = {};
  ASSERT_GT(::readlink(link.c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "real");
  EXPECT_EQ(FirstValue(real), 1.0f);
}

TEST(OverwriteGuardTest, OverwriteRefusesAFifo) {
  const std::string dir = TestDir("fifo");
  const std::string victim = JoinPath(dir, "ckpt");
  ASSERT_EQ(::mkfifo(victim.c_str(), 0600), 0);
  ExpectRefused(victim, "a FIFO");
  struct stat st;
  ASSERT_EQ(::lstat(victim.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(OverwriteGuardTest, PathsThatNameNoEntryAreInvalid) {
  Contents c;
  for (const std::string path : {"", "/", ".", "..", "some/dir/.."}) {
    auto m = WriteCheckpoint(path, c.Make(1), Overwrite());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << "\"" << path << "\"";
  }
}

// The protocol in parts (cluster reshard, import): the destination was a checkpoint when the
// staging directory was made, but something else took its place before the commit. The commit
// checks again right before the swap and refuses.
TEST(OverwriteGuardTest, CommitChecksTheDestinationAgainBeforeTheSwap) {
  const std::string dir = TestDir("recheck");
  const std::string path = JoinPath(dir, "ckpt");
  Contents c;
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), WriteOptions{}).ok());
  auto staging = CreateStagingDir(path, /*overwrite=*/true);
  ASSERT_TRUE(staging.ok()) << staging.status();
  CheckpointContents next = c.Make(2);
  auto written = WriteDataFiles(*staging, next.tensors, next.files, 0, WriteOptions{});
  ASSERT_TRUE(written.ok()) << written.status();
  // Meanwhile the checkpoint is moved away and a user's directory appears under its name.
  ASSERT_EQ(::rename(path.c_str(), JoinPath(dir, "moved").c_str()), 0);
  Put(path, "precious.txt", "data");
  absl::Status s = CommitCheckpoint(
      *staging, path, BuildManifest(next.tensors, *written, next, kDefaultChecksumBlockBytes),
      Overwrite());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a ckpt checkpoint"));
  EXPECT_EQ(Read(JoinPath(path, "precious.txt")), "data");
  EXPECT_EQ(FirstValue(JoinPath(dir, "moved")), 1.0f);
  ASSERT_TRUE(DiscardStagingDir(*staging).ok());
}

TEST(OverwriteGuardTest, CheckReplaceableDescribesWhatIsThere) {
  const std::string dir = TestDir("describe");
  auto missing = CheckReplaceable(JoinPath(dir, "none"));
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->exists);
  Contents c;
  const std::string path = JoinPath(dir, "ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, c.Make(1), WriteOptions{}).ok());
  auto ok = CheckReplaceable(path);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->exists);
  EXPECT_TRUE(IsSameTarget(path, *ok));
  EXPECT_FALSE(IsSameTarget(dir, *ok));
}

}  // namespace
}  // namespace ckpt
