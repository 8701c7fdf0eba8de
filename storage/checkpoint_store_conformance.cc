#include "storage/checkpoint_store_conformance.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_store.h"
#include "storage/file_util.h"
#include "storage/manifest_file.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// A real checkpoint: two tensors in three data files of two writer ranks.
StoreSource MakeSource(const std::string& name, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::unique_ptr<std::string>> bytes;
  auto piece = [&](const std::string& key, Region region, int64_t size) {
    bytes.push_back(std::make_unique<std::string>(size, '\0'));
    for (char& c : *bytes.back()) c = static_cast<char>(rng());
    return PieceData{key, std::move(region), bytes.back()->data(), size};
  };
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kF32, {64, 32}},
                      TensorMeta{"b", DType::kBF16, {1000}}};
  contents.step = seed;
  DataFilePlan r0{0, {piece("w", Region{{0, 0}, {32, 32}, std::nullopt}, 32 * 32 * 4)}};
  DataFilePlan r1{1, {piece("w", Region{{32, 0}, {32, 32}, std::nullopt}, 32 * 32 * 4)}};
  DataFilePlan r1b{1, {piece("b", Region{{0}, {1000}, std::nullopt}, 2000)}};
  contents.files = {r0, r1, r1b};
  const std::string dir = JoinPath(TestDir(name), "ckpt");
  StoreSource source;
  absl::StatusOr<pb::Manifest> manifest = WriteCheckpoint(dir, contents, WriteOptions{});
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  if (!manifest.ok()) return source;
  source.manifest = *std::move(manifest);
  for (const pb::DataFile& file : source.manifest.files()) {
    absl::StatusOr<std::string> data = ReadWholeFile(JoinPath(dir, file.name()), int64_t{1} << 30);
    EXPECT_TRUE(data.ok()) << data.status();
    if (data.ok()) source.files[file.name()] = *std::move(data);
  }
  return source;
}

// Writes `bytes` as object `name` in two appends, then closes it.
absl::Status WriteObject(CheckpointWrite& write, const std::string& name,
                         const std::string& bytes) {
  absl::StatusOr<std::unique_ptr<ObjectWriter>> writer = write.Create(name);
  if (!writer.ok()) return writer.status();
  const size_t half = bytes.size() / 2;
  if (absl::Status s = (*writer)->Append(absl::string_view(bytes).substr(0, half)); !s.ok()) {
    return s;
  }
  if (absl::Status s = (*writer)->Append(absl::string_view(bytes).substr(half)); !s.ok()) return s;
  return (*writer)->Close(Deadline());
}

