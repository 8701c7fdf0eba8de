// The trainer's connection to its local ckpt worker daemon: the API a training program links.
//
//   auto client = ckpt::client::Client::Connect({});        // rank etc. from the launcher env
//   auto state = client.value()->NewStateDict();
//   auto w = state->AddHost({.key = "layers.0.w", ...});     // fill w->bytes() in place
//   auto handle = client.value()->Save("/ckpt/step100", *state, {});
//   ... training continues ...
//   handle->WaitDurable(absl::Minutes(5));                   // committed
//   client.value()->SaveAndWait("/ckpt/step200", *state);    // blocking: lends, no copy
//
// Every call is collective over the job's ranks where it says so, takes a deadline, and
// returns the coordinator's diagnosis as an absl::Status when an operation is aborted (a rank
// that never arrived, a dead worker, a failed write), naming the rank, host and cause.
#ifndef CKPT_CLIENT_CLIENT_H_
#define CKPT_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/options.h"
#include "client/state_dict.h"
#include "client/transfer.h"

namespace ckpt::client {

class WorkerConnection;  // the gRPC channel; defined in client.cc so gRPC stays out of here

// Options of Save.
struct SaveOptions {
  std::map<std::string, std::string> metadata;  // stored in the manifest (step, ...)
  // How long this rank waits for the others to call Save (the coordinator's own arrival
  // deadline, --arrival_deadline_ms, aborts the operation for every rank when it is shorter).
  absl::Duration arrival_timeout = absl::Minutes(5);
  // What the trainer lends to this save until it ends (WaitDurable returned, OK or not). The
  // worker writes lent host bytes straight from shared memory, without copying them at the
  // snapshot, and Save returns at once for them, so the trainer must not change them before the
  // save ends. Memory not lent is copied by the worker before Save returns (snapshot semantics).
  // See Lending (client/state_dict.h).
  Lending lending = Lending::kMarkedTensors;
  // Memory saves (path mem://<name>) only: extra copies of each data file, each on a worker
  // of another host (-1: the coordinator's --memory_replicas, default 1; 0: none).
  int memory_replicas = -1;
  // Memory saves only: once durable in memory, the coordinator has the holders persist the
  // checkpoint in the background to this storage path (under its checkpoint roots) as an
  // ordinary committed checkpoint ("": never); `ckptctl status` shows how it stands. Save
  // refuses with InvalidArgument a mem:// persist_to, or one on a storage save.
  std::string persist_to;
  bool persist_overwrite = false;  // persist_to may replace a committed checkpoint there
  // Process groups the writes are distributed within, each as Megatron's parallelization group
  // (planner/process_groups.h: "per-node", "read-groups:K", "model-replica:K",
  // "data-parallel:K", or explicit lists "0,1;2,3"); "": one group of every rank. Every rank
  // should pass the same; the first to join decides. Bad groups: InvalidArgument naming the
  // rank or group.
  std::string process_groups;
  // Lossless compression of the data files (storage saves only): "" or "none" (raw), "zstd",
  // or "zstd:<level>" (-1000..19, not 0). Floating-point pieces are byte-grouped, then zstd
  // coded, in 128 KiB chunks (docs/layout.md "Compression"). The worker refuses a bad spec
  // with InvalidArgument naming it before anything is copied; a memory or transfer save with
  // compression is Unimplemented. The first rank to give one decides.
  std::string compression;
  // Storage saves only: the commit may replace a committed ckpt checkpoint at the path. The
  // replacement is atomic (the old checkpoint is swapped out in one rename and removed after
  // the new one is in place: a crash or a failed save leaves the old one or the new one, never
  // a mix, and a reader never sees a partial one). Anything at the path that is not a
  // committed checkpoint or an empty directory is still refused (FailedPrecondition naming it);
  // without it an existing checkpoint is AlreadyExists. A rank that sets it decides. On a
  // memory (mem://) path: InvalidArgument (persist_overwrite is that path's option).
  bool overwrite = false;
  // (No exchange algorithm or memory budget: a save moves no bytes between ranks, each stored
  // piece is written by one rank that holds it, and the worker snapshots its rank's whole part
  // before writing it.)
};

// Options of Load.
struct LoadOptions {
  absl::Duration arrival_timeout = absl::Minutes(5);
  absl::Duration deadline = absl::Hours(1);  // the whole load must finish by then
  // How the workers move what they read: each stored piece is read from storage once, by one
  // rank, and exchanged with this algorithm ("broadcast", "overlap_all_to_all",
  // "gather_rounds", "gather_object"; "direct": every rank reads what it needs itself, a
  // debugging aid; "auto": direct on one host, broadcast across hosts). Unset (""): the
  // coordinator's --load_algorithm decides (default auto). The first rank to join decides;
  // an unknown name is refused by Load with InvalidArgument.
  std::string exchange_algorithm;
  // Bytes in flight per rank and wave (0: the coordinator's --load_memory_budget_bytes).
  int64_t memory_budget_bytes = 0;
  // Process groups (as SaveOptions::process_groups): each group reads from storage every piece
  // its ranks need (also those whose main replica is in another group: Megatron's
  // ignore_groups) and exchanges only within itself, over one communicator per group. "": the
  // coordinator decides (one group; per node across hosts with the auto algorithm).
  std::string process_groups;
};

// How this rank's worker took a save's snapshot (known once snapshotted).
struct SnapshotInfo {
  int64_t copied_bytes = 0;  // host bytes the worker copied out of the trainer's memory
  int64_t lent_bytes = 0;    // host bytes lent until durable: written in place, not copied
  int64_t device_bytes = 0;  // bytes staged off the device through the worker's pinned pool
  // The device bytes exceeded the worker's pinned budget: its buffers were reused during the
  // snapshot, so Save returned later than one round of staging would take.
  bool device_over_pinned_budget = false;
  int64_t pinned_budget_bytes = 0;  // the worker's pinned staging budget (0: none)
  // The device bytes did not fit in the pinned budget, so Save returned only after the chunks
  // staged first were written to their data files: `bytes_written_before_snapshot` of them.
  bool snapshot_waited_for_writes = false;
  int64_t bytes_written_before_snapshot = 0;
};

// Where an operation stands.
struct OperationProgress {
  std::string phase;      // "gathering", "planning", "executing", "committing", "done", "aborted"
  bool finished = false;  // done or aborted
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  absl::Status status;           // the diagnosis when aborted
  bool snapshotted = false;      // save: this rank's state is copied into worker memory
  SnapshotInfo snapshot;         // save, once snapshotted: how
  int64_t received_version = 0;  // receive (xfer://): the published version it delivers
};

// A save in flight.
class SaveHandle {
 public:
  SaveHandle(std::shared_ptr<WorkerConnection> connection, std::string session_id,
             std::string operation_id);
  const std::string& operation_id() const { return operation_id_; }
  // Completes only after the checkpoint is committed (files and directory fsynced, manifest
  // renamed into place): OK then, else the abort diagnosis, or DeadlineExceeded after
  // `timeout` (the save keeps going).
  absl::Status WaitDurable(absl::Duration timeout);
  absl::StatusOr<OperationProgress> Progress();
  // How this rank's worker took the snapshot (zeros when the save ended before it).
  const SnapshotInfo& snapshot() const { return snapshot_; }

