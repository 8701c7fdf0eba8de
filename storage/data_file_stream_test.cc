#include "storage/data_file_stream.h"

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_writer.h"
#include "storage/direct_io_refusal.h"
#include "storage/file_util.h"
#include "storage/io_engine.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// A piece of `key` with `region` and raw bytes [data, data + bytes).
PieceData MakePiece(const std::string& key, Region region, const void* data, int64_t bytes) {
  PieceData p;
  p.key = key;
  p.region = std::move(region);
  p.data = data;
  p.size_bytes = bytes;
  return p;
}

// An emptied staging directory with its data/ folder.
std::string StagingDir(const std::string& name) {
  std::string dir = TestDir(name);
  EXPECT_TRUE(MakeDir(JoinPath(dir, "data")).ok());
  return dir;
}

// A random data file: 1-D tensors stored whole, of random dtypes and sizes (some empty, some
// spanning several checksum blocks), with random bytes.
struct RandomFile {
  std::vector<TensorMeta> tensors;
  std::vector<std::string> bytes;
  DataFilePlan plan;

  RandomFile(std::mt19937& rng, int writer_rank) {
    const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kI64, DType::kU8};
    const int n = 1 + static_cast<int>(rng() % 6);
    plan.writer_rank = writer_rank;
    for (int i = 0; i < n; ++i) {
      const DType dtype = dtypes[rng() % 4];
      const int64_t elements = (rng() % 5 == 0) ? 0 : static_cast<int64_t>(rng() % 3000);
      tensors.push_back(TensorMeta{absl::StrCat("t", i, ".w"), dtype, {elements}});
      bytes.emplace_back(static_cast<size_t>(elements * DTypeSize(dtype)), '\0');
      for (char& c : bytes.back()) c = static_cast<char>(rng());
    }
    for (int i = 0; i < n; ++i) {
      plan.pieces.push_back(MakePiece(tensors[i].key,
                                      Region{{0}, {tensors[i].global_shape[0]}, std::nullopt},
                                      bytes[i].data(), static_cast<int64_t>(bytes[i].size())));
    }
  }
};

// Streams `file` into `dir` in random chunks, the pieces' chunks interleaved in random order.
absl::StatusOr<WrittenData> StreamInRandomChunks(const RandomFile& file, const std::string& dir,
                                                 int index, int64_t block_bytes,
                                                 std::mt19937& rng) {
  DataFilePlan without_data = file.plan;
  for (PieceData& p : without_data.pieces) p.data = nullptr;
  absl::StatusOr<std::unique_ptr<DataFileStream>> stream =
      DataFileStream::Create(dir, file.tensors, without_data, index, block_bytes);
  if (!stream.ok()) return stream.status();
  const int n = static_cast<int>(file.bytes.size());
  std::vector<int64_t> done(n, 0);
  std::vector<int> open;
  for (int i = 0; i < n; ++i) open.push_back(i);
  while (!open.empty()) {
    const size_t pick = rng() % open.size();
    const int i = open[pick];
    const int64_t size = static_cast<int64_t>(file.bytes[i].size());
    const int64_t chunk = std::min<int64_t>(size - done[i], 1 + rng() % 700);
    if (absl::Status s = (*stream)->Append(i, file.bytes[i].data() + done[i], chunk); !s.ok()) {
      return s;
    }
    done[i] += chunk;
    if (done[i] == size) open.erase(open.begin() + static_cast<long>(pick));
  }
  return (*stream)->Finish();
}

TEST(DataFileStreamTest, StreamedFileAndRecordsAreByteIdenticalToTheWholeFileWriters) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const RandomFile file(rng, static_cast<int>(rng() % 4));
    const int64_t block_bytes = (trial % 3 == 0) ? kDefaultChecksumBlockBytes : 64 + rng() % 900;
    const int index = static_cast<int>(rng() % 3);
    const std::string whole_dir = StagingDir("whole");
    const std::string streamed_dir = StagingDir("streamed");
    WriteOptions options;
    options.checksum_block_bytes = block_bytes;
    absl::StatusOr<WrittenData> whole =
        WriteDataFiles(whole_dir, file.tensors, {file.plan}, index, options);
    ASSERT_TRUE(whole.ok()) << whole.status();
    absl::StatusOr<WrittenData> streamed =
        StreamInRandomChunks(file, streamed_dir, index, block_bytes, rng);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(whole->files.size(), 1u);
    ASSERT_EQ(streamed->files.size(), 1u);
    EXPECT_EQ(streamed->files[0].SerializeAsString(), whole->files[0].SerializeAsString());
    ASSERT_EQ(streamed->pieces.size(), whole->pieces.size());
    for (size_t i = 0; i < whole->pieces.size(); ++i) {
      EXPECT_EQ(streamed->pieces[i].SerializeAsString(), whole->pieces[i].SerializeAsString())
          << whole->pieces[i].DebugString() << " vs " << streamed->pieces[i].DebugString();
    }
    const std::string name = whole->files[0].name();
    auto whole_bytes = ReadWholeFile(JoinPath(whole_dir, name), 1 << 24);
    auto streamed_bytes = ReadWholeFile(JoinPath(streamed_dir, name), 1 << 24);
    ASSERT_TRUE(whole_bytes.ok() && streamed_bytes.ok());
    EXPECT_TRUE(*whole_bytes == *streamed_bytes);
  }
}

