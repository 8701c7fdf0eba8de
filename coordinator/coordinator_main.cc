// ckpt_coordinator: the coordinator daemon. Serves ckpt.pb.Coordinator (workers, jobs,
// operations) and ckpt.pb.Rendezvous (the data plane's key-value store) on one address.
//
//   ckpt_coordinator --checkpoint_root DIR [--checkpoint_root DIR ...]
//                    [--listen 0.0.0.0:7400] [--tls_ca F --tls_cert F --tls_key F | --insecure]
//                    [--lease_ms 10000] [--arrival_deadline_ms 60000]
//                    [--execution_deadline_ms 1800000] [--log_level info] [--address_file F]
//                    [--state_dir DIR]
//
// With --state_dir, the staging directory of every save and reshard in flight is journaled
// there (fsynced) before it is created; a coordinator starting on the same directory removes the
// incomplete staging directories its crashed predecessor left, logging each with its size.
// Without it they stay until `ckptctl gc` removes them.
//
// Callers are authenticated by TLS client certificates when --tls_* are given (their role
// decides what they may call; docs/services.md, Security). Without certificates the daemon
// refuses to listen beyond loopback unless --insecure is given. Checkpoint paths callers name
// must lie under a --checkpoint_root (a directory, or an object-store URL s3://bucket[/prefix]
// under which s3:// checkpoints may be named; common/checkpoint_roots.h).
//
// With port 0 the OS picks a free port; the address actually bound is printed on stdout as
// "ckpt_coordinator listening on HOST:PORT" (and written to --address_file when given).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/allocator.h"
#include "common/budgeted_listener.h"
#include "common/checkpoint_roots.h"
#include "common/daemon.h"
#include "common/durable_file.h"
#include "common/grpc_auth.h"
#include "common/memory_path.h"
#include "common/transport_security.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/load_exchange.h"
#include "coordinator/memory_catalog.h"
#include "coordinator/memory_kinds.h"
#include "coordinator/persist_driver.h"
#include "coordinator/reshard_commit.h"
#include "coordinator/save_commit.h"
#include "coordinator/staging_journal.h"
#include "coordinator/transfer_kinds.h"
#include "coordinator/transfer_registry.h"
#include "proto/wire_names.h"
#include "rendezvous/kv_store.h"
#include "rendezvous/rendezvous_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:7400", "host:port to serve on (port 0: pick a free one)");
ABSL_FLAG(int64_t, lease_ms, 10000, "a worker that misses heartbeats this long is declared dead");
ABSL_FLAG(int64_t, arrival_deadline_ms, 60000,
          "every rank must join an operation within this long of its start");
ABSL_FLAG(int64_t, execution_deadline_ms, 1800000,
          "planning + executing an operation must finish within this long");
ABSL_FLAG(int64_t, tick_ms, 100, "how often leases and deadlines are checked");
ABSL_FLAG(std::string, load_algorithm, "auto",
          "exchange algorithm of loads whose trainers ask for none: auto (direct when every rank "
          "is on one host, else broadcast), broadcast, overlap_all_to_all, gather_rounds, "
          "gather_object, or direct (every rank reads what it needs itself)");
ABSL_FLAG(int64_t, load_memory_budget_bytes, int64_t{1} << 30,
          "bytes in flight per rank and wave of a load whose trainers give no budget");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, address_file, "",
          "when set, the bound host:port is written here (atomically) once serving");
ABSL_FLAG(std::string, checkpoint_root, "",
          "a directory (absolute) or object-store URL (s3://bucket[/prefix]) under which "
          "callers may save, load and reshard checkpoints (repeat the flag for several; at "
          "least one is required)");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate (PEM) every caller's certificate must chain to");
ABSL_FLAG(std::string, tls_cert, "",
          "this coordinator's certificate (PEM; ckptctl certs issue --role coordinator)");