absl::Status WriteFiles(CheckpointWrite& write, const StoreSource& source) {
  for (const auto& [name, bytes] : source.files) {
    if (absl::Status s = WriteObject(write, name, bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

void CheckpointStoreConformanceTest::SetUp() {
  const std::string why = GetParam().unavailable_reason();
  ASSERT_EQ(why, "") << GetParam().name << " cannot run here";
  absl::StatusOr<CheckpointStore*> store = GetParam().store();
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = *store;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info->name();  // "Case/Backend": one path component
  std::replace(name.begin(), name.end(), '/', '.');
  prefix_ = GetParam().prefix(name);
}

std::unique_ptr<CheckpointWrite> CheckpointStoreConformanceTest::Begin(const std::string& url,
                                                                       bool overwrite) {
  StoreWriteOptions options;
  options.overwrite = overwrite;
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      store_->BeginWrite(url, options, Deadline());
  EXPECT_TRUE(write.ok()) << write.status();
  return write.ok() ? *std::move(write) : nullptr;
}

void CheckpointStoreConformanceTest::Commit(const std::string& url, const StoreSource& source,
                                            bool overwrite) {
  std::unique_ptr<CheckpointWrite> write = Begin(url, overwrite);
  ASSERT_NE(write, nullptr);
  ASSERT_TRUE(WriteFiles(*write, source).ok());
  absl::Status committed = write->Commit(source.manifest, Deadline());
  ASSERT_TRUE(committed.ok()) << committed;
}

void CheckpointStoreConformanceTest::ExpectHolds(const std::string& url,
                                                 const StoreSource& source) {
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> stored = store_->Open(url, Deadline());
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ((*stored)->manifest().SerializeAsString(), source.manifest.SerializeAsString());
  for (const auto& [name, bytes] : source.files) {
    std::string got(bytes.size(), '\0');
    absl::Status read = (*stored)->Read(name, 0, absl::MakeSpan(got), Deadline());
    ASSERT_TRUE(read.ok()) << read;
    EXPECT_TRUE(got == bytes) << name << " differs";
  }
}

void CheckpointStoreConformanceTest::ExpectNothingAt(const std::string& url) {
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> stored = store_->Open(url, Deadline());
  EXPECT_EQ(stored.status().code(), absl::StatusCode::kNotFound) << stored.status();
}

std::unique_ptr<CheckpointWrite> CheckpointStoreConformanceTest::Join(
    const std::string& staging_url) {
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      store_->JoinWrite(staging_url, Deadline());
  EXPECT_TRUE(write.ok()) << write.status();
  if (write.ok()) {
    EXPECT_TRUE((*write)->joined());
  }
  return write.ok() ? *std::move(write) : nullptr;
}

void CheckpointStoreConformanceTest::ExpectNoLeftovers(const std::string& url) {
  ASSERT_TRUE(GetParam().leftovers) << GetParam().name << " sets no StoreBackend::leftovers";
  const std::vector<std::string> left = GetParam().leftovers(url);
  EXPECT_TRUE(left.empty()) << url << " has leftovers, first " << left.front();
}

namespace {

// The names of `source`'s data files, sorted.
std::vector<std::string> Names(const StoreSource& source) {
  std::vector<std::string> names;
  for (const auto& [name, bytes] : source.files) names.push_back(name);
  return names;
}

// --- writes spread over several processes (JoinWrite, Adopt) -----------------------------

TEST_P(CheckpointStoreConformanceTest, AWriteJoinedTwiceCommitsTheAdoptedObjectsOfBoth) {
  const StoreSource source = MakeSource("conformance-joined", 20);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  EXPECT_FALSE(write->joined());
  const std::string staging = write->staging_url();
  const std::vector<std::string> names = Names(source);
  {  // two workers: one writes the first file, the other the rest; their writes then end
    std::unique_ptr<CheckpointWrite> first = Join(staging);
    std::unique_ptr<CheckpointWrite> second = Join(staging);
    ASSERT_NE(first, nullptr);
    ASSERT_NE(second, nullptr);
    ASSERT_TRUE(WriteObject(*first, names[0], source.files.at(names[0])).ok());
    for (size_t i = 1; i < names.size(); ++i) {
      ASSERT_TRUE(WriteObject(*second, names[i], source.files.at(names[i])).ok());
    }
  }
  ExpectNothingAt(url);
  for (const std::string& name : names) {
    absl::Status adopted = write->Adopt(name, Deadline());
    ASSERT_TRUE(adopted.ok()) << adopted;
  }
  absl::Status committed = write->Commit(source.manifest, Deadline());
  ASSERT_TRUE(committed.ok()) << committed;
  ExpectHolds(url, source);
  ExpectNoLeftovers(url);
  // A committed write cannot be joined any more.
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> late = store_->JoinWrite(staging, Deadline());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr(staging));
}

TEST_P(CheckpointStoreConformanceTest, ACommitWithoutAdoptingAJoinedObjectIsRefusedNamingIt) {
  const StoreSource source = MakeSource("conformance-unadopted", 21);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  std::unique_ptr<CheckpointWrite> joined = Join(write->staging_url());
  ASSERT_NE(joined, nullptr);
  ASSERT_TRUE(WriteFiles(*joined, source).ok());
  const std::vector<std::string> names = Names(source);
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    ASSERT_TRUE(write->Adopt(names[i], Deadline()).ok());
  }
  absl::Status s = write->Commit(source.manifest, Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(names.back()));
  ExpectNothingAt(url);
}

TEST_P(CheckpointStoreConformanceTest, AdoptRefusesAMissingObjectABadNameAndASecondAdoption) {
  const StoreSource source = MakeSource("conformance-adopt", 22);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  absl::Status missing = write->Adopt("data/r9_9.safetensors", Deadline());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("data/r9_9.safetensors"));
  EXPECT_THAT(missing.message(), HasSubstr(url));
  for (const std::string name : {"manifest.pb", "../x.safetensors", "data/../../x.safetensors"}) {
    absl::Status bad = write->Adopt(name, Deadline());
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << name << ": " << bad;
  }
  const std::vector<std::string> names = Names(source);
  std::unique_ptr<CheckpointWrite> joined = Join(write->staging_url());
  ASSERT_NE(joined, nullptr);
  ASSERT_TRUE(WriteObject(*joined, names[0], source.files.at(names[0])).ok());
  ASSERT_TRUE(WriteObject(*write, names[1], source.files.at(names[1])).ok());
  ASSERT_TRUE(write->Adopt(names[0], Deadline()).ok());
  for (const std::string& name : {names[0], names[1]}) {  // adopted, and created here
    absl::Status twice = write->Adopt(name, Deadline());
    EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists) << twice;
    EXPECT_THAT(twice.message(), HasSubstr(name));
  }
  // A missing object that a joined write then stores can be adopted after all.
  ASSERT_TRUE(WriteObject(*joined, names[2], source.files.at(names[2])).ok());
  ASSERT_TRUE(write->Adopt(names[2], Deadline()).ok());
  ASSERT_TRUE(write->Commit(source.manifest, Deadline()).ok());
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, AJoinedWriteCanNeitherCommitNorAdopt) {
  const StoreSource source = MakeSource("conformance-joined-commit", 23);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  std::unique_ptr<CheckpointWrite> joined = Join(write->staging_url());
  ASSERT_NE(joined, nullptr);
  ASSERT_TRUE(WriteFiles(*joined, source).ok());
  absl::Status committed = joined->Commit(source.manifest, Deadline());
  EXPECT_EQ(committed.code(), absl::StatusCode::kFailedPrecondition) << committed;
  EXPECT_THAT(committed.message(), HasSubstr(write->staging_url()));
  absl::Status adopted = joined->Adopt(Names(source)[0], Deadline());
  EXPECT_EQ(adopted.code(), absl::StatusCode::kFailedPrecondition) << adopted;
  ExpectNothingAt(url);
}

TEST_P(CheckpointStoreConformanceTest, TheBeginningWritesAbortRemovesTheJoinedWritesObjectsToo) {
  const StoreSource source = MakeSource("conformance-joined-abort", 24);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  const std::vector<std::string> names = Names(source);
  {
    std::unique_ptr<CheckpointWrite> joined = Join(write->staging_url());
    ASSERT_NE(joined, nullptr);
    ASSERT_TRUE(WriteFiles(*joined, source).ok());
  }
  ASSERT_TRUE(write->Adopt(names[0], Deadline()).ok());  // adopted or not, all go
  ASSERT_TRUE(write->Abort(Deadline()).ok());
  ExpectNothingAt(url);
  ExpectNoLeftovers(url);
  Commit(url, source);  // no overwrite needed: nothing is there
  ExpectHolds(url, source);
  ExpectNoLeftovers(url);
}

TEST_P(CheckpointStoreConformanceTest, DroppingTheBeginningWriteRemovesTheJoinedWritesObjects) {
  const StoreSource source = MakeSource("conformance-joined-drop", 25);
  const std::string url = prefix_ + "/a";
  {
    std::unique_ptr<CheckpointWrite> write = Begin(url);
    ASSERT_NE(write, nullptr);
    std::unique_ptr<CheckpointWrite> joined = Join(write->staging_url());
    ASSERT_NE(joined, nullptr);
    ASSERT_TRUE(WriteFiles(*joined, source).ok());
  }
  ExpectNothingAt(url);
  ExpectNoLeftovers(url);
}

TEST_P(CheckpointStoreConformanceTest, AJoinedWriteRemovesOnlyItsOwnObjects) {
  const StoreSource source = MakeSource("conformance-joined-own", 26);
  const std::string url = prefix_ + "/a";
  const std::vector<std::string> names = Names(source);
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  const std::string staging = write->staging_url();
  std::unique_ptr<CheckpointWrite> other = Join(staging);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(WriteObject(*other, names[2], source.files.at(names[2])).ok());
  {  // dropped: its closed object stays for the beginning write, its unclosed one goes
    std::unique_ptr<CheckpointWrite> dropped = Join(staging);
    ASSERT_NE(dropped, nullptr);
    ASSERT_TRUE(WriteObject(*dropped, names[0], source.files.at(names[0])).ok());
    std::unique_ptr<ObjectWriter> open = *dropped->Create(names[1]);
    ASSERT_TRUE(open->Append(source.files.at(names[1])).ok());
  }
  absl::Status unclosed = write->Adopt(names[1], Deadline());
  EXPECT_EQ(unclosed.code(), absl::StatusCode::kNotFound) << unclosed;
  {  // aborted: every object it created goes, closed or not
    std::unique_ptr<CheckpointWrite> aborted = Join(staging);
    ASSERT_NE(aborted, nullptr);
    ASSERT_TRUE(WriteObject(*aborted, names[1], source.files.at(names[1])).ok());
    ASSERT_TRUE(aborted->Abort(Deadline()).ok());
  }
  absl::Status removed = write->Adopt(names[1], Deadline());
  EXPECT_EQ(removed.code(), absl::StatusCode::kNotFound) << removed;
  // The others' objects are all there: with names[1] written again, the checkpoint commits.
  ASSERT_TRUE(WriteObject(*other, names[1], source.files.at(names[1])).ok());
  other.reset();
  for (const std::string& name : names) ASSERT_TRUE(write->Adopt(name, Deadline()).ok()) << name;
  absl::Status committed = write->Commit(source.manifest, Deadline());
  ASSERT_TRUE(committed.ok()) << committed;
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, JoinWriteRefusesWhatIsNotAStagingUrlNamingIt) {
  const StoreSource source = MakeSource("conformance-join-refused", 27);
  const std::string url = prefix_ + "/a";
  Commit(url, source);
  std::unique_ptr<CheckpointWrite> write = Begin(prefix_ + "/b");
  ASSERT_NE(write, nullptr);
  const std::string staging = write->staging_url();
  for (const std::string& bad :
       {std::string("garbage"), std::string("/etc/passwd"), url, prefix_, staging + "/",
        staging + "x", staging + "/data", staging + "/../a", staging + "/data/r0_0.safetensors",
        std::string("s3://"), "file://" + staging}) {
    absl::StatusOr<std::unique_ptr<CheckpointWrite>> joined = store_->JoinWrite(bad, Deadline());
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kInvalidArgument)
        << bad << ": " << joined.status();
    EXPECT_THAT(joined.status().message(), HasSubstr(bad));
  }
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, AfterTheBeginningWriteAbortedNothingJoinedIsStored) {
  const StoreSource source = MakeSource("conformance-join-aborted", 28);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  const std::string staging = write->staging_url();
  std::unique_ptr<CheckpointWrite> early = Join(staging);
  ASSERT_NE(early, nullptr);
  ASSERT_TRUE(write->Abort(Deadline()).ok());
  // Joining now is NotFound; a write joined before cannot store an object any more (the file
  // store's Create fails: the staging directory is gone; s3's Close finds the write ended,
  // removes the object it just stored and fails).
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> late = store_->JoinWrite(staging, Deadline());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr(staging));
  const std::string name = Names(source)[0];
  absl::Status stored = WriteObject(*early, name, source.files.at(name));
  EXPECT_FALSE(stored.ok());
  EXPECT_THAT(stored.message(), HasSubstr(name));
  early.reset();
  ExpectNothingAt(url);
  ExpectNoLeftovers(url);
}