// Streams `file`'s data section in file order through AppendData from a 4096-aligned buffer, in
// runs of `run_bytes` (a multiple of 4096, as a host pool's chunks are) that span pieces.
absl::StatusOr<std::unique_ptr<DataFileStream>> StreamDataInAlignedRuns(
    const RandomFile& file, const std::string& dir, int index, int64_t run_bytes, bool direct_io) {
  DataFilePlan without_data = file.plan;
  for (PieceData& p : without_data.pieces) p.data = nullptr;
  DataFileStreamOptions options;
  options.direct_io = direct_io;
  absl::StatusOr<std::unique_ptr<DataFileStream>> stream =
      DataFileStream::Create(dir, file.tensors, without_data, index, options);
  if (!stream.ok()) return stream.status();
  std::string section;
  for (const std::string& b : file.bytes) section += b;
  char* run = static_cast<char*>(std::aligned_alloc(4096, static_cast<size_t>(run_bytes)));
  absl::Status s;
  for (size_t at = 0; at < section.size() && s.ok(); at += static_cast<size_t>(run_bytes)) {
    const size_t n = std::min(section.size() - at, static_cast<size_t>(run_bytes));
    std::copy_n(section.data() + at, n, run);
    s = (*stream)->AppendData(run, static_cast<int64_t>(n));
  }
  std::free(run);
  if (!s.ok()) return s;
  return stream;
}

// The file WriteDataFiles writes for `file`, and its records.
struct WholeFile {
  WrittenData records;
  std::string bytes;
};
WholeFile WriteWhole(const RandomFile& file, int index) {
  const std::string dir = StagingDir("whole");
  absl::StatusOr<WrittenData> whole =
      WriteDataFiles(dir, file.tensors, {file.plan}, index, WriteOptions());
  EXPECT_TRUE(whole.ok()) << whole.status();
  if (!whole.ok()) return {};
  auto bytes = ReadWholeFile(JoinPath(dir, whole->files[0].name()), 1 << 24);
  EXPECT_TRUE(bytes.ok());
  return WholeFile{*std::move(whole), bytes.ok() ? *bytes : ""};
}

TEST(DataFileStreamTest, DataInAlignedRunsSpanningPiecesIsByteIdenticalToWriteDataFiles) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 30; ++trial) {
    SCOPED_TRACE(absl::StrCat("trial ", trial));
    const RandomFile file(rng, static_cast<int>(rng() % 4));
    const int index = static_cast<int>(rng() % 3);
    const WholeFile whole = WriteWhole(file, index);
    const std::string dir = StagingDir("aligned");
    absl::StatusOr<std::unique_ptr<DataFileStream>> stream =
        StreamDataInAlignedRuns(file, dir, index, 4096 * (1 + rng() % 3), /*direct_io=*/true);
    ASSERT_TRUE(stream.ok()) << stream.status();
    absl::StatusOr<WrittenData> streamed = (*stream)->Finish();
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(streamed->pieces.size(), whole.records.pieces.size());
    for (size_t i = 0; i < streamed->pieces.size(); ++i) {
      EXPECT_EQ(streamed->pieces[i].SerializeAsString(),
                whole.records.pieces[i].SerializeAsString());
    }
    EXPECT_EQ(streamed->files[0].SerializeAsString(), whole.records.files[0].SerializeAsString());
    auto bytes = ReadWholeFile(JoinPath(dir, whole.records.files[0].name()), 1 << 24);
    ASSERT_TRUE(bytes.ok());
    EXPECT_TRUE(*bytes == whole.bytes);
  }
}

// A file whose data section spans several aligned runs, so that O_DIRECT has whole blocks.
RandomFile LargeFile() {
  std::mt19937 rng(5);
  RandomFile file(rng, 0);
  file.tensors = {TensorMeta{"a.w", DType::kF32, {5000}}, TensorMeta{"b.w", DType::kU8, {9001}}};
  file.bytes = {std::string(20000, 'a'), std::string(9001, 'b')};
  for (char& c : file.bytes[1]) c = static_cast<char>(rng());
  file.plan.pieces = {
      MakePiece("a.w", Region{{0}, {5000}, std::nullopt}, file.bytes[0].data(), 20000),
      MakePiece("b.w", Region{{0}, {9001}, std::nullopt}, file.bytes[1].data(), 9001)};
  return file;
}

TEST(DataFileStreamTest, AlignedRunsGoDirectWhereTheFilesystemAllowsAndSaySo) {
  const RandomFile file = LargeFile();
  const WholeFile whole = WriteWhole(file, 0);
  const std::string dir = StagingDir("direct");
  absl::StatusOr<std::unique_ptr<DataFileStream>> stream =
      StreamDataInAlignedRuns(file, dir, 0, 8192, /*direct_io=*/true);
  ASSERT_TRUE(stream.ok()) << stream.status();
  if ((*stream)->direct_io_refused()) GTEST_SKIP() << "this filesystem refuses O_DIRECT";
  EXPECT_STREQ((*stream)->io_mode(), "O_DIRECT");
  // Every whole 4 KiB block of the 29001 bytes went direct; the last partial one buffered.
  EXPECT_EQ((*stream)->direct_bytes(), 28672);
  ASSERT_TRUE((*stream)->Finish().ok());
  auto bytes = ReadWholeFile(JoinPath(dir, whole.records.files[0].name()), 1 << 24);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(*bytes == whole.bytes);
}