ABSL_FLAG(std::string, tls_key, "", "this coordinator's private key (PEM, mode 0600)");
ABSL_FLAG(bool, insecure, false,
          "serve without TLS on an address beyond loopback: anyone who reaches it may save, "
          "load and reshard (not recommended)");
ABSL_FLAG(int64_t, rendezvous_max_keys_per_job, 65536,
          "keys one operation's rendezvous (a job runs one at a time) may hold");
ABSL_FLAG(int64_t, rendezvous_max_value_bytes, int64_t{8} << 20,
          "largest rendezvous value (a Gloo address list takes ~200 bytes per rank)");
ABSL_FLAG(int64_t, rendezvous_max_bytes_per_job, int64_t{1} << 30,
          "bytes (keys + values) one operation's rendezvous may hold (Gloo's full mesh needs "
          "~200 x ranks^2)");
ABSL_FLAG(int, memory_replicas, 1,
          "extra copies of every data file of a memory save (mem://<name>), each kept by a "
          "worker on another host than the file's writer (0: none)");
ABSL_FLAG(int, memory_keep, 2,
          "memory checkpoints kept: the catalog forgets, and the workers evict, older ones once "
          "a newer one is committed (at least 1)");
ABSL_FLAG(int64_t, description_cache_bytes, int64_t{2} << 30,
          "memory for the ranks' kept state descriptions, so that repeat operations with an "
          "unchanged layout send only a digest (least recently used jobs are dropped past it; "
          "0: keep none)");
ABSL_FLAG(int64_t, piece_list_wait_ms, 2000,
          "ranks that describe their pieces by reference to a layout class another rank was "
          "asked to describe in full wait this long for it; then the first waiting call is "
          "asked in its place and the others wait on (never past half of what is left of "
          "their RPC's deadline, then they send theirs in full)");
ABSL_FLAG(int64_t, max_reshard_ranks_per_worker, 1024,
          "a cluster reshard (ckptctl reshard --coordinator) places at most this many target "
          "ranks on each live worker; a larger target layout is refused up front");
ABSL_FLAG(int64_t, max_workers_per_identity, 16384,
          "workers one caller identity (worker certificate; without TLS, peer address) may "
          "hold registered, live or dead and not yet forgotten (docs/services.md, Request "
          "bounds)");
ABSL_FLAG(int64_t, max_jobs_per_identity, 1024,
          "jobs with attached ranks that one caller identity's workers may have created");
ABSL_FLAG(int64_t, dead_worker_retention_ms, 600000,
          "a dead worker stays listed (ckptctl status) this long after its lease expired");
ABSL_FLAG(int64_t, max_dead_workers, 1024,
          "at most this many dead workers stay listed; the longest dead are forgotten first");
ABSL_FLAG(int, transfer_keep_versions, 2,
          "live transfer: published versions of each name kept receivable (at least 1), by "
          "the catalog and by the source workers (per name, apart from --memory_keep)");
ABSL_FLAG(std::string, state_dir, "",
          "directory journaling the staging directories of saves, reshards and background "
          "persistences in flight, so that a "
          "restarted coordinator removes what a crashed one left (one coordinator per directory)");

ABSL_FLAG(int64_t, max_connections, 0,
          "connections the coordinator keeps open in all (0: its open-files limit less an "
          "eighth); past it a newcomer from a lighter peer replaces the heaviest peer's oldest "
          "connection, others are refused (docs/services.md, Connection budget)");
ABSL_FLAG(int64_t, max_connections_per_peer, 1024,
          "connections one peer address may keep open; more are refused at once");
ABSL_FLAG(int64_t, connection_idle_ms, 300000,
          "a connection with no call in flight this long is closed (clients reconnect)");
ABSL_FLAG(int64_t, handshake_timeout_ms, 30000,
          "a connection that has not completed its TLS and HTTP/2 handshake this long is closed");
ABSL_FLAG(int64_t, max_streams_per_connection, 0,
          "concurrent calls (streams) per connection (0: gRPC's default, unlimited)");
