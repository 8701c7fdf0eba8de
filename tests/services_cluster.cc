#include "tests/services_cluster.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/grpc_auth.h"
#include "gtest/gtest.h"

namespace ckpt::testing {
namespace {

std::atomic<int> cluster_counter{0};

}  // namespace

std::string Child::Stdout() const { return ReadFile(stdout_path); }
std::string Child::Stderr() const { return ReadFile(stderr_path); }

void Child::Kill(int signal) {
  if (reaped || pid <= 0) return;
  kill(pid, signal);
  if (waitpid(pid, &status, 0) == pid) reaped = true;
}

bool Child::Running() {
  if (reaped || pid <= 0) return false;
  if (waitpid(pid, &status, WNOHANG) == pid) {
    reaped = true;
    return false;
  }
  return true;
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return condition();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

std::string LineValue(const std::string& text, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, key + " ")) return std::string(line);
  }
  return "";
}

std::string ClusterLogs(Cluster& cluster) {
  std::string logs = "coordinator:\n" + cluster.coordinator().Stderr();
  for (int w = 0; w < cluster.num_workers(); ++w) {
    absl::StrAppend(&logs, "\nworker ", w, ":\n", cluster.worker(w).Stderr());
  }
  absl::StrAppend(&logs, cluster.ClientLogs());
  return logs;
}

Cluster::Cluster() {
  // Unix socket paths must stay short (108 bytes), so scratch lives under /tmp.
  dir_ = absl::StrCat("/tmp/ckpt-t", getpid(), "-", cluster_counter++);
  mkdir(dir_.c_str(), 0700);
}

Cluster::~Cluster() {
  // Workers and trainers first, the coordinator last; SIGKILL so nothing can linger.
  for (size_t i = children_.size(); i-- > 0;) children_[i]->Kill(SIGKILL);
  // Under --config=asan/tsan the daemons are sanitized builds too: a report in any of them
  // fails the test (a process that died of one may otherwise pass unnoticed).
  for (const auto& child : children_) {
    const std::string err = child->Stderr();
    for (const char* marker : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                               "WARNING: ThreadSanitizer", "runtime error:"}) {
      size_t at = err.find(marker);
      if (at != std::string::npos) {
        ADD_FAILURE() << child->stderr_path << " holds a sanitizer report:\n"
                      << err.substr(at > 200 ? at - 200 : 0, 12000);
        break;
      }
    }
  }
  for (const WorkerEntry& w : workers_) unlink(w.socket.c_str());
  std::error_code ignored;  // best effort: a test's leftovers must not fail its teardown
  std::filesystem::remove_all(dir_, ignored);
}

