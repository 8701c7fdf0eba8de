#include "storage/s3/testing/s3_test_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "storage/file_util.h"

extern char** environ;

namespace ckpt {
namespace {

constexpr char kPython[] = "/usr/bin/python3";  // Debian's, where python3-swift lives
constexpr char kScript[] = "storage/s3/testing/swift_server.py";
constexpr int kDeadlineExit = 3;  // swift_server.py's DEADLINE_EXIT
constexpr absl::Duration kStopTimeout = absl::Seconds(30);
constexpr absl::Duration kPoll = absl::Milliseconds(20);

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The script through the runfiles (a data dependency), else the workspace (`bazel run`, or a
// binary started from the repository root).
absl::StatusOr<std::string> FindScript() {
  std::vector<std::string> candidates;
  const std::string workspace = Env("TEST_WORKSPACE").empty() ? "ckpt" : Env("TEST_WORKSPACE");
  for (const char* root : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (!Env(root).empty()) candidates.push_back(absl::StrCat(Env(root), "/", workspace));
  }
  if (!Env("BUILD_WORKSPACE_DIRECTORY").empty()) {
    candidates.push_back(Env("BUILD_WORKSPACE_DIRECTORY"));
  }
  candidates.push_back(".");
  for (const std::string& root : candidates) {
    const std::string path = absl::StrCat(root, "/", kScript);
    if (IsFile(path)) return path;
  }
  return absl::NotFoundError(absl::StrCat("S3TestServer: ", kScript, " is not under ",
                                          absl::StrJoin(candidates, ", "),
                                          " (make it a data dependency of the test)"));
}

// What a finished child wrote and how it ended.
struct ScriptResult {
  std::string out;
  std::string err;
  int wait_status = 0;
};

// Reads the child's stdout and stderr until both close or `deadline` passes.
absl::Status DrainPipes(int out_fd, int err_fd, absl::Time deadline, ScriptResult* result) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&result->out, &result->err};
  int open_fds = 2;
  while (open_fds > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("output");
    const int ready = ::poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) return absl::InternalError(std::strerror(errno));
    for (int i = 0; i < 2 && ready > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  return absl::OkStatus();
}

// Waits for `pid` until `deadline` (short polls); SIGKILLs and reaps it when it passes.
absl::Status WaitChild(pid_t pid, absl::Time deadline, int* wait_status) {
  while (true) {
    const pid_t done = ::waitpid(pid, wait_status, WNOHANG);
    if (done == pid) return absl::OkStatus();
    if (done < 0 && errno != EINTR) return absl::InternalError(std::strerror(errno));
    if (absl::Now() > deadline) {
      ::killpg(pid, SIGKILL);  // the script and its launcher: their group (posix_spawn below)
      ::waitpid(pid, wait_status, 0);  // SIGKILL cannot be ignored: this returns
      return absl::DeadlineExceededError("exit");
    }
    absl::SleepFor(kPoll);
  }
}

// Runs `python3 -I swift_server.py args...` to completion within `deadline`.
absl::StatusOr<ScriptResult> RunScript(const std::string& script,
                                       const std::vector<std::string>& args, absl::Time deadline) {
  std::vector<std::string> argv_s = {kPython, "-I", script};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string what = absl::StrCat(kPython, " ", script, " ", absl::StrJoin(args, " "));
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(what + ": pipe failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::InternalError(what + ": pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // a group of its own, killed whole at the deadline
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, kPython, &actions, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  ScriptResult result;
  absl::Status drained = absl::OkStatus();
  if (rc == 0) drained = DrainPipes(out[0], err[0], deadline, &result);
  ::close(out[0]);
  ::close(err[0]);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot start ", kPython, " (", std::strerror(rc),
                     "); Swift and Debian's python3 come from tools/install_deps.sh"));
  }
  absl::Status waited = WaitChild(pid, drained.ok() ? deadline : absl::Now(), &result.wait_status);
  if (!drained.ok() || !waited.ok()) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " did not finish in time; it said: ", result.err));
  }
  if (WIFEXITED(result.wait_status) && WEXITSTATUS(result.wait_status) == kDeadlineExit) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": ", absl::StripTrailingAsciiWhitespace(result.err)));
  }
  if (!WIFEXITED(result.wait_status) || WEXITSTATUS(result.wait_status) != 0) {
    return absl::InternalError(absl::StrCat(what, " failed (wait status ", result.wait_status,
                                            "): ", absl::StripTrailingAsciiWhitespace(result.err)));
  }
  return result;
}

