// Resource use of a process from /proc: resident memory (current and the kernel's peak,
// VmHWM), thread count and CPU seconds (user + system), and a sampler thread that records the
// largest thread count seen. For ckpt_loadgen's reports on the coordinator process.
#ifndef CKPT_TOOLS_LOADGEN_PROC_STATS_H_
#define CKPT_TOOLS_LOADGEN_PROC_STATS_H_

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::loadgen {

// One reading of a process.
struct ProcStats {
  int64_t rss_bytes = 0;       // VmRSS
  int64_t peak_rss_bytes = 0;  // VmHWM: the kernel's high-water mark of RSS
  int64_t threads = 0;         // Threads
  double cpu_seconds = 0;      // utime + stime
};

// Parses the text of /proc/<pid>/status (VmRSS, VmHWM, Threads) and /proc/<pid>/stat (utime,
// stime in clock ticks of `ticks_per_second`). InvalidArgument naming the missing field.
absl::StatusOr<ProcStats> ParseProcStats(absl::string_view status_text, absl::string_view stat_text,
                                         int64_t ticks_per_second);

// The 1-minute load average from the text of /proc/loadavg ("0.52 0.58 0.59 1/123 4567").
// InvalidArgument when the text does not start with a number.
absl::StatusOr<double> ParseLoadAverage(absl::string_view loadavg_text);
// Reads /proc/loadavg; -1 when it cannot be read (the figure is informational).
double ReadLoadAverage();

// The path of the first file mapped in the text of /proc/<pid>/maps whose name starts with
// `library_prefix` (e.g. "libgrpc.so": which gRPC build a process runs); "" when none is.
std::string MappedLibraryPath(absl::string_view maps_text, absl::string_view library_prefix);
// MappedLibraryPath of /proc/<pid>/maps (pid 0: this process); "" when it cannot be read.
std::string ReadMappedLibraryPath(pid_t pid, absl::string_view library_prefix);

// Reads /proc/<pid>/{status,stat}. NotFound when the process is gone.
absl::StatusOr<ProcStats> ReadProcStats(pid_t pid);

// CPU seconds of a process at one time.
struct CpuReading {
  absl::Time at;
  double cpu_seconds = 0;
};

// CPU seconds the process spent between `from` and `to`, from readings in time order: each end
// is interpolated linearly between the readings around it (clamped to the first and last).
// -1 when either end is InfinitePast, `to` precedes `from`, or there are no readings.
double CpuBetween(const std::vector<CpuReading>& readings, absl::Time from, absl::Time to);

// Samples a process every `period` on its own thread; keeps the largest values seen. An
// optional `on_sample` sees every reading (e.g. to stop a run that grows past a memory cap).
class ProcSampler {
 public:
  ProcSampler(pid_t pid, absl::Duration period,
              std::function<void(const ProcStats&)> on_sample = nullptr);
  ~ProcSampler();
  ProcSampler(const ProcSampler&) = delete;
  ProcSampler& operator=(const ProcSampler&) = delete;

  // The peaks since the last ResetPeaks (peak RSS, most threads) and the latest CPU seconds.
  ProcStats Peak() const;
  // The peaks since the sampler started.
  ProcStats AllTimePeak() const;
  // Reads the process now (also updating the peaks); the last good reading if it is gone.
  ProcStats SampleNow();
  // Starts new peaks of RSS and threads from the latest reading (VmHWM stays the kernel's).
  void ResetPeaks();
  // Every reading's time and CPU seconds so far, in time order (for CpuBetween).
  std::vector<CpuReading> CpuTimeline() const;

 private:
  void Record(const ProcStats& s);

  const pid_t pid_;
  const absl::Duration period_;
  std::function<void(const ProcStats&)> on_sample_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  ProcStats peak_;
  ProcStats all_time_peak_;
  ProcStats last_;
  std::vector<CpuReading> timeline_;
  std::thread thread_;
};

}  // namespace ckpt::loadgen

#endif  // CKPT_TOOLS_LOADGEN_PROC_STATS_H_
