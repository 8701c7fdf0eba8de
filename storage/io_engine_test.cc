#include "storage/io_engine.h"

#include <cstdlib>
#include <random>
#include <string>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checksum.h"
#include "storage/direct_io_refusal.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::vector<uint64_t> BlockHashes(absl::string_view s, int64_t block) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < s.size(); i += block) {
    out.push_back(Xxh3(s.data() + i, std::min<size_t>(block, s.size() - i)));
  }
  return out;
}

// (backend, direct_io)
class IoEngineTest : public ::testing::TestWithParam<std::tuple<IoBackend, bool>> {
 protected:
  IoOptions Options(IoStats* stats) {
    IoOptions o;
    o.backend = std::get<0>(GetParam());
    o.direct_io = std::get<1>(GetParam());
    o.num_threads = 3;
    o.queue_depth = 3;
    o.buffer_bytes = 64 << 10;  // small, so files span many transfers
    o.stats = stats;
    return o;
  }
  void SetUp() override {
    if (std::get<0>(GetParam()) == IoBackend::kUring && !UringAvailable()) {
      GTEST_SKIP() << "io_uring is not available in this environment (kernel or seccomp)";
    }
  }
};

TEST_P(IoEngineTest, WritesAndReadsBackWithStreamingChecksums) {
  const std::string dir = TestDir("roundtrip");
  const std::vector<size_t> sizes = {0, 1, 4095, 4097, 65536, 300001, 3 << 20};
  std::vector<std::string> data;
  for (size_t i = 0; i < sizes.size(); ++i) data.push_back(RandomBytes(sizes[i], i + 1));
  std::vector<FileWrite> files(3);
  for (size_t f = 0; f < files.size(); ++f) {
    files[f].path = JoinPath(dir, "f" + std::to_string(f));
    for (size_t i = f; i < data.size(); i += 2) {
      files[f].segments.push_back(
          {data[i].data(), static_cast<int64_t>(data[i].size()), true, 8192});
    }
  }
  files[2].segments.clear();  // an empty file
  IoStats wstats;
  auto written = WriteFiles(files, Options(&wstats));
  ASSERT_TRUE(written.ok()) << written.status();
  if (std::get<0>(GetParam()) == IoBackend::kUring) {
    EXPECT_EQ(wstats.uring_files, 3);
  } else {
    EXPECT_EQ(wstats.posix_files, 3);
  }
  EXPECT_EQ(wstats.direct_files + (std::get<1>(GetParam()) ? wstats.direct_fallbacks : 0) > 0,
            std::get<1>(GetParam()));

  std::vector<RangeRead> reads;
  std::vector<std::string> got;
  got.reserve(64);
  std::vector<std::string> want;
  for (size_t f = 0; f < files.size(); ++f) {
    const FileWriteResult& r = (*written)[f];
    std::string contents;
    for (size_t s = 0; s < files[f].segments.size(); ++s) {
      const WriteSegment& seg = files[f].segments[s];
      absl::string_view bytes(static_cast<const char*>(seg.data), seg.size);
      EXPECT_EQ(r.checksums[s].blocks, BlockHashes(bytes, 8192));
      EXPECT_EQ(r.checksums[s].xxh3, bytes.size() <= 8192
                                         ? Xxh3(bytes.data(), bytes.size())
                                         : CombineBlockHashes(r.checksums[s].blocks));
      // Whole segment with its checksum, and an odd sub-range verified by blocks.
      got.emplace_back(bytes.size(), '\0');
      want.emplace_back(bytes);
      reads.push_back({files[f].path, static_cast<int64_t>(contents.size()),
                       static_cast<int64_t>(bytes.size()), got.back().data(), true, 8192,
                       r.checksums[s].blocks, "seg"});
      if (bytes.size() > 8192 * 2 + 7) {
        const int64_t begin = 8192, len = static_cast<int64_t>(bytes.size()) - 8192 - 7;
        got.emplace_back(len, '\0');
        want.emplace_back(bytes.substr(begin, len));
        std::vector<uint64_t> expected(r.checksums[s].blocks.begin() + 1,
                                       r.checksums[s].blocks.end());
        // Block-verified reads cover whole blocks; the caller narrows afterwards. Here the
        // read ends 7 bytes early, so verify without the last block and check bytes directly.
        reads.push_back({files[f].path,
                         static_cast<int64_t>(contents.size()) + begin,
                         len,
                         got.back().data(),
                         false,
                         0,
                         {},
                         "sub"});
      }
      contents.append(bytes.data(), bytes.size());
    }
    auto size = FileSize(files[f].path);
    ASSERT_TRUE(size.ok());
    EXPECT_EQ(*size, static_cast<int64_t>(contents.size()));
    EXPECT_EQ(r.size, static_cast<int64_t>(contents.size()));
  }
  // Block-verified read of the 3 MiB segment's blocks 2..end.
  const size_t big = 6;  // data[6] is in file 0 (even indices)
  {
    int64_t off = 0;
    for (size_t i = 0; i < big; i += 2) off += data[i].size();
    const std::vector<uint64_t> all = BlockHashes(data[big], 8192);
    got.emplace_back(data[big].size() - 2 * 8192, '\0');
    want.push_back(data[big].substr(2 * 8192));
    reads.push_back({files[0].path, off + 2 * 8192,
                     static_cast<int64_t>(data[big].size()) - 2 * 8192, got.back().data(), true,
                     8192, std::vector<uint64_t>(all.begin() + 2, all.end()), "blocks"});
  }
  IoStats rstats;
  absl::Status s = ReadRanges(reads, Options(&rstats));
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << "read " << i;
  if (std::get<0>(GetParam()) == IoBackend::kUring) {
    EXPECT_EQ(rstats.uring_files, static_cast<int64_t>(reads.size()));
  }
}

