// Test harness for the services tests: starts real ckpt_coordinator / ckpt_worker /
// trainer_probe processes on loopback (ports picked by the OS and read back from files),
// and kills and reaps every one of them when it goes out of scope, also when a check fails.
// Children die with the test process too (PR_SET_PDEATHSIG).
#ifndef CKPT_TESTS_SERVICES_CLUSTER_H_
#define CKPT_TESTS_SERVICES_CLUSTER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/transport_security.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/test_util.h"

namespace ckpt::testing {

// A child process with stdout and stderr captured in files.
struct Child {
  pid_t pid = -1;
  std::string stdout_path;
  std::string stderr_path;
  bool reaped = false;
  int status = 0;

  std::string Stdout() const;
  std::string Stderr() const;
  // Sends `signal` (SIGKILL by default) and reaps the process.
  void Kill(int signal = 9);
  // True while the process has not exited (reaps it when it has).
  bool Running();
};

// Polls `condition` every 20 ms until it holds or `timeout` passes; returns the last value.
// The default is a hang guard, not a timing check: generous, because CI runs these tests on
// two cores shared with other test processes.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(60));

// A coordinator and workers on loopback. Everything started is killed on destruction.
// Checkpoints may be saved under dir() (the coordinator's --checkpoint_root).
class Cluster {
 public:
  Cluster();
  ~Cluster();

  // Makes a CA and certificates (`ckptctl certs`, into dir()/certs) and has the coordinator,
  // the workers and the cluster's own operator stub use them. Call before StartCoordinator.
  void UseTls();
  // Issues another certificate of the cluster's CA (or of the CA in `ca_dir`, made first if
  // missing); returns its files.
  TlsFiles IssueCertificate(const std::string& role, const std::string& name,
                            const std::string& ca_dir = "");
  // A channel to the coordinator with `files` (plaintext when empty).
  std::shared_ptr<grpc::Channel> CoordinatorChannel(const TlsFiles& files);
  // The operator certificate as ckptctl's flags, --tls-ca=... (none without TLS).
  std::vector<std::string> OperatorFlags() const;
  bool tls() const { return !operator_tls_.empty(); }
  // The certificate the workers present (empty without TLS).
  const TlsFiles& worker_tls() const { return worker_tls_; }

  // Starts the coordinator with extra flags (e.g. "--lease_ms=600") and waits until it serves.
  // Its --state_dir is <dir>/coordinator-state, kept across restarts.
  void StartCoordinator(const std::vector<std::string>& flags);
  // Kills the coordinator with SIGKILL and starts a new one on the same address.
  void RestartCoordinator(const std::vector<std::string>& flags);
  // Workers started from now on run this daemon (a runfile path): "worker/ckpt_worker" (the
  // default, the release daemon) or "worker/ckpt_worker_testing" (with the test hooks of
  // worker/test_hooks_on.cc; list it in the test's data).
  void set_worker_binary(const std::string& runfile) { worker_binary_ = runfile; }
  // Starts worker `local_rank` (socket /tmp/ckpt-t<pid>-w<n>.sock) with extra flags and waits
  // until registered. Returns its index in workers().
  int StartWorker(int local_rank, const std::vector<std::string>& flags = {});
  // Starts any process (killed with the cluster); stdout/stderr go to dir()/<name>.{out,err}.
  Child* Start(const std::vector<std::string>& argv, const std::string& name) {
    return Spawn(argv, name);
  }
  // Starts a trainer_probe connected to worker `worker_index` (path "": dir()/probe).
  Child* StartTrainer(int worker_index, const std::string& job, int rank, int world_size,
                      const std::string& mode, const std::string& path = "",
                      const std::vector<std::string>& extra_args = {});
  // Processes started from now on (daemons, trainers, ckptctl) join the network namespace
  // /var/run/netns/<name> before they exec ("" for this process's own namespace). The
  // multi-host tests (tests/netns_hosts.h) start each host's processes this way.
  void set_network_namespace(const std::string& name) { network_namespace_ = name; }
  // Runs ckptctl with arguments to completion; returns its exit code and fills `out`.
  int RunCkptctl(const std::vector<std::string>& args, std::string* out);

  const std::string& address() const { return address_; }
  // The cluster's scratch directory (removed with the cluster).
  const std::string& dir() const { return dir_; }
  Child& coordinator() { return *children_.at(coordinator_child_); }
  Child& worker(int i) { return *children_.at(workers_.at(i).child); }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  const std::string& worker_socket(int i) const { return workers_.at(i).socket; }
  const std::string& worker_id(int i) const { return workers_.at(i).id; }