ABSL_FLAG(int64_t, max_open_files, 0,
          "the soft open-files limit (RLIMIT_NOFILE) to run with (0: the hard limit)");

namespace {

constexpr int kMaxMessageBytes = 1 << 30;

int Fail(absl::string_view message) {
  std::fprintf(stderr, "ckpt_coordinator: %s\n", std::string(message).c_str());
  return 2;
}

ckpt::KvLimits RendezvousLimits() {
  ckpt::KvLimits limits;
  limits.max_keys_per_group =
      static_cast<size_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_rendezvous_max_keys_per_job)));
  limits.max_value_bytes =
      static_cast<size_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_rendezvous_max_value_bytes)));
  limits.max_bytes_per_group =
      static_cast<size_t>(std::max<int64_t>(1, absl::GetFlag(FLAGS_rendezvous_max_bytes_per_job)));
  return limits;
}

// Opens the staging journal of --state_dir (nullptr without one) and removes what an earlier
// coordinator process left behind, logging each leftover with its size.
absl::StatusOr<std::unique_ptr<ckpt::coordinator::StagingJournal>> OpenStagingJournal() {
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) {
    spdlog::warn(
        "no_state_dir staging directories of saves and reshards cut short by a coordinator crash "
        "are not removed at the next start (set --state_dir, or remove them with ckptctl gc)");
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<ckpt::coordinator::StagingJournal>> journal =
      ckpt::coordinator::StagingJournal::Open(state_dir);
  if (!journal.ok()) return journal.status();
  for (const ckpt::coordinator::StagingLeftover& l : (*journal)->Recover()) {
    if (l.removed) {
      spdlog::warn("staging_removed path={} bytes={} writer_pid={} reason=\"{}\"", l.path, l.bytes,
                   l.writer_pid, l.detail);
    } else {
      spdlog::error("staging_kept path={} bytes={} writer_pid={} reason=\"{}\"", l.path, l.bytes,
                    l.writer_pid, l.detail);
    }
  }
  return journal;
}

// What the flags ask for, checked.
struct Settings {
  std::string listen;  // host:port as given
  std::string host;    // its host part
  ckpt::TransportSecurity security;
  ckpt::coordinator::CoordinatorOptions options;
  ckpt::coordinator::LoadPlannerOptions load_defaults;
};