// Aligned memory at aligned file positions (the writer's usual case) mixed with misaligned
// segments: the zero-copy O_DIRECT paths and the staging paths must agree byte for byte.
TEST_P(IoEngineTest, AlignedAndMisalignedSegmentsInterleave) {
  const std::string dir = TestDir("aligned");
  const int64_t kBlock = 4096;
  auto aligned = [](int64_t n) {
    return std::unique_ptr<char, decltype(&std::free)>(
        static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)), &std::free);
  };
  const std::string header = RandomBytes(kBlock, 1);  // like a 4 KiB-padded header
  const std::string odd = RandomBytes(1000, 2);       // breaks alignment
  auto big = aligned(300 * kBlock + 0);
  auto tail = aligned(5 * kBlock + 17);
  const std::string big_s = RandomBytes(300 * kBlock, 3), tail_s = RandomBytes(5 * kBlock + 17, 4);
  std::memcpy(big.get(), big_s.data(), big_s.size());
  std::memcpy(tail.get(), tail_s.data(), tail_s.size());
  const std::string path = JoinPath(dir, "f");
  FileWrite fw{path,
               {{header.data(), kBlock, false, 0},
                {big.get(), 300 * kBlock, true, 0},
                {odd.data(), 1000, true, 0},
                {big.get(), 300 * kBlock, true, 0},
                {tail.get(), 5 * kBlock + 17, true, 0}}};
  auto w = WriteFiles({fw}, Options(nullptr));
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string want = header + big_s + odd + big_s + tail_s;
  ASSERT_EQ((*w)[0].size, static_cast<int64_t>(want.size()));
  EXPECT_EQ((*w)[0].checksums[1].xxh3, Xxh3(big_s.data(), big_s.size()));
  EXPECT_EQ((*w)[0].checksums[4].xxh3, Xxh3(tail_s.data(), tail_s.size()));
  EXPECT_TRUE(*ReadWholeFile(path, 1 << 24) == want);

  // Three concurrent reads into disjoint destinations: aligned (in place), aligned and
  // verified, and a misaligned one through staging.
  auto dest = aligned(600 * kBlock);
  std::string misaligned(1000, '\0');
  std::vector<RangeRead> reads = {{path, 0, 300 * kBlock, dest.get(), false, 0, {}, "prefix"},
                                  {path,
                                   kBlock,
                                   300 * kBlock,
                                   dest.get() + 300 * kBlock,
                                   true,
                                   0,
                                   {(*w)[0].checksums[1].xxh3},
                                   "aligned piece"},
                                  {path,
                                   301 * kBlock,
                                   1000,
                                   misaligned.data(),
                                   true,
                                   0,
                                   {(*w)[0].checksums[2].xxh3},
                                   "odd piece"}};
  ASSERT_TRUE(ReadRanges(reads, Options(nullptr)).ok());
  EXPECT_TRUE(misaligned == odd);
  EXPECT_EQ(std::memcmp(dest.get(), want.data(), 300 * kBlock), 0);
  EXPECT_EQ(std::memcmp(dest.get() + 300 * kBlock, big_s.data(), big_s.size()), 0);
  auto dest2 = aligned(want.size());
  ASSERT_TRUE(ReadRanges({{path,
                           0,
                           static_cast<int64_t>(want.size()),
                           dest2.get(),
                           true,
                           0,
                           {Xxh3(want.data(), want.size())},
                           "all"}},
                         Options(nullptr))
                  .ok());
  EXPECT_EQ(std::memcmp(dest2.get(), want.data(), want.size()), 0);
}