 private:
  friend class Client;
  SnapshotInfo snapshot_;
  std::shared_ptr<WorkerConnection> connection_;
  std::string session_id_;
  std::string operation_id_;
};

// What Poll did.
struct PollResult {
  bool performed = false;  // an operator-requested operation ran
  std::string kind;        // "save" or "load"
  std::string path;
  std::string operation_id;
};

// The connection. Thread-compatible (one thread uses it at a time).
class Client {
 public:
  // Resolves options (explicit, then launcher env) and says Hello to the local worker,
  // waiting up to options.rpc_timeout for it to come up. The worker attaches this rank to
  // the job at the coordinator (which rejects a world size that disagrees with other ranks).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const Options& options,
                                                         const EnvLookup& env = ProcessEnv());
  ~Client();  // says Goodbye: the worker releases this process's shared memory

  const ResolvedOptions& options() const { return options_; }
  const std::string& worker_id() const { return worker_id_; }
  const std::string& session_id() const { return session_id_; }
  const std::string& worker_host() const { return worker_host_; }

  // A state dict whose host tensors are shared with this client's worker.
  std::unique_ptr<StateDict> NewStateDict() const;

  // Sends the state dict's description to the worker (it maps the shared segments). Save and
  // Load do this themselves; call it to validate a state dict early.
  absl::Status Share(const StateDict& state);

  // Collective: saves `state` to the checkpoint directory `path`. Returns once the state is
  // snapshotted: the worker copied the part of the state this rank writes into its own
  // memory, so the trainer may modify its tensors at once and the checkpoint still holds the
  // values they had at Save. The handle's WaitDurable completes only after the commit (files
  // and directory fsynced, manifest renamed into place). A save aborted before the snapshot
  // returns the coordinator's diagnosis here; one aborted later, from WaitDurable.
  absl::StatusOr<std::unique_ptr<SaveHandle>> Save(const std::string& path, const StateDict& state,
                                                   const SaveOptions& options = {});