// --- one process --------------------------------------------------------------------------

TEST_P(CheckpointStoreConformanceTest, ACommittedCheckpointReadsBackByteForByte) {
  const StoreSource source = MakeSource("conformance-roundtrip", 1);
  const std::string url = prefix_ + "/a";
  Commit(url, source);
  ExpectHolds(url, source);
  // A range at an odd offset inside a file is exactly those bytes.
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> stored = store_->Open(url, Deadline());
  ASSERT_TRUE(stored.ok());
  const auto& [name, bytes] = *source.files.begin();
  std::string got(1001, '\0');
  ASSERT_TRUE((*stored)->Read(name, 37, absl::MakeSpan(got), Deadline()).ok());
  EXPECT_TRUE(got == bytes.substr(37, 1001));
}

TEST_P(CheckpointStoreConformanceTest, NothingIsVisibleBeforeTheCommit) {
  const StoreSource source = MakeSource("conformance-invisible", 2);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  ASSERT_TRUE(WriteFiles(*write, source).ok());
  ExpectNothingAt(url);
  ASSERT_TRUE(write->Commit(source.manifest, Deadline()).ok());
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, AnAbortLeavesNothingAndTheUrlCanBeWrittenAfresh) {
  const StoreSource source = MakeSource("conformance-abort", 3);
  const std::string url = prefix_ + "/a";
  std::unique_ptr<CheckpointWrite> write = Begin(url);
  ASSERT_NE(write, nullptr);
  ASSERT_TRUE(WriteFiles(*write, source).ok());
  ASSERT_TRUE(write->Abort(Deadline()).ok());
  ExpectNothingAt(url);
  Commit(url, source);  // no overwrite needed: nothing is there
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, AWriteDroppedWithoutCommitIsAborted) {
  const StoreSource source = MakeSource("conformance-dropped", 4);
  const std::string url = prefix_ + "/a";
  {
    std::unique_ptr<CheckpointWrite> write = Begin(url);
    ASSERT_NE(write, nullptr);
    ASSERT_TRUE(WriteFiles(*write, source).ok());
  }
  ExpectNothingAt(url);
  Commit(url, source);
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, AnExistingCheckpointIsRefusedWithoutOverwrite) {
  const StoreSource source = MakeSource("conformance-exists", 5);
  const std::string url = prefix_ + "/a";
  Commit(url, source);
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> again =
      store_->BeginWrite(url, StoreWriteOptions{}, Deadline());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  ExpectHolds(url, source);
}