// Reads and checks the flags into *out: nullopt to go on, else the exit code after printing
// the refusal.
std::optional<int> ReadSettings(const std::vector<std::string>& checkpoint_roots, Settings* out) {
  for (int64_t v : {absl::GetFlag(FLAGS_lease_ms), absl::GetFlag(FLAGS_arrival_deadline_ms),
                    absl::GetFlag(FLAGS_execution_deadline_ms), absl::GetFlag(FLAGS_tick_ms)}) {
    if (v <= 0) return Fail("deadlines, lease and tick must be positive");
  }
  out->listen = absl::GetFlag(FLAGS_listen);
  const size_t colon = out->listen.rfind(':');
  int port_ignored = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(out->listen.substr(colon + 1), &port_ignored)) {
    return Fail(absl::StrCat("--listen must be host:port, got \"", out->listen, "\""));
  }
  out->host = out->listen.substr(0, colon);
  absl::StatusOr<ckpt::CheckpointRoots> roots = ckpt::CheckpointRoots::Create(checkpoint_roots);
  if (!roots.ok()) return Fail(roots.status().message());
  absl::StatusOr<ckpt::TransportSecurity> security = ckpt::ResolveTransportSecurity(
      {absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)},
      absl::GetFlag(FLAGS_insecure), out->listen, "--listen", "ckpt_coordinator");
  if (!security.ok()) {  // the message names the program already
    std::fprintf(stderr, "%s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  out->security = *std::move(security);
  absl::StatusOr<ckpt::pb::LoadAlgorithm> load_algorithm =
      ckpt::ParseLoadAlgorithm(absl::GetFlag(FLAGS_load_algorithm));
  if (!load_algorithm.ok()) {
    return Fail(absl::StrCat("--load_algorithm: ", load_algorithm.status().message()));
  }
  out->load_defaults.algorithm = *load_algorithm;
  out->load_defaults.memory_budget_bytes = absl::GetFlag(FLAGS_load_memory_budget_bytes);
  ckpt::coordinator::CoordinatorOptions& options = out->options;
  options.checkpoint_roots = *roots;
  options.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
  options.tick = absl::Milliseconds(absl::GetFlag(FLAGS_tick_ms));
  if (absl::GetFlag(FLAGS_description_cache_bytes) < 0) {
    return Fail("--description_cache_bytes must be >= 0");
  }
  options.description_cache_bytes = absl::GetFlag(FLAGS_description_cache_bytes);
  if (absl::GetFlag(FLAGS_piece_list_wait_ms) < 0) return Fail("--piece_list_wait_ms must be >= 0");
  options.piece_list_wait = absl::Milliseconds(absl::GetFlag(FLAGS_piece_list_wait_ms));
  if (absl::GetFlag(FLAGS_max_reshard_ranks_per_worker) < 1) {
    return Fail("--max_reshard_ranks_per_worker must be >= 1");
  }
  options.max_reshard_ranks_per_worker = absl::GetFlag(FLAGS_max_reshard_ranks_per_worker);
  if (absl::GetFlag(FLAGS_max_workers_per_identity) < 1 ||
      absl::GetFlag(FLAGS_max_jobs_per_identity) < 1 ||
      absl::GetFlag(FLAGS_dead_worker_retention_ms) < 0 ||
      absl::GetFlag(FLAGS_max_dead_workers) < 0) {
    return Fail(
        "--max_workers_per_identity and --max_jobs_per_identity must be >= 1, "
        "--dead_worker_retention_ms and --max_dead_workers >= 0");
  }
  options.max_workers_per_identity = absl::GetFlag(FLAGS_max_workers_per_identity);
  options.max_jobs_per_identity = absl::GetFlag(FLAGS_max_jobs_per_identity);
  options.dead_worker_retention = absl::Milliseconds(absl::GetFlag(FLAGS_dead_worker_retention_ms));
  options.max_dead_workers = absl::GetFlag(FLAGS_max_dead_workers);
  options.jobs.arrival_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_arrival_deadline_ms));
  options.jobs.execution_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_execution_deadline_ms));
  return std::nullopt;
}

// Serves `services` on the settings' address through a BudgetedListener (gRPC's own listener
// stops accepting for good once out of descriptors); null when it cannot listen, the reason
// on stderr. *listener receives the listener (stop it before the server).
std::unique_ptr<grpc::Server> StartServer(const Settings& settings,
                                          const std::vector<grpc::Service*>& services,
                                          std::unique_ptr<ckpt::BudgetedListener>* listener) {
  absl::StatusOr<int64_t> open_files = ckpt::SetOpenFilesLimit(absl::GetFlag(FLAGS_max_open_files));
  if (!open_files.ok()) spdlog::warn("open_files_limit {}", open_files.status().ToString());
  const int64_t max_total = absl::GetFlag(FLAGS_max_connections) > 0
                                ? absl::GetFlag(FLAGS_max_connections)
                                : ckpt::DefaultMaxConnections(open_files.value_or(1024));
  absl::StatusOr<std::unique_ptr<ckpt::BudgetedListener>> opened = ckpt::BudgetedListener::Open(
      settings.listen, {max_total, absl::GetFlag(FLAGS_max_connections_per_peer)});
  if (!opened.ok()) {
    std::fprintf(stderr, "ckpt_coordinator: %s\n", std::string(opened.status().message()).c_str());
    return nullptr;
  }
  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
          ckpt::MakeServerCredentials(settings.security));
  ckpt::ConnectionSettings connections;
  connections.idle_ms = absl::GetFlag(FLAGS_connection_idle_ms);
  connections.handshake_timeout_ms = absl::GetFlag(FLAGS_handshake_timeout_ms);
  connections.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  ckpt::ApplyConnectionSettings(connections, &builder);
  // Gathered metadata of a rank with many tensors easily exceeds gRPC's 4 MB default.
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return nullptr;
  spdlog::info("connection_budget max_connections={} max_connections_per_peer={} open_files={}",
               (*opened)->limits().max_total, (*opened)->limits().max_per_peer,
               open_files.value_or(-1));
  (*opened)->Serve(std::move(acceptor));
  *listener = *std::move(opened);
  return server;
}

