// ckpt_loadgen's driver: one process plays N trainer ranks spread over M worker daemons against
// a real coordinator, over the real gRPC protocol (ckpt.pb.Coordinator), and times whole save
// and load operations. What a worker does with the coordinator is done as the worker does it:
// register (one WorkerInfo per simulated worker), renew leases, pull work over one WatchWork
// stream per worker, attach ranks, join operations with each rank's shard metadata (a
// GptPipelineLayout), wait for the operation's end (WaitOperation: by default one call at a time
// per worker and operation, told to all its ranks, as the worker coalesces its trainers' waits;
// --rank-waits per-rank makes one per rank), execute plan parts and report results.
// Executing moves no tensor bytes: a save part's files are written as headers + holes
// (sparse_save.h), so the coordinator's real commit runs on a valid all-zero checkpoint; a load
// part is acknowledged without reading (each rank reports 0 bytes read) and the plan part's
// size is recorded.
//
// Every call has a deadline; calls run on a completion queue with a bounded window in flight,
// and plan parts are executed on a fixed executor pool, so the load generator's own threads do
// not grow with N or M.
#ifndef CKPT_TOOLS_LOADGEN_LOADGEN_H_
#define CKPT_TOOLS_LOADGEN_LOADGEN_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/types.pb.h"
#include "tools/loadgen/gpt_pipeline_layout.h"
#include "tools/loadgen/proc_stats.h"