TEST_P(CheckpointStoreConformanceTest, AnOverwrittenCheckpointStaysReadableUntilTheNewOneCommits) {
  const StoreSource old_source = MakeSource("conformance-overwrite-old", 6);
  const StoreSource new_source = MakeSource("conformance-overwrite-new", 7);
  const std::string url = prefix_ + "/a";
  Commit(url, old_source);
  std::unique_ptr<CheckpointWrite> write = Begin(url, /*overwrite=*/true);
  ASSERT_NE(write, nullptr);
  ASSERT_TRUE(WriteFiles(*write, new_source).ok());
  ExpectHolds(url, old_source);
  ASSERT_TRUE(write->Commit(new_source.manifest, Deadline()).ok());
  ExpectHolds(url, new_source);
}

TEST_P(CheckpointStoreConformanceTest, AnAbortedOverwriteKeepsTheOldCheckpoint) {
  const StoreSource old_source = MakeSource("conformance-overwrite-abort-old", 8);
  const StoreSource new_source = MakeSource("conformance-overwrite-abort-new", 9);
  const std::string url = prefix_ + "/a";
  Commit(url, old_source);
  std::unique_ptr<CheckpointWrite> write = Begin(url, /*overwrite=*/true);
  ASSERT_NE(write, nullptr);
  ASSERT_TRUE(WriteFiles(*write, new_source).ok());
  ASSERT_TRUE(write->Abort(Deadline()).ok());
  ExpectHolds(url, old_source);
}