TEST_P(IoEngineTest, CorruptedByteIsReportedWithLabelAndFile) {
  const std::string dir = TestDir("corrupt");
  const std::string data = RandomBytes(200000, 7);
  const std::string path = JoinPath(dir, "x");
  auto w = WriteFiles({{path, {{data.data(), 200000, true, 65536}}}}, Options(nullptr));
  ASSERT_TRUE(w.ok()) << w.status();
  std::string flipped = data;
  flipped[150000] ^= 1;
  ASSERT_TRUE(WriteFileDurably(path, flipped).ok());
  std::string out(200000, '\0');
  absl::Status whole = ReadRanges({{path,
                                    0,
                                    200000,
                                    out.data(),
                                    true,
                                    0,
                                    {Xxh3(data.data(), data.size())},
                                    "tensor \"w\" [0:10]"}},
                                  Options(nullptr));
  EXPECT_EQ(whole.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(whole.message()), HasSubstr("tensor \"w\" [0:10]"));
  EXPECT_THAT(std::string(whole.message()), HasSubstr(path));
  absl::Status blocks =
      ReadRanges({{path, 0, 200000, out.data(), true, 65536, (*w)[0].checksums[0].blocks, "blk"}},
                 Options(nullptr));
  EXPECT_THAT(std::string(blocks.message()), HasSubstr("block 2"));
  // Skipping verification explicitly returns the (corrupted) bytes.
  ASSERT_TRUE(
      ReadRanges({{path, 0, 200000, out.data(), false, 0, {}, "x"}}, Options(nullptr)).ok());
  EXPECT_TRUE(out == flipped);
}

// Many small ranges are read in pipelined batches; every one must land in its own buffer and a
// bad one must be reported under its own label.
TEST_P(IoEngineTest, BatchedSmallReadsLandAndFailIndependently) {
  const std::string dir = TestDir("batched");
  std::vector<std::string> pieces;
  std::vector<FileWrite> files(3);
  for (int i = 0; i < 60; ++i) pieces.push_back(RandomBytes(1000 + 997 * i, 100 + i));
  for (int i = 0; i < 60; ++i) {
    FileWrite& f = files[i % 3];
    f.path = JoinPath(dir, "f" + std::to_string(i % 3));
    f.segments.push_back({pieces[i].data(), static_cast<int64_t>(pieces[i].size()), true, 0});
  }
  auto w = WriteFiles(files, Options(nullptr));
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<RangeRead> reads;
  std::vector<std::string> out(60);
  std::vector<int64_t> offsets(3, 0);
  for (int i = 0; i < 60; ++i) {
    out[i].assign(pieces[i].size(), '\0');
    reads.push_back({files[i % 3].path,
                     offsets[i % 3],
                     static_cast<int64_t>(pieces[i].size()),
                     out[i].data(),
                     true,
                     0,
                     {Xxh3(pieces[i].data(), pieces[i].size())},
                     "piece " + std::to_string(i)});
    offsets[i % 3] += pieces[i].size();
  }
  ASSERT_TRUE(ReadRanges(reads, Options(nullptr)).ok());
  EXPECT_TRUE(out == pieces);
  reads[37].expected = {12345};
  absl::Status bad = ReadRanges(reads, Options(nullptr));
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("piece 37 from"));
}