// The JSON line `start` and `start-proxy` print.
struct ServerInfo {
  std::string endpoint, region, access_key_id, secret_access_key, log_dir;
};

absl::StatusOr<ServerInfo> ParseInfo(const std::string& out, const std::string& what) {
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ServerInfo info;
  const std::pair<const char*, std::string*> fields[] = {
      {"endpoint", &info.endpoint},
      {"region", &info.region},
      {"access_key_id", &info.access_key_id},
      {"secret_access_key", &info.secret_access_key},
      {"log_dir", &info.log_dir}};
  for (const auto& [key, field] : fields) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_string()) {
      return absl::InternalError(
          absl::StrCat(what, " printed no JSON line with a string \"", key, "\": ", out));
    }
    *field = j[key].get<std::string>();
  }
  return info;
}

absl::StatusOr<std::string> MakeTempDir() {
  const std::string base = Env("TEST_TMPDIR").empty() ? "/tmp" : Env("TEST_TMPDIR");
  std::string templ = absl::StrCat(base, "/s3_test_server.XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("S3TestServer: mkdtemp ", templ, ": ", std::strerror(errno)));
  }
  return templ;
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3TestServer>> S3TestServer::Start(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::string> script = FindScript();
  if (!script.ok()) return script.status();
  absl::StatusOr<std::string> dir = MakeTempDir();
  if (!dir.ok()) return dir.status();
  std::unique_ptr<S3TestServer> server(new S3TestServer());
  server->script_ = *std::move(script);
  server->dir_ = *std::move(dir);
  const std::string swift_dir = server->dir_ + "/swift";
  server->log_dir_ = swift_dir + "/logs";
  // The script's own deadline comes first, so it stops the servers it started and says why.
  const absl::Duration margin = std::min(absl::Seconds(5), timeout / 4);
  const double script_timeout_s = std::max(0.1, absl::ToDoubleSeconds(timeout - margin));
  absl::StatusOr<ScriptResult> ran =
      RunScript(server->script_,
                {"start", "--dir", swift_dir, "--timeout", absl::StrCat(script_timeout_s),
                 "--owner-pid", absl::StrCat(::getpid())},
                deadline);
  absl::StatusOr<ServerInfo> info =
      ran.ok() ? ParseInfo(ran->out, "swift_server.py start") : ran.status();
  if (!info.ok()) {
    server->keep_dir_ = true;  // the error names its logs
    return absl::Status(info.status().code(),
                        absl::StrCat("S3TestServer: Swift did not start (deadline ",
                                     absl::FormatDuration(timeout), "): ", info.status().message(),
                                     " (the servers' logs: ", server->log_dir_, ")"));
  }
  server->endpoint_ = info->endpoint;
  server->region_ = info->region;
  server->access_key_id_ = info->access_key_id;
  server->secret_access_key_ = info->secret_access_key;
  return server;
}

S3TestServer::~S3TestServer() {
  // No server.json: the script started nothing (Swift missing, say), so nothing to stop.
  absl::StatusOr<ScriptResult> stopped = ScriptResult();
  if (IsFile(dir_ + "/swift/server.json")) {
    stopped = RunScript(script_, {"stop", "--dir", dir_ + "/swift"}, absl::Now() + kStopTimeout);
  }
  if (!stopped.ok()) {
    // The servers also exit by themselves once this process has (--owner-pid).
    fprintf(stderr, "S3TestServer: %s\n", std::string(stopped.status().message()).c_str());
  }
  const absl::Status removed = keep_dir_ ? absl::OkStatus() : RemoveTree(dir_);
  if (!removed.ok()) {
    fprintf(stderr, "S3TestServer: %s\n", std::string(removed.message()).c_str());
  }
}

S3TestServer& S3TestServer::Shared() {
  static S3TestServer* server = [] {
    absl::StatusOr<std::unique_ptr<S3TestServer>> started = Start();
    if (!started.ok()) {
      std::fprintf(stderr, "S3TestServer::Shared: %s\n", started.status().ToString().c_str());
      std::abort();
    }
    return started->release();
  }();
  return *server;
}

S3TestServer& S3TestServer::SharedWithBucket(const std::string& bucket) {
  S3TestServer& server = Shared();
  server.ExportAwsEnvironment();
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(server.ClientOptions());
  absl::Status made = client.ok() ? (*client)->CreateBucket(bucket, absl::Now() + absl::Seconds(60))
                                  : client.status();
  if (!made.ok() && made.code() != absl::StatusCode::kAlreadyExists) {
    std::fprintf(stderr, "S3TestServer::SharedWithBucket(%s): %s\n", bucket.c_str(),
                 made.ToString().c_str());
    std::abort();
  }
  return server;
}

S3ClientOptions S3TestServer::ClientOptions() const {
  S3ClientOptions options;
  options.endpoint = endpoint_;
  options.region = region_;
  options.credentials = {access_key_id_, secret_access_key_, ""};
  return options;
}

void S3TestServer::ExportAwsEnvironment() const {
  ::setenv("AWS_ACCESS_KEY_ID", access_key_id_.c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", secret_access_key_.c_str(), 1);
  ::setenv("AWS_REGION", region_.c_str(), 1);
  ::setenv("AWS_ENDPOINT_URL", endpoint_.c_str(), 1);
  ::unsetenv("AWS_PROFILE");
}

absl::Status S3TestServer::KillServer(absl::string_view server) {
  absl::StatusOr<ScriptResult> ran =
      RunScript(script_, {"kill-server", "--dir", dir_ + "/swift", "--server", std::string(server)},
                absl::Now() + kStopTimeout);
  if (!ran.ok()) {
    return absl::Status(ran.status().code(),
                        absl::StrCat("S3TestServer::KillServer(", server,
                                     "): ", ran.status().message(), " (logs: ", log_dir_, ")"));
  }
  return absl::OkStatus();
}

absl::Status S3TestServer::RestartServer(absl::string_view server) {
  const absl::Duration timeout = absl::Seconds(60);
  absl::StatusOr<ScriptResult> ran =
      RunScript(script_,
                {"start-server", "--dir", dir_ + "/swift", "--server", std::string(server),
                 "--timeout", "55", "--owner-pid", absl::StrCat(::getpid())},
                absl::Now() + timeout);
  const std::string what = absl::StrCat("S3TestServer::RestartServer(", server, ")");
  absl::StatusOr<ServerInfo> info =
      ran.ok() ? ParseInfo(ran->out, "swift_server.py start-server") : ran.status();
  if (!info.ok()) {
    return absl::Status(info.status().code(), absl::StrCat(what, ": ", info.status().message(),
                                                           " (logs: ", log_dir_, ")"));
  }
  if (info->endpoint != endpoint_) {
    return absl::InternalError(
        absl::StrCat(what, ": the proxy is at ", info->endpoint, ", not ", endpoint_));
  }
  return absl::OkStatus();
}

absl::Status S3TestServer::KillProxy() { return KillServer("proxy"); }

absl::Status S3TestServer::RestartProxy() { return RestartServer("proxy"); }

}  // namespace ckpt