TEST_P(CheckpointStoreConformanceTest, ACommitRefusesAManifestThatDisagreesWithTheWrittenObjects) {
  const StoreSource source = MakeSource("conformance-disagree", 10);
  const std::string url = prefix_ + "/a";
  const std::string first = source.files.begin()->first;
  {  // a data file never written
    std::unique_ptr<CheckpointWrite> write = Begin(url);
    ASSERT_NE(write, nullptr);
    ASSERT_TRUE(WriteObject(*write, first, source.files.at(first)).ok());
    absl::Status s = write->Commit(source.manifest, Deadline());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("never written"));
  }
  {  // a data file of another size
    std::unique_ptr<CheckpointWrite> write = Begin(url);
    ASSERT_NE(write, nullptr);
    StoreSource shorter = source;
    shorter.files[first].pop_back();
    ASSERT_TRUE(WriteFiles(*write, shorter).ok());
    absl::Status s = write->Commit(source.manifest, Deadline());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr(first));
  }
  {  // an object the manifest does not list
    std::unique_ptr<CheckpointWrite> write = Begin(url);
    ASSERT_NE(write, nullptr);
    ASSERT_TRUE(WriteFiles(*write, source).ok());
    ASSERT_TRUE(WriteObject(*write, "data/stray.safetensors", "x").ok());
    absl::Status s = write->Commit(source.manifest, Deadline());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("data/stray.safetensors"));
  }
  ExpectNothingAt(url);
}