Child* Cluster::Spawn(const std::vector<std::string>& argv, const std::string& name) {
  auto child = std::make_unique<Child>();
  child->stdout_path = absl::StrCat(dir_, "/", name, ".out");
  child->stderr_path = absl::StrCat(dir_, "/", name, ".err");
  // Built before fork: the child only makes system calls until it execs.
  const std::string netns =
      network_namespace_.empty() ? "" : "/var/run/netns/" + network_namespace_;
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (!netns.empty()) {
      int ns = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) _exit(126);
      close(ns);
    }
    int out = open(child->stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(child->stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  child->pid = pid;
  children_.push_back(std::move(child));
  return children_.back().get();
}

std::string Cluster::ClientLogs() {
  std::string logs;
  for (int i = 0; i < static_cast<int>(children_.size()); ++i) {
    bool daemon = i == coordinator_child_;
    for (const WorkerEntry& w : workers_) daemon = daemon || i == w.child;
    if (daemon) continue;
    Child& c = *children_[i];
    const bool running = c.Running();
    absl::StrAppend(&logs, "\n", c.stdout_path, " (pid ", c.pid, ", ",
                    running ? "running" : absl::StrCat("exited, wait status ", c.status), "):\n",
                    c.Stdout(), c.Stderr());
  }
  return logs;
}

std::vector<std::string> Cluster::DaemonTlsFlags(const TlsFiles& files) {
  if (files.empty()) return {};
  return {"--tls_ca=" + files.ca, "--tls_cert=" + files.cert, "--tls_key=" + files.key};
}

std::vector<std::string> Cluster::OperatorFlags() const {
  if (operator_tls_.empty()) return {};
  return {"--tls-ca=" + operator_tls_.ca, "--tls-cert=" + operator_tls_.cert,
          "--tls-key=" + operator_tls_.key};
}

TlsFiles Cluster::IssueCertificate(const std::string& role, const std::string& name,
                                   const std::string& ca_dir) {
  const std::string dir = ca_dir.empty() ? dir_ + "/certs" : ca_dir;
  std::string out;
  if (access((dir + "/ca.pem").c_str(), F_OK) != 0) {
    EXPECT_EQ(RunCkptctl({"certs", "init", "--dir", dir}, &out), 0) << out;
  }
  EXPECT_EQ(RunCkptctl({"certs", "issue", "--dir", dir, "--role", role, "--name", name}, &out), 0)
      << out;
  const std::string stem = absl::StrCat(dir, "/", role, "-", name);
  return TlsFiles{dir + "/ca.pem", stem + ".pem", stem + ".key"};
}

void Cluster::UseTls() {
  coordinator_tls_ = IssueCertificate("coordinator", "coord");
  worker_tls_ = IssueCertificate("worker", "host");
  operator_tls_ = IssueCertificate("operator", "ops");
}

std::shared_ptr<grpc::Channel> Cluster::CoordinatorChannel(const TlsFiles& files) {
  absl::StatusOr<TransportSecurity> security =
      ResolveTransportSecurity(files, /*insecure=*/false, address_, "--coordinator", "test");
  EXPECT_TRUE(security.ok()) << security.status();
  return MakeCoordinatorChannel(address_, security.ok() ? *security : TransportSecurity());
}

void Cluster::StartCoordinator(const std::vector<std::string>& flags) {
  std::string address_file = absl::StrCat(dir_, "/coordinator.address");
  std::vector<std::string> argv = {Runfile("coordinator/ckpt_coordinator"),
                                   "--listen=127.0.0.1:0",
                                   "--address_file=" + address_file,
                                   "--log_level=debug",
                                   "--checkpoint_root=" + dir_,
                                   "--state_dir=" + dir_ + "/coordinator-state"};
  for (const std::string& flag : DaemonTlsFlags(coordinator_tls_)) argv.push_back(flag);
  argv.insert(argv.end(), flags.begin(), flags.end());
  unlink(address_file.c_str());
  Child* c = Spawn(argv, absl::StrCat("coordinator", children_.size()));
  coordinator_child_ = static_cast<int>(children_.size()) - 1;
  ASSERT_TRUE(WaitFor([&] { return !ReadFile(address_file).empty() || !c->Running(); }))
      << "coordinator did not start: " << c->Stderr();
  ASSERT_TRUE(c->Running()) << "coordinator exited: " << c->Stderr();
  address_ = std::string(absl::StripAsciiWhitespace(ReadFile(address_file)));
  coordinator_stub_ = pb::Coordinator::NewStub(CoordinatorChannel(operator_tls_));
}

void Cluster::RestartCoordinator(const std::vector<std::string>& flags) {
  coordinator().Kill(SIGKILL);
  std::vector<std::string> all = flags;
  all.push_back("--listen=" + address_);  // after the default: the last --listen wins
  StartCoordinator(all);
}

int Cluster::StartWorker(int local_rank, const std::vector<std::string>& flags) {
  int index = static_cast<int>(workers_.size());
  WorkerEntry entry;
  entry.socket = absl::StrCat(dir_, "/w", index, ".sock");
  std::string ready = absl::StrCat(dir_, "/w", index, ".ready");
  std::vector<std::string> argv = {
      Runfile(worker_binary_),         "--coordinator=" + address_,
      "--listen=unix:" + entry.socket, absl::StrCat("--local_rank=", local_rank),
      "--ready_file=" + ready,         "--log_level=debug",
      "--reap_interval_ms=50"};
  for (const std::string& flag : DaemonTlsFlags(worker_tls_)) argv.push_back(flag);
  argv.insert(argv.end(), flags.begin(), flags.end());
  Child* w = Spawn(argv, absl::StrCat("worker", index));
  entry.child = static_cast<int>(children_.size()) - 1;
  bool up = WaitFor([&] { return !ReadFile(ready).empty() || !w->Running(); });
  EXPECT_TRUE(up && w->Running()) << "worker " << index << " did not register: " << w->Stderr();
  entry.id = std::string(absl::StripAsciiWhitespace(ReadFile(ready)));
  entry.id = entry.id.substr(0, entry.id.find(' '));
  workers_.push_back(entry);
  return index;
}

Child* Cluster::StartTrainer(int worker_index, const std::string& job, int rank, int world_size,
                             const std::string& mode, const std::string& path,
                             const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv =
      RankProgramArgs(*this, "tests/trainer_probe", worker_index, job, rank, world_size);
  for (const std::string& a : {std::string("--mode"), mode, std::string("--path"),
                               path.empty() ? dir_ + "/probe" : path}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  return Spawn(argv, absl::StrCat("trainer-", job, "-", rank, "-", children_.size()));
}

int Cluster::RunCkptctl(const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> argv = {Runfile("tools/ckptctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  Child* c = Spawn(argv, absl::StrCat("ckptctl", children_.size()));
  if (waitpid(c->pid, &c->status, 0) == c->pid) c->reaped = true;
  *out = c->Stdout() + c->Stderr();
  return WIFEXITED(c->status) ? WEXITSTATUS(c->status) : -1;
}

pb::GetStatusResponse Cluster::Status() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  pb::GetStatusResponse response;
  grpc::Status s = coordinator_stub_->GetStatus(&context, pb::GetStatusRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

std::unique_ptr<pb::Worker::Stub> Cluster::WorkerStub(int i) {
  return pb::Worker::NewStub(
      grpc::CreateChannel("unix:" + worker_socket(i), grpc::InsecureChannelCredentials()));
}

const pb::WorkerStatus* FindWorker(const pb::GetStatusResponse& s, const std::string& id) {
  for (const auto& w : s.workers()) {
    if (w.worker_id() == id) return &w;
  }
  return nullptr;
}

int LiveWorkers(const pb::GetStatusResponse& s) {
  int n = 0;
  for (const auto& w : s.workers()) n += w.alive() ? 1 : 0;
  return n;
}

// "result <code> <message>" of a finished trainer; code -1 while it has not printed one.
std::pair<int, std::string> Result(const Child& trainer) {
  std::string value = LineValue(trainer.Stdout(), "result");
  if (value.empty()) return {-1, ""};
  std::pair<std::string, std::string> parts = absl::StrSplit(value, absl::MaxSplits(' ', 1));
  int code = -1;
  (void)absl::SimpleAtoi(parts.first, &code);
  return {code, parts.second};
}

bool Finished(Child& trainer) { return Result(trainer).first >= 0 && !trainer.Running(); }

bool Shared(const Child& trainer) { return trainer.Stdout().find("shared") != std::string::npos; }

bool SegmentExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

pb::WorkerStatusResponse WorkerStatus(Cluster& cluster, int i) {
  auto stub = cluster.WorkerStub(i);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  pb::WorkerStatusResponse response;
  grpc::Status s = stub->Status(&context, pb::WorkerStatusRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

std::vector<Child*> RunRanks(Cluster& cluster, const std::string& job, int world,
                             const std::string& mode, const std::string& path,
                             const std::vector<std::string>& extra) {
  std::vector<int> workers(world);
  for (int r = 0; r < world; ++r) workers[r] = r;
  return RunRanksOn(cluster, workers, job, mode, path, extra);
}

// Runs a trainer of `job` in `mode` per entry of `workers` and waits until each has reported its
// result and exited.
std::vector<Child*> RunRanksOn(Cluster& cluster, const std::vector<int>& workers,
                               const std::string& job, const std::string& mode,
                               const std::string& path, const std::vector<std::string>& extra) {
  std::vector<Child*> ranks;
  const int world = static_cast<int>(workers.size());
  for (int r = 0; r < world; ++r) {
    ranks.push_back(cluster.StartTrainer(workers[r], job, r, world, mode, path, extra));
  }
  // Wait for each trainer to exit, not just for its "result" line: a load's "verified" or
  // "mismatch" line comes after the result, once every element has been checked.
  bool finished = WaitFor([&] {
    for (Child* t : ranks) {
      if (Result(*t).first < 0 || t->Running()) return false;
    }
    return true;
  });
  if (!finished) {
    // What the daemons saw is what explains a stuck rank.
    std::string logs = "coordinator:\n" + cluster.coordinator().Stderr();
    for (int w = 0; w < cluster.num_workers(); ++w) {
      absl::StrAppend(&logs, "\nworker ", w, ":\n", cluster.worker(w).Stderr());
    }
    ADD_FAILURE() << job << ": not every rank finished\n" << logs;
  }
  return ranks;
}

std::vector<std::string> RankProgramArgs(const Cluster& cluster, const std::string& program,
                                         int worker, const std::string& job, int rank, int world) {
  return {Runfile(program),
          "--worker",
          "unix:" + cluster.worker_socket(worker),
          "--job",
          job,
          "--rank",
          absl::StrCat(rank),
          "--world_size",
          absl::StrCat(world)};
}

Child* StartTransferProbe(Cluster& cluster, int worker, const std::string& job, int rank, int world,
                          const std::vector<std::string>& extra) {
  std::vector<std::string> argv =
      RankProgramArgs(cluster, "tests/transfer_probe", worker, job, rank, world);
  argv.insert(argv.end(), extra.begin(), extra.end());
  return cluster.Start(argv, absl::StrCat("probe-", job, "-", rank));
}

bool ReceivesJudged(const std::vector<Child*>& probes, int k) {
  for (const Child* probe : probes) {
    int verdicts = 0;
    for (absl::string_view line : absl::StrSplit(probe->Stdout(), '\n')) {
      verdicts += absl::StartsWith(line, "holds ") || absl::StartsWith(line, "mixed ") ? 1 : 0;
    }
    if (verdicts < k) return false;
  }
  return true;
}

}  // namespace ckpt::testing