// What SIGINT and SIGTERM do: stop accepting, end the coordinator's streams, stop the server.
std::function<void(int)> OnShutdownSignal(grpc::Server* server, ckpt::BudgetedListener* listener,
                                          ckpt::coordinator::CoordinatorService* coordinator) {
  return [server, listener, coordinator](int signal_number) {
    spdlog::info("shutting_down signal={}", signal_number);
    listener->Stop();         // no new connections: gRPC leaks one handed to a stopped server
    coordinator->Shutdown();  // ends streams and waits so that Shutdown below is prompt
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  };
}

// Says where the coordinator serves: stdout, the log, and --address_file when given.
void Announce(const Settings& settings, const std::string& address,
              const ckpt::coordinator::CoordinatorService& coordinator) {
  std::printf("ckpt_coordinator listening on %s\n", address.c_str());
  std::fflush(stdout);
  spdlog::info(
      "serving address={} incarnation={} tls={} checkpoint_roots=\"{}\" lease_ms={} "
      "arrival_deadline_ms={} execution_deadline_ms={} allocator=\"{}\"",
      address, coordinator.incarnation_hex(), settings.security.tls,
      settings.options.checkpoint_roots->Describe(), absl::GetFlag(FLAGS_lease_ms),
      absl::GetFlag(FLAGS_arrival_deadline_ms), absl::GetFlag(FLAGS_execution_deadline_ms),
      ckpt::AllocatorName());
  const std::string address_file = absl::GetFlag(FLAGS_address_file);
  if (!address_file.empty()) {
    if (absl::Status s = ckpt::WriteFileAtomically(address_file, address + "\n"); !s.ok()) {
      spdlog::error("cannot write address_file={}: {}", address_file, s.ToString());
    }
  }
}

using ckpt::IsTransferPath;
using ckpt::coordinator::PathDispatchKind;