TEST_P(CheckpointStoreConformanceTest, ObjectNamesOutsideDataAreRefused) {
  std::unique_ptr<CheckpointWrite> write = Begin(prefix_ + "/a");
  ASSERT_NE(write, nullptr);
  for (const std::string name :
       {"manifest.pb", "../x.safetensors", "data/../../x.safetensors", "/etc/passwd",
        "data/.hidden.safetensors", "data/a/b.safetensors", ""}) {
    absl::StatusOr<std::unique_ptr<ObjectWriter>> writer = write->Create(name);
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument) << "\"" << name << "\"";
  }
  std::unique_ptr<ObjectWriter> once = *write->Create("data/r0_0.safetensors");
  EXPECT_EQ(write->Create("data/r0_0.safetensors").status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_P(CheckpointStoreConformanceTest, ReadsAreBoundedByTheManifest) {
  const StoreSource source = MakeSource("conformance-bounds", 11);
  const std::string url = prefix_ + "/a";
  Commit(url, source);
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> stored = store_->Open(url, Deadline());
  ASSERT_TRUE(stored.ok());
  const auto& [name, bytes] = *source.files.begin();
  std::string past(16, '\0');
  absl::Status s = (*stored)->Read(name, bytes.size() - 8, absl::MakeSpan(past), Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(s.message(), HasSubstr(name));
  s = (*stored)->Read("data/unlisted.safetensors", 0, absl::MakeSpan(past), Deadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_P(CheckpointStoreConformanceTest, DeleteRemovesTheCheckpointAndNothingElse) {
  const StoreSource source = MakeSource("conformance-delete", 12);
  Commit(prefix_ + "/a", source);
  Commit(prefix_ + "/ab", source);  // a name the first one prefixes
  ASSERT_TRUE(store_->Delete(prefix_ + "/a", Deadline()).ok());
  ExpectNothingAt(prefix_ + "/a");
  ExpectHolds(prefix_ + "/ab", source);
  absl::Status again = store_->Delete(prefix_ + "/a", Deadline());
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
}

TEST_P(CheckpointStoreConformanceTest, OpeningNothingIsNotFoundNamingTheUrl) {
  absl::StatusOr<std::unique_ptr<StoredCheckpoint>> stored =
      store_->Open(prefix_ + "/never", Deadline());
  EXPECT_EQ(stored.status().code(), absl::StatusCode::kNotFound) << stored.status();
  EXPECT_THAT(stored.status().message(), HasSubstr("never"));
}

}  // namespace

StoreBackend FileStoreBackend() {
  StoreBackend backend;
  backend.name = "File";
  backend.store = [] { return StoreForUrl("/"); };
  backend.prefix = [](const std::string& test) { return TestDir(absl::StrCat("store-", test)); };
  backend.leftovers = [](const std::string& url) {
    // Staging and discarded siblings of the checkpoint directory (".<name>.tmp-…").
    std::vector<std::string> left;
    const std::string path = *FileStorePath(url);
    const std::string sibling = absl::StrCat(".", BaseName(path), ".");
    absl::StatusOr<std::vector<std::string>> entries = ListDir(ParentDir(path));
    EXPECT_TRUE(entries.ok()) << entries.status();
    if (!entries.ok()) return left;
    for (const std::string& entry : *entries) {
      if (absl::StrContains(entry, sibling)) left.push_back(entry);  // ".." too: discarded
    }
    return left;
  };
  return backend;
}

void PrintTo(const StoreBackend& backend, std::ostream* os) { *os << backend.name; }

std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info) {
  return info.param.name;
}

}  // namespace ckpt