TEST_P(IoEngineTest, TruncatedAndMissingFilesAreErrors) {
  const std::string dir = TestDir("trunc");
  const std::string path = JoinPath(dir, "short");
  ASSERT_TRUE(WriteFileDurably(path, std::string(10000, 'a')).ok());
  std::string out(20000, '\0');
  absl::Status s =
      ReadRanges({{path, 5000, 6000, out.data(), false, 0, {}, "piece"}}, Options(nullptr));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("truncated"));
  EXPECT_EQ(
      ReadRanges({{JoinPath(dir, "nope"), 0, 1, out.data(), false, 0, {}, "p"}}, Options(nullptr))
          .code(),
      absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, IoEngineTest,
    ::testing::Combine(::testing::Values(IoBackend::kPosix, IoBackend::kUring), ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == IoBackend::kUring ? "Uring" : "Posix") +
             (std::get<1>(info.param) ? "Direct" : "Buffered");
    });

TEST(IoEngineOptionsTest, FallsBackToBufferedWhenODirectIsRefused) {
  const std::string dir = TestDir("refused");
  const std::string data = RandomBytes(100000, 8);
  IoStats stats;
  IoOptions o;
  o.direct_io = true;
  o.stats = &stats;
  SetDirectIoRefusedForTesting(true);
  auto w = WriteFiles({{JoinPath(dir, "f"), {{data.data(), 100000, true, 0}}}}, o);
  std::string out(100000, '\0');
  IoStats rstats;
  o.stats = &rstats;
  absl::Status r = ReadRanges(
      {{JoinPath(dir, "f"), 0, 100000, out.data(), true, 0, {Xxh3(data.data(), 100000)}, "f"}}, o);
  SetDirectIoRefusedForTesting(false);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(r.ok()) << r;
  EXPECT_EQ(stats.direct_fallbacks, 1);
  EXPECT_EQ(stats.direct_files, 0);
  EXPECT_EQ(rstats.direct_fallbacks, 1);
  EXPECT_TRUE(out == data);
}

TEST(IoEngineOptionsTest, RejectsUnalignedBuffers) {
  IoOptions o;
  o.buffer_bytes = 1000;
  EXPECT_EQ(ReadRanges({}, o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(IoEngineOptionsTest, ManySmallFilesWithFewBuffersDoNotDeadlock) {
  const std::string dir = TestDir("many");
  std::vector<std::string> data;
  std::vector<FileWrite> files;
  for (int i = 0; i < 40; ++i) data.push_back(RandomBytes(10000 + i * 1000, i));
  for (int i = 0; i < 40; ++i) {
    files.push_back({JoinPath(dir, std::to_string(i)),
                     {{data[i].data(), static_cast<int64_t>(data[i].size()), true, 0}}});
  }
  IoOptions o;
  o.num_threads = 4;
  o.queue_depth = 1;
  o.buffer_bytes = 4096;
  o.direct_io = true;
  auto w = WriteFiles(files, o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<std::string> out(40);
  std::vector<RangeRead> reads;
  for (int i = 0; i < 40; ++i) {
    out[i].resize(data[i].size());
    reads.push_back({files[i].path,
                     0,
                     static_cast<int64_t>(data[i].size()),
                     out[i].data(),
                     true,
                     0,
                     {(*w)[i].checksums[0].xxh3},
                     "f"});
  }
  ASSERT_TRUE(ReadRanges(reads, o).ok());
  EXPECT_TRUE(out == data);
}

}  // namespace
}  // namespace ckpt