TEST(DataFileStreamTest, ARefusedODirectFallsBackToBufferedWritesAndSaysSo) {
  const RandomFile file = LargeFile();
  const WholeFile whole = WriteWhole(file, 0);
  const std::string dir = StagingDir("refused");
  SetDirectIoRefusedForTesting(true);
  absl::StatusOr<std::unique_ptr<DataFileStream>> stream =
      StreamDataInAlignedRuns(file, dir, 0, 8192, /*direct_io=*/true);
  SetDirectIoRefusedForTesting(false);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE((*stream)->direct_io_refused());
  EXPECT_STREQ((*stream)->io_mode(), "buffered (O_DIRECT refused)");
  EXPECT_EQ((*stream)->direct_bytes(), 0);
  ASSERT_TRUE((*stream)->Finish().ok());
  auto bytes = ReadWholeFile(JoinPath(dir, whole.records.files[0].name()), 1 << 24);
  ASSERT_TRUE(bytes.ok());
  EXPECT_TRUE(*bytes == whole.bytes);
}

TEST(DataFileStreamTest, AppendDataAfterAppendToTheSamePieceIsRefusedNamingTheTensor) {
  const RandomFile file = LargeFile();
  DataFilePlan without_data = file.plan;
  for (PieceData& p : without_data.pieces) p.data = nullptr;
  absl::StatusOr<std::unique_ptr<DataFileStream>> stream = DataFileStream::Create(
      StagingDir("mixed"), file.tensors, without_data, 0, DataFileStreamOptions());
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Append(0, file.bytes[0].data(), 100).ok());
  absl::Status s = (*stream)->AppendData(file.bytes[0].data(), 100);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("a.w"));
}

// One f32 tensor "big.w" of 4096 elements (16 KiB) in one piece.
struct OnePiece {
  std::vector<TensorMeta> tensors{TensorMeta{"big.w", DType::kF32, {4096}}};
  DataFilePlan plan{0, {MakePiece("big.w", Region{{0}, {4096}, std::nullopt}, nullptr, 16384)}};
  std::string bytes = std::string(16384, 'x');
};

TEST(DataFileStreamTest, FinishRefusesAFileWithBytesMissingNamingTheTensor) {
  const std::string dir = StagingDir("missing");
  OnePiece one;
  auto stream = DataFileStream::Create(dir, one.tensors, one.plan, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Append(0, one.bytes.data(), 1000).ok());
  EXPECT_EQ((*stream)->piece_bytes_left(0), 15384);
  auto finished = (*stream)->Finish();
  EXPECT_EQ(finished.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(finished.status().message(),
              HasSubstr("tensor big.w: 1000 of 16384 bytes written to"));
  EXPECT_THAT(finished.status().message(), HasSubstr("data/r0_0.safetensors"));
}

TEST(DataFileStreamTest, MoreBytesThanThePieceHasAreRefusedNamingTheTensorAndFile) {
  const std::string dir = StagingDir("excess");
  OnePiece one;
  auto stream = DataFileStream::Create(dir, one.tensors, one.plan, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Append(0, one.bytes.data(), 16000).ok());
  absl::Status s = (*stream)->Append(0, one.bytes.data(), 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor big.w: 1000 more bytes for a piece of 16384 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("r0_0.safetensors"));
}

TEST(DataFileStreamTest, APieceOfAnUnknownTensorIsRefusedBeforeTheFileIsCreated) {
  const std::string dir = StagingDir("unknown");
  OnePiece one;
  one.plan.pieces[0].key = "other";
  auto stream = DataFileStream::Create(dir, one.tensors, one.plan, 0);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stream.status().message(), HasSubstr("unknown tensor \"other\""));
  EXPECT_FALSE(PathExists(JoinPath(dir, "data/r0_0.safetensors")));
}

// A real failed write: the process's file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes
// pwrite past it fail with EFBIG midway through the piece.
TEST(DataFileStreamTest, AFailedWriteMidwayNamesTheFileAndTheStreamTakesNoMoreBytes) {
  const std::string dir = StagingDir("efbig");
  OnePiece one;
  auto stream = DataFileStream::Create(dir, one.tensors, one.plan, 0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->Append(0, one.bytes.data(), 4096).ok());
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 8192;  // the header and the first 4096 bytes fit; the rest does not
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  absl::Status s = (*stream)->Append(0, one.bytes.data() + 4096, 8192);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("r0_0.safetensors"));
  EXPECT_FALSE((*stream)->Append(0, one.bytes.data(), 10).ok());
  EXPECT_FALSE((*stream)->Finish().ok());
}

}  // namespace
}  // namespace ckpt