  // Collective: a blocking save. Saves `state` to `path` lending every host tensor
  // (Lending::kAllHostTensors, whatever options.lending says): the worker writes them straight
  // from shared memory with no copy, and this returns only once the checkpoint is committed
  // (WaitDurable, up to `timeout`), so the trainer must not change its tensors until then. The
  // same as ckpt.torch.save. For a save that returns at the snapshot, use Save. Returns how
  // the worker took the snapshot (lent_bytes: the host bytes written without a copy).
  absl::StatusOr<SnapshotInfo> SaveAndWait(const std::string& path, const StateDict& state,
                                           const SaveOptions& options = {},
                                           absl::Duration timeout = absl::Hours(1));

  // Collective: fills `state`'s tensors from the checkpoint at `path`, whatever layout it was
  // saved from (each rank's worker reads the regions it needs; checksums verified). Returns
  // once every tensor holds its loaded values, or the diagnosis (e.g. a tensor the checkpoint
  // lacks or holds with another shape, named).
  absl::Status Load(const std::string& path, StateDict& state, const LoadOptions& options = {});

  // Call once per training step: performs any save or load an operator requested for this
  // job (ckptctl save/load). A save returns once snapshotted (as Save does; the operator's
  // ckptctl waits for the commit; nothing is lent: every byte is copied at the snapshot), a
  // load once the tensors hold the loaded values. Cheap when nothing is pending.
  absl::StatusOr<PollResult> Poll(StateDict& state);
  // Poll that calls `prepare(kind, path)` after learning of a pending operation and before the
  // transfer starts (a binding copies staged tensors into shared memory for a save there); its
  // error is returned without transferring (the operation then misses this rank's join).
  absl::StatusOr<PollResult> Poll(
      StateDict& state,
      const std::function<absl::Status(const std::string& kind, const std::string& path)>& prepare);

  // Live transfer (client/transfer.h). Collective over this job's ranks: publishes `state` as
  // a version of `name`; returns once the bytes left this rank's memory (snapshot semantics).
  absl::StatusOr<std::unique_ptr<PublishHandle>> Publish(const std::string& name,
                                                         const StateDict& state,
                                                         const PublishOptions& options = {});
  // Collective over this job's ranks: fills `state`'s tensors with the newest (or the given)
  // version of `name` published by another job, whatever its layout; all-or-nothing (on error
  // `state` keeps its values). Returns the name and the version received.
  absl::StatusOr<ReceivedVersion> Receive(const std::string& name, StateDict& state,
                                          const ReceiveOptions& options = {});

 private:
  Client(ResolvedOptions options, std::shared_ptr<WorkerConnection> connection);
  // The shadow of `state` Receive of `name` receives into (kept while its tensors match).
  absl::StatusOr<StateDict*> ShadowFor(const std::string& name, const StateDict& state);
  // `state` itself when it has no device tensors; otherwise the host shadow kept under `key`,
  // filled with `state`'s bytes now (device tensors copied with CopyDeviceToHost): what a memory
  // save or publish hands the worker, whose memory tier holds host bytes (client/transfer.cc).
  absl::StatusOr<const StateDict*> StagedOnHost(const std::string& key, const std::string& what,
                                                const StateDict& state);
  // Load up to its end: the final progress (its status says how the load ended).
  absl::StatusOr<OperationProgress> LoadToEnd(const std::string& path, StateDict& state,
                                              const LoadOptions& options);
  std::map<std::string, int64_t> published_versions_;  // name -> this client's last publish
  // name -> receive shadow; "publish:<name>" -> the host copy of a publish of device tensors
  std::map<std::string, std::unique_ptr<StateDict>> shadows_;
  int64_t shadows_made_ = 0;
  absl::StatusOr<std::string> Transfer(
      bool save, const std::string& path, const StateDict& state,
      const std::map<std::string, std::string>& metadata, const std::string& operation_id,
      absl::Duration arrival_timeout, Lending lending,
      pb::LoadAlgorithm load_algorithm = pb::LOAD_ALGORITHM_UNSPECIFIED,
      int64_t memory_budget_bytes = 0, int memory_replicas = -1, const std::string& persist_to = "",
      bool persist_overwrite = false, const std::string& process_groups = "",
      const std::string& compression = "", bool overwrite = false);

  // Share with what `lending` lends marked in the description.
  absl::Status Register(const StateDict& state, Lending lending);

  ResolvedOptions options_;
  std::shared_ptr<WorkerConnection> connection_;
  std::string worker_id_;
  std::string session_id_;
  std::string worker_host_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_CLIENT_H_
