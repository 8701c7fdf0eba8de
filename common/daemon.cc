#include "common/daemon.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace ckpt {

void TurnOffMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

absl::Status SetUpDaemonLogging(absl::string_view name, absl::string_view level) {
  static constexpr absl::string_view kLevels[] = {"trace", "debug",    "info", "warn",
                                                  "error", "critical", "off"};
  bool known = false;
  for (absl::string_view l : kLevels) known |= (l == level);
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log level \"", level,
                     "\" (expected trace, debug, info, warn, error, critical or off)"));
  }
  auto logger = spdlog::stderr_logger_mt(std::string(name));
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %l %n %v", spdlog::pattern_time_type::utc);
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
  spdlog::flush_on(spdlog::level::trace);
  return absl::OkStatus();
}

namespace {
sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WatchShutdownSignals(std::function<void(int)> on_signal) {
  sigset_t set = ShutdownSignals();
  std::thread([set, on_signal = std::move(on_signal)] {
    int signal_number = 0;
    if (sigwait(&set, &signal_number) == 0) on_signal(signal_number);
  }).detach();
}

absl::StatusOr<int64_t> SetOpenFilesLimit(int64_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  rlim_t soft = limit.rlim_max;
  if (wanted > 0 && (limit.rlim_max == RLIM_INFINITY || static_cast<rlim_t>(wanted) < soft)) {
    soft = static_cast<rlim_t>(wanted);
  }
  if (soft != limit.rlim_cur) {
    rlimit next = limit;
    next.rlim_cur = soft;
    if (setrlimit(RLIMIT_NOFILE, &next) != 0) {
      return absl::InternalError(
          absl::StrCat("setrlimit(RLIMIT_NOFILE, ", soft, "): ", std::strerror(errno)));
    }
  }
  return soft == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(soft);
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::vector<std::string> RepeatedFlagValues(int argc, char** argv, absl::string_view name) {
  std::vector<std::string> values;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (!absl::ConsumePrefix(&arg, name)) continue;
    if (absl::ConsumePrefix(&arg, "=")) {
      values.emplace_back(arg);
    } else if (arg.empty() && i + 1 < argc) {
      values.emplace_back(argv[++i]);
    }
  }
  return values;
}

}  // namespace ckpt
