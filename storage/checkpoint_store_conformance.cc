#include "storage/checkpoint_store_conformance.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

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

namespace {

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
  return backend;
}

void PrintTo(const StoreBackend& backend, std::ostream* os) { *os << backend.name; }

std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info) {
  return info.param.name;
}

}  // namespace ckpt
