#include "tools/loadgen/proc_stats.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace ckpt::loadgen {
namespace {

TEST(ProcStatsTest, ParsesStatusAndStatIncludingNamesWithSpacesAndParentheses) {
  const char* status = "Name:\tckpt_coord\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t17\n";
  // pid (comm) state ppid ... utime (14th) stime (15th)
  const char* stat = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0\n";
  absl::StatusOr<ProcStats> s = ParseProcStats(status, stat, 100);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->rss_bytes, 1024 * 1024);
  EXPECT_EQ(s->peak_rss_bytes, 2048 * 1024);
  EXPECT_EQ(s->threads, 17);
  EXPECT_DOUBLE_EQ(s->cpu_seconds, 4.0);
}

TEST(ProcStatsTest, MappedLibraryPathFindsTheFirstMappingOfTheLibraryByItsFileName) {
  const char* maps =
      "55d0c000-55d0d000 r--p 00000000 08:01 123 /usr/bin/ckpt_coordinator\n"
      "7f00a000-7f00b000 r--p 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libgrpc++.so.1.51\n"
      "7f00c000-7f00d000 rw-p 00000000 00:00 0 \n"
      "7f00e000-7f00f000 r--p 00000000 08:01 789 /usr/local/lib/ckpt-grpc/libgrpc.so.29.0.0\n"
      "7f010000-7f011000 r-xp 00001000 08:01 789 /usr/local/lib/ckpt-grpc/libgrpc.so.29.0.0\n"
      "7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]\n";
  EXPECT_EQ(MappedLibraryPath(maps, "libgrpc.so"), "/usr/local/lib/ckpt-grpc/libgrpc.so.29.0.0");
  EXPECT_EQ(MappedLibraryPath(maps, "libgrpc++.so"), "/usr/lib/x86_64-linux-gnu/libgrpc++.so.1.51");
  EXPECT_EQ(MappedLibraryPath(maps, "libgloo.so"), "");
  EXPECT_EQ(MappedLibraryPath("", "libgrpc.so"), "");
}

TEST(ProcStatsTest, ThisProcessMapsTheCLibrary) {
  EXPECT_NE(ReadMappedLibraryPath(/*pid=*/0, "libc.so").find("libc.so"), std::string::npos);
}

TEST(ProcStatsTest, NamesTheMissingField) {
  absl::StatusOr<ProcStats> s = ParseProcStats("VmRSS: 1 kB\n", "1 (x) S 0", 100);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("VmHWM"), std::string::npos) << s.status();
}

TEST(ProcStatsTest, ParsesTheOneMinuteLoadAverageAndRefusesText) {
  absl::StatusOr<double> load = ParseLoadAverage("7.52 8.58 6.65 9/332 26679\n");
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_DOUBLE_EQ(*load, 7.52);
  EXPECT_EQ(ParseLoadAverage("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLoadAverage("busy 1 2").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_GE(ReadLoadAverage(), 0);  // this machine's /proc/loadavg
}

TEST(ProcStatsTest, CpuBetweenInterpolatesReadingsAndRefusesUnknownEnds) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<CpuReading> readings = {
      {t0, 10.0}, {t0 + absl::Seconds(1), 11.0}, {t0 + absl::Seconds(3), 15.0}};
  // 0.5 s -> 10.5; 2 s -> 13.0 (halfway from 11 to 15).
  EXPECT_DOUBLE_EQ(CpuBetween(readings, t0 + absl::Milliseconds(500), t0 + absl::Seconds(2)), 2.5);
  // Clamped at both ends.
  EXPECT_DOUBLE_EQ(CpuBetween(readings, t0 - absl::Seconds(5), t0 + absl::Seconds(9)), 5.0);
  EXPECT_EQ(CpuBetween(readings, absl::InfinitePast(), t0), -1);
  EXPECT_EQ(CpuBetween(readings, t0 + absl::Seconds(2), t0), -1);
  EXPECT_EQ(CpuBetween({}, t0, t0 + absl::Seconds(1)), -1);
}

TEST(ProcStatsTest, SamplerSeesThisProcess) {
  ProcSampler sampler(getpid(), absl::Milliseconds(5));
  ProcStats now = sampler.SampleNow();
  EXPECT_GT(now.rss_bytes, 0);
  EXPECT_GE(sampler.Peak().threads, 2);  // this thread and the sampler's
  EXPECT_GE(sampler.AllTimePeak().peak_rss_bytes, now.rss_bytes);
  EXPECT_GE(sampler.CpuTimeline().size(), 2u);  // at construction and SampleNow
  EXPECT_FALSE(ReadProcStats(-5).ok());
}

}  // namespace
}  // namespace ckpt::loadgen