  // Every other child's (trainers', ckptctl's) stdout and stderr, each under a heading that
  // says whether it still runs (for failure messages; ClusterLogs includes it).
  std::string ClientLogs();

  pb::GetStatusResponse Status();
  pb::Coordinator::Stub* coordinator_stub() { return coordinator_stub_.get(); }
  std::unique_ptr<pb::Worker::Stub> WorkerStub(int i);

 private:
  Child* Spawn(const std::vector<std::string>& argv, const std::string& name);
  // `files` as the daemons' absl flags, --tls_ca=... (none when empty).
  static std::vector<std::string> DaemonTlsFlags(const TlsFiles& files);

  std::string dir_;                                       // per-cluster scratch directory
  TlsFiles coordinator_tls_, worker_tls_, operator_tls_;  // empty without UseTls()
  std::string address_;
  std::string network_namespace_;  // where Spawn's children run ("": here)
  std::string worker_binary_ = "worker/ckpt_worker";
  int coordinator_child_ = -1;
  struct WorkerEntry {
    int child = -1;
    std::string socket;
    std::string id;
  };
  std::vector<WorkerEntry> workers_;
  std::vector<std::unique_ptr<Child>> children_;
  std::unique_ptr<pb::Coordinator::Stub> coordinator_stub_;
};

// The value after "<key> " on the first stdout line starting with it ("" if none yet).
std::string LineValue(const std::string& text, const std::string& key);

// The coordinator's and every worker's stderr, then every client's output (ClientLogs), each
// under a heading (for failure messages).
std::string ClusterLogs(Cluster& cluster);

// The status entry of worker `id`, or nullptr. Points into `s`: keep `s` alive (not a
// temporary such as FindWorker(cluster.Status(), id)).
const pb::WorkerStatus* FindWorker(const pb::GetStatusResponse& s, const std::string& id);
// Number of live workers in a status.
int LiveWorkers(const pb::GetStatusResponse& s);
// "result <code> <message>" of a trainer_probe; code -1 while it has not printed one.
std::pair<int, std::string> Result(const Child& trainer);
// Whether a trainer_probe printed its result and exited. Wait for this, not only the result,
// before starting another trainer of the same rank on the same worker: the trainer's Goodbye
// comes after its result, and until then the worker refuses a second claim to the rank.
bool Finished(Child& trainer);
// Whether a trainer_probe has printed "shared": its Hello and RegisterTensors have returned.
bool Shared(const Child& trainer);
// Whether the shared-memory segment `name` exists.
bool SegmentExists(const std::string& name);
// Worker i's Status RPC (sessions and their segments).
pb::WorkerStatusResponse WorkerStatus(Cluster& cluster, int i);
// Runs `world` trainer_probes of `job` in `mode` on workers 0..world-1 and waits (WaitFor's
// default at most) until each printed its result and exited, so lines printed after the
// result (a load's "verified") are complete.
std::vector<Child*> RunRanks(Cluster& cluster, const std::string& job, int world,
                             const std::string& mode, const std::string& path,
                             const std::vector<std::string>& extra);
// As RunRanks, rank r on worker workers[r] (world = workers.size()).
std::vector<Child*> RunRanksOn(Cluster& cluster, const std::vector<int>& workers,
                               const std::string& job, const std::string& mode,
                               const std::string& path, const std::vector<std::string>& extra);
// The arguments every client program of the tests starts with: the program's runfile and
// --worker (worker `worker`'s socket), --job, --rank, --world_size.
std::vector<std::string> RankProgramArgs(const Cluster& cluster, const std::string& program,
                                         int worker, const std::string& job, int rank, int world);
// Starts a transfer probe (tests/transfer_probe; list it in the test's data): rank `rank` of
// `world` of `job` on worker `worker`, with `extra` flags. Returns without waiting.
Child* StartTransferProbe(Cluster& cluster, int worker, const std::string& job, int rank, int world,
                          const std::vector<std::string>& extra);
// Whether every transfer probe of `probes` printed the verdict of its k-th receive: the
// "holds <v>" or "mixed ..." line that follows "received <k> ..." (what its tensor holds is
// checked after the receive returns, so wait for this, not for the "received" line).
bool ReceivesJudged(const std::vector<Child*>& probes, int k);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_SERVICES_CLUSTER_H_
