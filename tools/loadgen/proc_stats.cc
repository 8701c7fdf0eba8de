#include "tools/loadgen/proc_stats.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ckpt::loadgen {
namespace {

// The value of "Name:   123 kB" lines (kB scaled to bytes); false when absent.
bool StatusField(absl::string_view text, absl::string_view name, int64_t* value) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, ":")) continue;
    line = absl::StripAsciiWhitespace(line);
    const bool kb = absl::ConsumeSuffix(&line, " kB");
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), value)) return false;
    if (kb) *value *= 1024;
    return true;
  }
  return false;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<ProcStats> ParseProcStats(absl::string_view status_text, absl::string_view stat_text,
                                         int64_t ticks_per_second) {
  ProcStats s;
  for (auto [name, field] : {std::pair<const char*, int64_t*>{"VmRSS", &s.rss_bytes},
                             {"VmHWM", &s.peak_rss_bytes},
                             {"Threads", &s.threads}}) {
    if (!StatusField(status_text, name, field)) {
      return absl::InvalidArgumentError(absl::StrCat("/proc status has no ", name, " line"));
    }
  }
  // The command name (field 2) may hold spaces and parentheses: fields count from the last ')'.
  const size_t close = stat_text.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc stat has no command name");
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat_text.substr(close + 1), ' ', absl::SkipEmpty());
  // After the name: state is field 3, utime field 14, stime field 15 (1-based, proc(5)).
  int64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return absl::InvalidArgumentError("/proc stat has no utime/stime");
  }
  s.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(ticks_per_second);
  return s;
}

absl::StatusOr<double> ParseLoadAverage(absl::string_view loadavg_text) {
  std::vector<absl::string_view> fields =
      absl::StrSplit(loadavg_text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  double one_minute = 0;
  if (fields.empty() || !absl::SimpleAtod(fields[0], &one_minute)) {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/loadavg: no load average in '", loadavg_text.substr(0, 40), "'"));
  }
  return one_minute;
}

double ReadLoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<double> load = ParseLoadAverage(text.str());
  return load.ok() ? *load : -1;
}

std::string MappedLibraryPath(absl::string_view maps_text, absl::string_view library_prefix) {
  for (absl::string_view line : absl::StrSplit(maps_text, '\n')) {
    // "address perms offset dev inode   path": the path starts at the first '/' (no field
    // before it holds one).
    const size_t slash = line.find('/');
    if (slash == absl::string_view::npos) continue;
    const absl::string_view path = line.substr(slash);
    const size_t name = path.rfind('/') + 1;
    if (absl::StartsWith(path.substr(name), library_prefix)) return std::string(path);
  }
  return "";
}

std::string ReadMappedLibraryPath(pid_t pid, absl::string_view library_prefix) {
  const std::string maps =
      ReadAll(pid == 0 ? std::string("/proc/self/maps") : absl::StrCat("/proc/", pid, "/maps"));
  return MappedLibraryPath(maps, library_prefix);
}

absl::StatusOr<ProcStats> ReadProcStats(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid);
  const std::string status = ReadAll(dir + "/status");
  const std::string stat = ReadAll(dir + "/stat");
  if (status.empty() || stat.empty()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " is gone"));
  }
  return ParseProcStats(status, stat, sysconf(_SC_CLK_TCK));
}

ProcSampler::ProcSampler(pid_t pid, absl::Duration period,
                         std::function<void(const ProcStats&)> on_sample)
    : pid_(pid), period_(period), on_sample_(std::move(on_sample)) {
  SampleNow();
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, absl::ToChronoNanoseconds(period_));
      if (stopping_) break;
      lock.unlock();
      SampleNow();
      lock.lock();
    }
  });
}

ProcSampler::~ProcSampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProcSampler::Record(const ProcStats& s) {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = s;
  timeline_.push_back(CpuReading{absl::Now(), s.cpu_seconds});
  peak_.rss_bytes = std::max(peak_.rss_bytes, s.rss_bytes);
  peak_.peak_rss_bytes = std::max(peak_.peak_rss_bytes, s.peak_rss_bytes);
  peak_.threads = std::max(peak_.threads, s.threads);
  peak_.cpu_seconds = s.cpu_seconds;
  all_time_peak_.rss_bytes = std::max(all_time_peak_.rss_bytes, s.rss_bytes);
  all_time_peak_.peak_rss_bytes = std::max(all_time_peak_.peak_rss_bytes, s.peak_rss_bytes);
  all_time_peak_.threads = std::max(all_time_peak_.threads, s.threads);
  all_time_peak_.cpu_seconds = s.cpu_seconds;
}

ProcStats ProcSampler::SampleNow() {
  absl::StatusOr<ProcStats> s = ReadProcStats(pid_);
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  Record(*s);
  if (on_sample_) on_sample_(*s);
  return *s;
}

void ProcSampler::ResetPeaks() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_.rss_bytes = last_.rss_bytes;
  peak_.threads = last_.threads;
}

std::vector<CpuReading> ProcSampler::CpuTimeline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeline_;
}

namespace {

// CPU seconds at `t`, interpolated between the readings around it.
double CpuAt(const std::vector<CpuReading>& readings, absl::Time t) {
  auto after = std::lower_bound(readings.begin(), readings.end(), t,
                                [](const CpuReading& r, absl::Time x) { return r.at < x; });
  if (after == readings.begin()) return readings.front().cpu_seconds;
  if (after == readings.end()) return readings.back().cpu_seconds;
  const CpuReading& before = *(after - 1);
  const double span = absl::ToDoubleSeconds(after->at - before.at);
  if (span <= 0) return after->cpu_seconds;
  const double f = absl::ToDoubleSeconds(t - before.at) / span;
  return before.cpu_seconds + f * (after->cpu_seconds - before.cpu_seconds);
}

}  // namespace

double CpuBetween(const std::vector<CpuReading>& readings, absl::Time from, absl::Time to) {
  if (readings.empty() || from == absl::InfinitePast() || to == absl::InfinitePast() || to < from) {
    return -1;
  }
  return CpuAt(readings, to) - CpuAt(readings, from);
}

ProcStats ProcSampler::AllTimePeak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_time_peak_;
}

ProcStats ProcSampler::Peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

}  // namespace ckpt::loadgen