int Run(const std::vector<std::string>& checkpoint_roots) {
  if (absl::Status s = ckpt::SetUpDaemonLogging("coordinator", absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    return Fail(s.message());
  }
  Settings settings;
  if (std::optional<int> code = ReadSettings(checkpoint_roots, &settings)) return *code;
  if (settings.security.insecure_beyond_loopback) {
    spdlog::critical("{}", ckpt::InsecureWarning("ckpt_coordinator", settings.listen));
  }
  absl::StatusOr<std::unique_ptr<ckpt::coordinator::StagingJournal>> opened = OpenStagingJournal();
  if (!opened.ok()) return Fail(absl::StrCat("--state_dir: ", opened.status().message()));
  ckpt::coordinator::StagingJournal* journal = opened->get();

  // Declared before the service so that they outlive it.
  ckpt::coordinator::RealClock clock;
  ckpt::KvStore kv(RendezvousLimits());
  // Saves: staging directory + save plan, then manifest merge + atomic commit; an aborted
  // save's staging directory is removed. The journal records each final path first.
  ckpt::coordinator::SaveCommitter saves(journal);
  // Reshards on the workers: source manifest + target layout -> one part per target rank;
  // the manifest is committed from the ranks' records the same way.
  ckpt::coordinator::ReshardCommitter reshards(journal);
  // Loads: each stored piece is read once, by one rank, and exchanged between the workers of
  // the operation (algorithm and budget from the trainers' load options, else the flags).
  ckpt::coordinator::ExchangeLoadKind loads(settings.load_defaults);
  // The in-memory tier (mem://<name>): saves kept in the workers' memory with replicas on
  // other hosts, recorded in the catalog; loads read by the workers holding each file.
  ckpt::coordinator::MemoryCatalog memory_catalog;
  ckpt::coordinator::MemorySaveKind memory_saves(&memory_catalog,
                                                 std::max(0, absl::GetFlag(FLAGS_memory_replicas)),
                                                 std::max(1, absl::GetFlag(FLAGS_memory_keep)));
  ckpt::coordinator::MemoryLoadKind memory_loads(&memory_catalog, settings.load_defaults);
  PathDispatchKind save_kinds(&ckpt::IsMemoryPath, &memory_saves, &saves);
  // Live transfer (xfer://<name>, coordinator/transfer_kinds.h): publishes, receives with
  // serving participants, and memory loads served by holders outside their ranks.
  ckpt::coordinator::TransferKinds transfer(&memory_catalog, &memory_loads, settings.load_defaults,
                                            absl::GetFlag(FLAGS_transfer_keep_versions));
  PathDispatchKind load_kinds(&ckpt::IsMemoryPath, &transfer.served_memory_loads, &loads);
  PathDispatchKind save_or_publish(&IsTransferPath, &transfer.publishes, &save_kinds);
  PathDispatchKind load_or_receive(&IsTransferPath, &transfer.receives, &load_kinds);
  ckpt::coordinator::CoordinatorService coordinator(&clock, settings.options);
  coordinator.RegisterKind(ckpt::coordinator::OperationKind::kSave, &save_or_publish);
  coordinator.RegisterKind(ckpt::coordinator::OperationKind::kLoad, &load_or_receive);
  coordinator.set_memory_catalog(&memory_catalog);
  // Background persistence of memory saves that ask for it (persist_to).
  ckpt::coordinator::PersistDriver persist(&memory_catalog,
                                           std::max(1, absl::GetFlag(FLAGS_memory_keep)),
                                           coordinator.incarnation_hex());
  persist.set_journal(journal);  // a restarted coordinator removes what a persistence left
  coordinator.set_persist_driver(&persist);
  coordinator.set_published_registry(&transfer.published);
  coordinator.RegisterKind(ckpt::coordinator::OperationKind::kReshard, &reshards);
  coordinator.set_rendezvous_store(&kv);
  ckpt::RendezvousService rendezvous(
      &kv, [&coordinator](const ckpt::Peer& peer, absl::string_view group) {
        return coordinator.AuthorizeRendezvous(peer, group);
      });

  std::unique_ptr<ckpt::BudgetedListener> listener;
  std::unique_ptr<grpc::Server> server =
      StartServer(settings, {&coordinator, &rendezvous}, &listener);
  if (server == nullptr) {
    std::fprintf(stderr, "ckpt_coordinator: cannot listen on %s\n", settings.listen.c_str());
    return 1;
  }
  coordinator.Start();
  Announce(settings, absl::StrCat(settings.host, ":", listener->port()), coordinator);

  ckpt::WatchShutdownSignals(OnShutdownSignal(server.get(), listener.get(), &coordinator));
  server->Wait();
  coordinator.Shutdown();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ckpt coordinator daemon: worker registry, rendezvous store, jobs and operations.\n"
      "usage: ckpt_coordinator --checkpoint_root DIR [--listen HOST:PORT] [flags]");
  // Every occurrence counts (absl keeps only the last).
  std::vector<std::string> roots = ckpt::RepeatedFlagValues(argc, argv, "checkpoint_root");
  absl::ParseCommandLine(argc, argv);
  ckpt::BlockShutdownSignals();
  ckpt::TurnOffMutexDeadlockDetection();
  return Run(roots);
}