namespace ckpt::loadgen {

// How the simulated ranks wait for an operation's end at the coordinator.
enum class RankWaits {
  // Each worker's ranks are told by the `ended` item on its WatchWork stream, as the worker
  // daemon does (worker/operation_ends.h): no WaitOperation call (the product).
  kStream,
  kPerWorker,  // one WaitOperation loop per worker, its ranks told when it returns (before)
  kPerRank,    // one WaitOperation loop per rank (workers before they coalesced waits)
  kNone,       // ranks do not wait
};

// "stream", "per-worker", "per-rank" or "none"; InvalidArgument naming the text otherwise.
absl::StatusOr<RankWaits> ParseRankWaits(const std::string& text);

// What to run.
struct LoadgenOptions {
  std::string coordinator;  // host:port (plaintext loopback)
  int64_t ranks = 0;
  int64_t workers = 0;
  int64_t hosts = 0;  // simulated hosts the workers spread over (0: one per worker)
  std::string job = "loadgen";
  std::string checkpoint;  // absolute; under the coordinator's checkpoint root; must not exist
  std::vector<std::string> operations = {"save", "load"};
  // LOAD_ALGORITHM_UNSPECIFIED = the coordinator's default (auto).
  pb::LoadAlgorithm load_algorithm = pb::LOAD_ALGORITHM_UNSPECIFIED;
  int max_in_flight = 256;  // calls issued and not yet answered (joins, attaches, ...)
  int channels = 64;        // gRPC channels (connections) the workers share
  int cq_threads = 2;
  int executor_threads = 2;
  RankWaits rank_waits = RankWaits::kStream;
  // Each rank joins in its own JoinOperation call (workers before they coalesced joins); by
  // default a worker's ranks join as its CoordinatorJoins does when they arrive together: all
  // in one JoinOperations call (the worker's first join lingers for its peers).
  bool per_rank_joins = false;
  // False: a worker's first rank joins alone, the others in the next call (workers that do
  // not linger, --join_linger_ms=0).
  bool join_linger = true;
  bool fsync = false;  // fsync the sparse data files like a real worker
  // False (the default): plan parts are executed once every rank's part has arrived, so the
  // simulated workers' file writes (a real deployment's work on other hosts) do not share the
  // coordinator's cores while it dispatches; true: each part as it arrives.
  bool execute_while_dispatching = false;
  // Join as workers do: with each rank's description digest, and only the digest once the
  // coordinator has accepted that description in full (a repeat operation skips the gather).
  bool state_digests = true;
  // Describe each rank compactly (GptPipelineLayout::RankState(rank, compact = true)).
  bool compact = false;
  // Join as workers do: a changed description without compact tensors by reference to its
  // layout class (JoinOperationRequest.piece_list), in full when the coordinator asks.
  bool class_references = true;
  absl::Duration rpc_timeout = absl::Seconds(120);
  absl::Duration wait_slice = absl::Seconds(10);  // WaitOperation timeout per call
  absl::Duration operation_timeout = absl::Minutes(30);
  pid_t coordinator_pid = 0;    // sampled from /proc when set
  std::string coordinator_log;  // the coordinator's stderr, for its phase timestamps
  // Called with each sample of the coordinator (e.g. to stop it past a memory cap).
  std::function<void(const ProcStats&)> on_coordinator_sample;
};

// Figures of one operation. Times are InfinitePast when unknown.
struct OperationReport {
  std::string kind;
  std::string id;
  std::string phase;   // final phase the coordinator reported ("done", "aborted", ...)
  std::string status;  // its status message when not OK
  std::string path;    // the checkpoint saved or loaded
  int64_t join_errors = 0;
  std::string first_join_error;
  int64_t ranks_told = 0;          // ranks whose wait ended (final or an error)
  int64_t wait_calls = 0;          // WaitOperation calls made for the ranks' waits
  int64_t ends_on_streams = 0;     // workers told the operation's end by their WatchWork stream
  int64_t snapshot_calls = 0;      // zero-wait WaitOperation calls at a saving rank's snapshot
  int64_t join_calls = 0;          // JoinOperation(s) calls made (resends included)
  int64_t joins_by_digest = 0;     // joins that sent only the description digest, accepted
  int64_t joins_by_class = 0;      // joins that sent their layout class's digest, accepted
  int64_t full_state_resends = 0;  // digest-only joins the coordinator answered send_full_state
  absl::Time start = absl::InfinitePast();               // first join sent
  absl::Time last_join_answered = absl::InfinitePast();  // by the loadgen's clock
  absl::Time first_plan = absl::InfinitePast(), last_plan = absl::InfinitePast();
  int64_t plan_parts = 0;
  int64_t plan_bytes = 0;     // sum of plan part sizes received
  int64_t max_plan_part = 0;  // largest plan part
  int64_t files_written = 0;  // save: sparse data files
  absl::Time last_result_sent = absl::InfinitePast();
  absl::Time final_seen = absl::InfinitePast();      // the operation was final (our WaitOperation)
  absl::Time all_ranks_told = absl::InfinitePast();  // every rank's wait ended
  // The coordinator's log (when given): gathered, planned, committed, done.
  absl::Time log_gathered = absl::InfinitePast(), log_planned = absl::InfinitePast(),
             log_committed = absl::InfinitePast(), log_done = absl::InfinitePast();
  bool plan_reused = false;  // the coordinator logged that it reused the layout's plan
  // The coordinator's planning step alone (storage preparation, then the kept plan or the
  // planner): wall and CPU seconds (-1: not logged). Less CPU than wall: the planner (at nice
  // 10) yielded to other work, or the preparation waited for storage.
  double planner_seconds = -1, planner_cpu_seconds = -1;
  ProcStats coordinator_before, coordinator_after;  // readings around the operation
  int64_t coordinator_peak_threads = 0;             // during the operation
  // The coordinator's CPU readings (every 100 ms) during the operation, for its CPU seconds per
  // phase: on a shared machine, phase seconds depend on the load, CPU seconds much less.
  std::vector<CpuReading> coordinator_cpu;
  // The load generator's own CPU readings, likewise: on two cores it shares the machine with
  // the coordinator, so a phase is bounded by the sum of both processes' CPU.
  std::vector<CpuReading> loadgen_cpu;
  double loadgen_cpu_seconds = 0;
};

// Figures of a whole run.
struct LoadgenReport {
  Parallelism parallelism;
  int64_t shards_per_rank_max = 0;
  int64_t shards_total = 0;       // pieces described (listed and compact)
  int64_t compact_total = 0;      // of them, described compactly
  int64_t state_bytes_total = 0;  // serialized RankState bytes of all ranks
  absl::Duration describe_time;   // building every rank's RankState (before the clock)
  absl::Duration register_time;   // registering M workers and opening their streams
  absl::Duration attach_time;     // attaching N ranks
  std::vector<OperationReport> operations;
  ProcStats coordinator_peak;    // peak RSS (VmHWM), most threads, CPU seconds at the end
  int64_t heartbeat_errors = 0;  // heartbeats that failed
  // The machine's 1-minute load average when the run started and ended (-1: unknown): the
  // seconds above are only comparable between runs at similar load.
  double load_average_start = -1;
  double load_average_end = -1;
  // The libgrpc each process runs (/proc/<pid>/maps; "" unknown): Debian's debug build, or the
  // release build `-c opt` links (docs/BUILDING.md). Figures of the two do not compare.
  std::string coordinator_grpc_library;
  std::string loadgen_grpc_library;
  int64_t stream_errors = 0;  // work streams that ended before the run did
  int64_t report_errors = 0;  // ReportResult calls that failed
};

// The checkpoint path of the `n`-th save (0-based) of a run: the options' checkpoint, then
// "<checkpoint>-<n+1>" (repeat saves write new checkpoints); a load reads the last saved one.
std::string SavePath(const LoadgenOptions& options, int n);

// Runs the operations. Errors are setup failures (bad options, the coordinator unreachable);
// an operation that aborts is reported in its OperationReport.
absl::StatusOr<LoadgenReport> RunLoadgen(const LoadgenOptions& options,
                                         const GptPipelineLayout& layout);

// The report as text: one line per figure, "key value" style, stable for tests to read.
std::string FormatReport(const LoadgenOptions& options, const LoadgenReport& report);

}  // namespace ckpt::loadgen

#endif  // CKPT_TOOLS_LOADGEN_LOADGEN_H_
