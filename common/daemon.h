// Process plumbing shared by the ckpt daemons (coordinator, worker): structured logging
// setup and clean shutdown on SIGINT/SIGTERM.
#ifndef CKPT_COMMON_DAEMON_H_
#define CKPT_COMMON_DAEMON_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// Sends spdlog output to stderr as "<UTC time> <level> <name> key=value ..." lines at the
// given level ("trace", "debug", "info", "warn", "error", "critical", "off").
// InvalidArgument naming the valid levels otherwise.
absl::Status SetUpDaemonLogging(absl::string_view name, absl::string_view level);

// Blocks SIGINT and SIGTERM in the calling thread and every thread it creates afterwards.
// Call first in main, before any thread (gRPC's included) starts.
void BlockShutdownSignals();

// Turns off absl::Mutex's deadlock detection, which Debian's Abseil (built without NDEBUG) runs
// on every lock of every absl::Mutex, gRPC's included: a graph update per lock that took ~2.4 %
// of the coordinator's CPU at 20k ranks, and an abort of the whole process on any lock order
// that merely looks inverted (common/daemon_test shows it). The daemons' own locks are std::mutex,
// checked by thread-safety annotations and TSan instead. Call first in main, before any thread
// starts.
void TurnOffMutexDeadlockDetection();

// Starts a detached thread that waits for SIGINT or SIGTERM (blocked by BlockShutdownSignals)
// and then calls `on_signal(signal_number)` once.
void WatchShutdownSignals(std::function<void(int)> on_signal);

// Sets the soft RLIMIT_NOFILE to `wanted` (0: to the hard limit), never above the hard limit,
// and returns the soft limit now in force. A daemon that keeps the usual soft limit of 1024
// runs out of descriptors long before its connection budget (common/budgeted_listener.h) does.
absl::StatusOr<int64_t> SetOpenFilesLimit(int64_t wanted);

// This machine's host name ("localhost" if it cannot be read).
std::string HostName();

// Every value of a flag that may be repeated ("--name=v", "--name v", "-name=v", "-name v"),
// in order, up to a "--" argument. Absl flags keep only the last occurrence.
std::vector<std::string> RepeatedFlagValues(int argc, char** argv, absl::string_view name);

}  // namespace ckpt

#endif  // CKPT_COMMON_DAEMON_H_
