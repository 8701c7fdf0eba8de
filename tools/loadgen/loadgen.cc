#include "tools/loadgen/loadgen.h"

#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "planner/rank_description.h"
#include "proto/compact_convert.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/deterministic.h"
#include "proto/operation_phase.h"
#include "proto/state_digest.h"
#include "proto/status_detail.h"
#include "tools/loadgen/async_calls.h"
#include "tools/loadgen/coordinator_log.h"
#include "tools/loadgen/sparse_save.h"
#include "worker/kept_plan_parts.h"

namespace ckpt::loadgen {
namespace {

// Completion queues (one thread each) for the workers' WatchWork streams (Driver::stream_loops_).
constexpr int kStreamLoops = 2;
constexpr char kJoinMethod[] = "/ckpt.pb.Coordinator/JoinOperation";
constexpr char kJoinsMethod[] = "/ckpt.pb.Coordinator/JoinOperations";

double CpuSecondsOfSelf() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// A serialized JoinOperationRequest: `header` (every field but the state) followed by field 7
// (RankState) holding `state`, already serialized. Protobuf merges fields in any order, so the
// per-rank state is serialized once for all operations.
std::string JoinRequestBytes(const pb::JoinOperationRequest& header, const std::string& state) {
  std::string out = header.SerializeAsString();
  AppendBytesField(pb::JoinOperationRequest::kStateFieldNumber, state, &out);
  return out;
}

std::string PhaseName(pb::OperationPhase phase) {
  std::string name = pb::OperationPhase_Name(phase);
  absl::string_view view(name);
  if (absl::ConsumePrefix(&view, "PHASE_")) return absl::AsciiStrToLower(std::string(view));
  return name;
}

// One simulated worker daemon.
struct SimWorker {
  std::string id;
  int64_t index = 0;  // in Driver::workers_
  int channel = 0;
  // The stream's first message (stream_opened) arrived: it brings the ends of operations from
  // then on. Never reset: a stream that breaks is counted an error of the run.
  std::atomic<bool> stream_opened{false};
  grpc::ClientContext watch_context;
  pb::WorkItem item;
  std::unique_ptr<grpc::ClientAsyncReader<pb::WorkItem>> reader;
  grpc::Status watch_status;
};

// The operation in flight and what has been seen of it.
struct OperationRun {
  std::string path;         // the checkpoint of this operation
  std::string join_common;  // Driver::JoinCommonBytes, before the first join
  std::mutex mu;
  std::condition_variable cv;
  OperationReport report;
  std::string id;
  int64_t joins_answered = 0;
  // RankWaits::kStream and kPerWorker, by worker: whether its WaitOperation loop started,
  // whether it knows the end (from the loop or its stream), and its ranks waiting on it.
  struct WorkerWait {
    bool started = false;
    bool ended = false;
    int64_t waiting = 0;
  };
  std::vector<WorkerWait> worker_waits;
  // Plan parts received and not executed yet (LoadgenOptions::execute_while_dispatching false),
  // until every rank's part has arrived.
  std::vector<pb::WorkItem> held_parts;
};

class Driver {
 public:
  Driver(const LoadgenOptions& options, const GptPipelineLayout& layout)
      : options_(options),
        layout_(layout),
        window_(options.max_in_flight),
        kept_parts_(static_cast<size_t>(options.ranks)) {}
  ~Driver() { Stop(); }

  absl::StatusOr<LoadgenReport> Run();

 private:
  int64_t WorkerOf(int64_t rank) const { return rank * options_.workers / options_.ranks; }
  pb::Coordinator::Stub* StubOf(int64_t worker) { return stubs_[workers_[worker]->channel].get(); }
  void Describe(LoadgenReport* report);
  absl::Status RegisterWorkers();
  void OpenWatch(SimWorker* w);
  void ReadNext(SimWorker* w);
  void HeartbeatLoop();
  absl::Status AttachRanks();
  OperationReport RunOperation(const std::string& kind, const std::string& path);
  // One rank's join; only the digest of its description once one was accepted in full, unless
  // `full_state`. Answered send_full_state, it joins again in full (keeping its window slot).
  void Join(const std::shared_ptr<OperationRun>& run, const std::string& kind, int64_t rank,
            bool full_state = false);
  // Every rank's join (per rank, or per worker as options_.per_rank_joins says), each call
  // holding a window slot.
  void JoinEveryRank(const std::shared_ptr<OperationRun>& run, const std::string& kind);
  // Ranks of one worker joining in one JoinOperations call, then `next` in another; ranks
  // answered send_full_state join again, together, in full. Holds one window slot throughout.
  void JoinTogether(const std::shared_ptr<OperationRun>& run, const std::string& kind,
                    std::vector<int64_t> ranks, std::vector<int64_t> next, bool full_state);
  // The fields every rank's join of the operation shares (the path `run` names), serialized:
  // made once per operation (OperationRun::join_common).
  std::string JoinCommonBytes(const OperationRun& run, const std::string& kind) const;
  // The fields of rank `rank`'s join that are its own, but the state.
  pb::JoinOperationRequest JoinHeader(const std::string& kind, int64_t rank) const;
  // How a join carried its rank's description.
  enum class Sent { kFull, kDigest, kClass };
  // Rank `rank`'s serialized join: only the digest once its description was accepted, else by
  // reference to its layout class (options_.class_references), unless `full_state` (`sent`
  // says which).
  std::string JoinBytes(const OperationRun& run, const std::string& kind, int64_t rank,
                        bool full_state, Sent* sent) const;
  // One unary call of `method` (serialized `request`) as `worker`; `done` gets the status and
  // the response's bytes on the completion loop.
  void CallCoordinator(int64_t worker, const char* method, const std::string& request,
                       std::function<void(const grpc::Status&, const std::string&)> done);
  // Records the answers to a JoinOperations call of `ranks` (StartRankWait for each joined);
  // returns the ranks that must join again with their full state.
  std::vector<int64_t> JoinsAnswered(const std::shared_ptr<OperationRun>& run, bool watched,
                                     const std::vector<int64_t>& ranks,
                                     const std::vector<Sent>& omitted, const grpc::Status& status,
                                     const std::string& bytes);
  // Records the answer of rank `rank`'s join; true when it must join again with its full state.
  bool JoinAnswered(const std::shared_ptr<OperationRun>& run, int64_t rank, Sent sent,
                    const absl::Status& status, const pb::JoinOperationResponse& response);
  // Rank `rank` (its join accepted) waits for the operation's end as options_.rank_waits says.
  // `watched`: the join was sent while the worker's stream was open (it brings the end).
  void StartRankWait(const std::shared_ptr<OperationRun>& run, int64_t rank, bool watched);
  // The zero-wait WaitOperation a worker makes for a saving rank's status when it snapshotted
  // the rank's state (what the trainer's Save returns with; worker_service Wait).
  void SnapshotStatusCall(const std::shared_ptr<OperationRun>& run, int64_t worker,
                          const std::string& operation_id);
  // Worker `worker`'s stream says the operation `status` names ended (RankWaits::kStream).
  void EndedOnStream(int64_t worker, const pb::OperationStatus& status);
  // One rank's WaitOperation loop (RankWaits::kPerRank).
  void WaitRank(const std::shared_ptr<OperationRun>& run, int64_t rank);
  // One worker's WaitOperation loop for all its ranks (RankWaits::kPerWorker).
  void WaitWorker(const std::shared_ptr<OperationRun>& run, int64_t worker);
  // Asks the coordinator, as `worker`, for run's operation one wait slice at a time (each call
  // counted in wait_calls) until it is final or a call fails, then runs `ended`.
  void WaitUntilFinal(const std::shared_ptr<OperationRun>& run, int64_t worker,
                      std::function<void()> ended);
  // Records that `n` more ranks' waits ended. Requires run->mu.
  void TellRanksLocked(OperationRun& run, int64_t n);
  // A plan part read from a worker's stream: counted, then executed on the executor.
  void HandleWorkItem(pb::WorkItem item);
  void Execute(pb::WorkItem item);
  // Rank `rank`'s pieces as it described them, expanded (what a save part's local indexes name).
  absl::StatusOr<pb::RankState> OwnPieces(int64_t rank) const;
  // Waits (WaitOperation) until the operation is final; false on timeout or a dead coordinator.
  bool WaitFinal(const std::string& id, pb::OperationStatus* status);
  // False once the coordinator process (when known) has exited, zombies included.
  bool CoordinatorAlive() const {
    if (options_.coordinator_pid <= 0) return true;
    std::ifstream in(absl::StrCat("/proc/", options_.coordinator_pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
  }
  void Stop();

  const LoadgenOptions& options_;
  const GptPipelineLayout& layout_;
  std::vector<std::string> states_;   // serialized RankState by rank
  std::vector<std::string> digests_;  // their digests (planner/rank_description.h)
  // Serialized pb::PieceListReference by rank ("" when the rank joins in full).
  std::vector<std::string> references_;
  // Per rank: the coordinator accepted its description in full (its digest will do).
  std::unique_ptr<std::atomic<bool>[]> described_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<pb::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  absl::Duration lease_ = absl::Seconds(10);
  std::unique_ptr<CompletionLoop> loop_;
  // The WatchWork streams' own completion queues (worker i on stream_loops_[i % size]), apart
  // from the unary calls': a debug-built libgrpc checks each completion against every tag
  // outstanding on its queue, and 12,800 held stream reads made every call's completion walk
  // them (each real worker's queue holds its own stream only).
  std::vector<std::unique_ptr<CompletionLoop>> stream_loops_;
  std::unique_ptr<Executor> executor_;
  Window window_;
  std::unique_ptr<ProcSampler> sampler_;
  std::unique_ptr<ProcSampler> self_sampler_;  // this process, for its CPU per phase
  std::shared_ptr<OperationRun> current_;      // guarded by current_mu_
  std::mutex current_mu_;
  std::atomic<bool> stopping_{false};
  std::mutex streams_mu_;
  std::condition_variable streams_cv_;
  int open_streams_ = 0;
  std::thread heartbeats_;
  std::mutex heartbeat_mu_;
  std::condition_variable heartbeat_cv_;
  std::atomic<int64_t> heartbeat_errors_{0};
  std::atomic<int64_t> stream_errors_{0};
  std::atomic<int64_t> report_errors_{0};
  // The save plan part bodies the simulated workers keep (worker/kept_plan_parts).
  worker::KeptPlanParts kept_parts_;
};

void Driver::Describe(LoadgenReport* report) {
  const absl::Time start = absl::Now();
  states_.assign(options_.ranks, std::string());
  digests_.assign(options_.ranks, std::string());
  references_.assign(options_.ranks, std::string());
  described_ = std::make_unique<std::atomic<bool>[]>(options_.ranks);
  const int threads = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::vector<int64_t> shards(threads, 0), max_shards(threads, 0), bytes(threads, 0),
      compact(threads, 0);
  std::vector<std::string> errors(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t r = t; r < options_.ranks; r += threads) {
        absl::StatusOr<pb::RankState> state = layout_.RankState(r, options_.compact);
        if (!state.ok()) {
          errors[t] = state.status().ToString();
          return;
        }
        int64_t pieces = state->shards_size();
        for (const pb::CompactTensors& run : state->compact_tensors()) {
          pieces += run.tensors_size();
          compact[t] += run.tensors_size();
        }
        shards[t] += pieces;
        max_shards[t] = std::max<int64_t>(max_shards[t], pieces);
        states_[r] = state->SerializeAsString();
        if (options_.state_digests && state->compact_tensors_size() == 0) {
          absl::StatusOr<DescriptionSplit> split = SplitDescription(*state);
          if (!split.ok()) {
            errors[t] = split.status().ToString();
            return;
          }
          digests_[r] = split->digest;
          if (options_.class_references) {
            pb::PieceListReference reference;
            reference.set_class_digest(split->class_digest);
            *reference.mutable_column() = std::move(split->column);
            references_[r] = reference.SerializeAsString();
          }
        } else if (options_.state_digests) {
          digests_[r] = RankStateDigest(*state);
        }
        bytes[t] += static_cast<int64_t>(states_[r].size());
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (int t = 0; t < threads; ++t) {
    report->shards_total += shards[t];
    report->compact_total += compact[t];
    report->shards_per_rank_max = std::max(report->shards_per_rank_max, max_shards[t]);
    report->state_bytes_total += bytes[t];
  }
  report->describe_time = absl::Now() - start;
}

absl::Status Driver::RegisterWorkers() {
  const int64_t hosts = options_.hosts > 0 ? options_.hosts : options_.workers;
  std::mutex mu;
  std::string first_error;
  for (int64_t w = 0; w < options_.workers; ++w) {
    auto worker = std::make_unique<SimWorker>();
    worker->index = w;
    worker->channel = static_cast<int>(w % static_cast<int64_t>(stubs_.size()));
    workers_.push_back(std::move(worker));
  }
  for (int64_t w = 0; w < options_.workers; ++w) {
    pb::RegisterWorkerRequest request;
    pb::WorkerInfo* info = request.mutable_info();
    const int64_t host = w * hosts / options_.workers;
    info->set_host(absl::StrCat("lg-host-", host));
    // A simulated worker has no process of its own: its pid is a stand-in, unique per host.
    info->set_pid(static_cast<int32_t>(1 + w));
    info->set_data_plane_address(absl::StrCat("127.0.0.1:", 20000 + w % 40000));
    info->add_memory_kinds(pb::MEMORY_HOST);
    info->set_local_rank(static_cast<int32_t>(w - (host * options_.workers + hosts - 1) / hosts));
    info->set_gpu(-1);
    window_.Acquire();
    SimWorker* worker = workers_[w].get();
    AsyncUnary<pb::RegisterWorkerResponse>(
        *loop_, options_.rpc_timeout,
        [&, request](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
          return stubs_[worker->channel]->PrepareAsyncRegisterWorker(c, request, cq);
        },
        [&, worker](const grpc::Status& s, pb::RegisterWorkerResponse& response) {
          {
            std::lock_guard<std::mutex> lock(mu);
            if (s.ok()) {
              worker->id = response.worker_id();
              lease_ = absl::Milliseconds(std::max<int64_t>(response.lease_ms(), 30));
            } else if (first_error.empty()) {
              first_error = s.error_message();
            }
          }
          window_.Release();
        });
  }
  window_.Drain();
  if (!first_error.empty()) {
    return absl::UnavailableError(
        absl::StrCat("RegisterWorker at ", options_.coordinator, ": ", first_error));
  }
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
  for (auto& w : workers_) OpenWatch(w.get());
  return absl::OkStatus();
}

void Driver::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(heartbeat_mu_);
  // Three renewals per lease, as the real worker's link sends them, spread over the period in
  // kSlices groups of workers: independent workers do not renew all in the same instant (a
  // burst of 12,800 calls landed inside a phase being measured, or not, by chance).
  constexpr int64_t kSlices = 20;
  const int64_t count = static_cast<int64_t>(workers_.size());
  for (int64_t slice = 0; !stopping_; slice = (slice + 1) % kSlices) {
    heartbeat_cv_.wait_for(lock, absl::ToChronoNanoseconds(lease_ / 3 / kSlices));
    if (stopping_) break;
    const absl::Duration timeout = std::min(options_.rpc_timeout, lease_ / 2);
    for (int64_t i = slice * count / kSlices; i < (slice + 1) * count / kSlices; ++i) {
      const std::unique_ptr<SimWorker>& w = workers_[i];
      pb::HeartbeatRequest request;
      request.set_worker_id(w->id);
      request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
      SimWorker* worker = w.get();
      AsyncUnary<pb::HeartbeatResponse>(
          *loop_, timeout,
          [this, request, worker](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
            return stubs_[worker->channel]->PrepareAsyncHeartbeat(c, request, cq);
          },
          [this](const grpc::Status& s, pb::HeartbeatResponse&) {
            if (!s.ok()) ++heartbeat_errors_;
          });
    }
  }
}

void Driver::OpenWatch(SimWorker* w) {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    ++open_streams_;
  }
  pb::WatchWorkRequest request;
  request.set_worker_id(w->id);
  // The stream lives as long as the run; Stop() cancels it.
  CompletionLoop& streams = *stream_loops_[w->index % kStreamLoops];
  w->reader = stubs_[w->channel]->PrepareAsyncWatchWork(&w->watch_context, request, streams.cq());
  w->reader->StartCall(CompletionLoop::Tag([this, w](bool ok) {
    if (ok) {
      ReadNext(w);
      return;
    }
    w->reader->Finish(&w->watch_status, CompletionLoop::Tag([this](bool) {
      std::lock_guard<std::mutex> lock(streams_mu_);
      --open_streams_;
      streams_cv_.notify_all();
    }));
  }));
}

void Driver::ReadNext(SimWorker* w) {
  w->reader->Read(&w->item, CompletionLoop::Tag([this, w](bool ok) {
    if (!ok) {
      w->reader->Finish(&w->watch_status, CompletionLoop::Tag([this, w](bool) {
        if (!stopping_) ++stream_errors_;
        std::lock_guard<std::mutex> lock(streams_mu_);
        --open_streams_;
        streams_cv_.notify_all();
      }));
      return;
    }
    pb::WorkItem item = std::move(w->item);
    if (item.stream_opened()) w->stream_opened = true;
    google::protobuf::RepeatedPtrField<pb::WorkItem> batched;
    batched.Swap(item.mutable_batched());
    if (item.has_ended()) EndedOnStream(w->index, item.ended());
    for (const pb::WorkItem& more : batched) {
      if (more.has_ended()) EndedOnStream(w->index, more.ended());
    }
    HandleWorkItem(std::move(item));
    for (pb::WorkItem& more : batched) HandleWorkItem(std::move(more));
    ReadNext(w);
  }));
}

void Driver::HandleWorkItem(pb::WorkItem item) {
  if (item.item_case() != pb::WorkItem::kPlanPart) return;
  std::shared_ptr<OperationRun> run;
  {
    std::lock_guard<std::mutex> lock(current_mu_);
    run = current_;
  }
  std::vector<pb::WorkItem> ready;
  if (run != nullptr) {
    const absl::Time now = absl::Now();
    std::lock_guard<std::mutex> lock(run->mu);
    OperationReport& r = run->report;
    if (r.plan_parts == 0) r.first_plan = now;
    r.last_plan = now;
    ++r.plan_parts;
    const int64_t size = static_cast<int64_t>(item.plan_part().size());
    r.plan_bytes += size;
    r.max_plan_part = std::max(r.max_plan_part, size);
    if (!options_.execute_while_dispatching && r.plan_parts < options_.ranks) {
      run->held_parts.push_back(std::move(item));  // executed with the last rank's part
      return;
    }
    ready.swap(run->held_parts);
  }
  ready.push_back(std::move(item));
  for (pb::WorkItem& part : ready) {
    executor_->Post([this, part = std::move(part)]() mutable { Execute(std::move(part)); });
  }
}

absl::StatusOr<pb::RankState> Driver::OwnPieces(int64_t rank) const {
  pb::RankState sent;
  if (rank < 0 || rank >= static_cast<int64_t>(states_.size()) ||
      !sent.ParseFromString(states_[rank])) {
    return absl::InternalError(absl::StrCat("rank ", rank, ": no description to save from"));
  }
  pb::RankState expanded;
  absl::StatusOr<const pb::RankState*> full =
      ExpandCompactTensors(sent, &expanded, absl::StrCat("rank ", rank));
  if (!full.ok()) return full.status();
  return *full == &sent ? sent : expanded;
}

void Driver::Execute(pb::WorkItem item) {
  pb::ReportResultRequest request;
  request.set_operation_id(item.operation_id());
  request.set_rank(item.rank());
  int64_t files = 0;
  if (item.kind() == pb::OPERATION_SAVE) {
    pb::SavePlanPart part;
    const absl::Status whole = kept_parts_.Resolve(item);  // as a worker keeps part bodies
    absl::StatusOr<pb::RankState> own = OwnPieces(item.rank());
    absl::StatusOr<std::string> written =
        !whole.ok() ? absl::StatusOr<std::string>(whole)
        : !own.ok() ? absl::StatusOr<std::string>(own.status())
        : part.ParseFromString(item.plan_part())
            ? WriteSparseSavePart(part, own->shards(), options_.fsync)
            : absl::InvalidArgumentError(
                  absl::StrCat("rank ", item.rank(), ": unreadable save plan part"));
    if (written.ok()) {
      request.set_written(*std::move(written));
      files = part.files_size();
    } else {
      request.mutable_result()->set_code(static_cast<int>(written.status().code()));
      request.mutable_result()->set_message(std::string(written.status().message()));
    }
  } else {
    // A load part is parsed, as a worker would, and acknowledged without reading anything.
    pb::LoadPlanPart part;
    if (!part.ParseFromString(item.plan_part())) {
      request.mutable_result()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      request.mutable_result()->set_message("unreadable load plan part");
    }
    request.set_bytes_read(0);
  }
  std::shared_ptr<OperationRun> run;
  {
    std::lock_guard<std::mutex> lock(current_mu_);
    run = current_;
  }
  if (run != nullptr) {
    std::lock_guard<std::mutex> lock(run->mu);
    run->report.files_written += files;
    run->report.last_result_sent = absl::Now();
  }
  const int64_t worker = WorkerOf(item.rank());
  if (item.kind() == pb::OPERATION_SAVE && options_.rank_waits != RankWaits::kNone) {
    SnapshotStatusCall(run, worker, item.operation_id());
  }
  AsyncUnary<pb::ReportResultResponse>(
      *loop_, options_.rpc_timeout,
      [this, request = std::move(request), worker](grpc::ClientContext* c,
                                                   grpc::CompletionQueue* cq) {
        return StubOf(worker)->PrepareAsyncReportResult(c, request, cq);
      },
      [this](const grpc::Status& s, pb::ReportResultResponse&) {
        if (!s.ok()) ++report_errors_;
      });
}

void Driver::SnapshotStatusCall(const std::shared_ptr<OperationRun>& run, int64_t worker,
                                const std::string& operation_id) {
  if (run != nullptr) {
    std::lock_guard<std::mutex> lock(run->mu);
    ++run->report.snapshot_calls;
  }
  pb::WaitOperationRequest request;
  request.set_operation_id(operation_id);
  request.set_timeout_ms(0);
  AsyncUnary<pb::OperationStatus>(
      *loop_, options_.rpc_timeout,
      [this, request, worker](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
        return StubOf(worker)->PrepareAsyncWaitOperation(c, request, cq);
      },
      [](const grpc::Status&, pb::OperationStatus&) {});
}

absl::Status Driver::AttachRanks() {
  std::mutex mu;
  std::string first_error;
  for (int64_t r = 0; r < options_.ranks; ++r) {
    pb::AttachRankRequest request;
    request.set_job(options_.job);
    request.set_world_size(static_cast<int32_t>(options_.ranks));
    request.set_rank(static_cast<int32_t>(r));
    const int64_t worker = WorkerOf(r);
    request.set_worker_id(workers_[worker]->id);
    request.set_trainer_pid(static_cast<int32_t>(100000 + r));
    window_.Acquire();
    AsyncUnary<pb::AttachRankResponse>(
        *loop_, options_.rpc_timeout,
        [this, request, worker](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
          return StubOf(worker)->PrepareAsyncAttachRank(c, request, cq);
        },
        [&](const grpc::Status& s, pb::AttachRankResponse&) {
          if (!s.ok()) {
            std::lock_guard<std::mutex> lock(mu);
            if (first_error.empty()) first_error = s.error_message();
          }
          window_.Release();
        });
  }
  window_.Drain();
  if (!first_error.empty())
    return absl::UnavailableError(absl::StrCat("AttachRank: ", first_error));
  return absl::OkStatus();
}

std::string Driver::JoinCommonBytes(const OperationRun& run, const std::string& kind) const {
  pb::JoinOperationRequest common;
  common.set_job(options_.job);
  common.set_world_size(static_cast<int32_t>(options_.ranks));
  common.set_kind(kind == "save" ? pb::OPERATION_SAVE : pb::OPERATION_LOAD);
  common.set_path(run.path);
  if (kind == "save") {
    (*common.mutable_metadata())["step"] = "1";
    // Whoever opens the checkpoint later can tell what made it.
    (*common.mutable_metadata())["written_by"] = "ckpt_loadgen (sparse files: every element 0)";
  } else {
    common.set_load_algorithm(options_.load_algorithm);
  }
  return common.SerializeAsString();
}

pb::JoinOperationRequest Driver::JoinHeader(const std::string& kind, int64_t rank) const {
  pb::JoinOperationRequest header;
  header.set_rank(static_cast<int32_t>(rank));
  header.set_worker_id(workers_[WorkerOf(rank)]->id);
  header.set_state_digest(digests_[rank]);
  if (kind == "save") header.set_held_plan_part_body(kept_parts_.Held(options_.job, rank));
  return header;
}

std::string Driver::JoinBytes(const OperationRun& run, const std::string& kind, int64_t rank,
                              bool full_state, Sent* sent) const {
  pb::JoinOperationRequest header = JoinHeader(kind, rank);
  *sent = full_state || !options_.state_digests ? Sent::kFull
          : described_[rank].load()             ? Sent::kDigest
          : !references_[rank].empty()          ? Sent::kClass
                                                : Sent::kFull;
  header.set_state_omitted(*sent != Sent::kFull);
  // The shared fields, then the rank's: a parser merges concatenated messages.
  std::string out = run.join_common;
  if (*sent == Sent::kDigest) return out + header.SerializeAsString();
  if (*sent == Sent::kFull) return out + JoinRequestBytes(header, states_[rank]);
  pb::RankState rank_only;  // by reference: the rank alone, then the class and column
  rank_only.set_rank(static_cast<int32_t>(rank));
  out += JoinRequestBytes(header, rank_only.SerializeAsString());
  AppendBytesField(pb::JoinOperationRequest::kPieceListFieldNumber, references_[rank], &out);
  return out;
}

// One unary call of `method` with `request` bytes; `done` gets the status and response bytes.
void Driver::CallCoordinator(int64_t worker, const char* method, const std::string& request,
                             std::function<void(const grpc::Status&, const std::string&)> done) {
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  };
  auto* call = new Call;
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Slice slice(request);
  grpc::ByteBuffer buffer(&slice, 1);
  call->reader = generic_[workers_[worker]->channel]->PrepareUnaryCall(&call->context, method,
                                                                       buffer, loop_->cq());
  call->reader->StartCall();
  call->reader->Finish(&call->response, &call->status,
                       CompletionLoop::Tag([call, done = std::move(done)](bool) {
                         done(call->status, BufferToString(call->response));
                         delete call;
                       }));
}

void Driver::Join(const std::shared_ptr<OperationRun>& run, const std::string& kind, int64_t rank,
                  bool full_state) {
  Sent omitted = Sent::kFull;
  const std::string request = JoinBytes(*run, kind, rank, full_state, &omitted);
  {
    std::lock_guard<std::mutex> lock(run->mu);
    ++run->report.join_calls;
  }
  const bool watched = workers_[WorkerOf(rank)]->stream_opened;
  CallCoordinator(WorkerOf(rank), kJoinMethod, request,
                  [this, run, kind, rank, omitted, watched](const grpc::Status& status,
                                                            const std::string& bytes) {
                    pb::JoinOperationResponse response;
                    absl::Status s = !status.ok() ? absl::UnavailableError(status.error_message())
                                     : response.ParseFromString(bytes)
                                         ? absl::OkStatus()
                                         : absl::DataLossError("unreadable response");
                    const bool again = JoinAnswered(run, rank, omitted, s, response);
                    if (again) {
                      Join(run, kind, rank, /*full_state=*/true);  // keeps the window slot
                      return;
                    }
                    window_.Release();
                    if (s.ok() && !response.send_full_state()) StartRankWait(run, rank, watched);
                  });
}

void Driver::JoinTogether(const std::shared_ptr<OperationRun>& run, const std::string& kind,
                          std::vector<int64_t> ranks, std::vector<int64_t> next, bool full_state) {
  std::string request;
  std::vector<Sent> omitted;
  for (int64_t rank : ranks) {
    Sent o = Sent::kFull;
    AppendBytesField(pb::JoinOperationsRequest::kJoinsFieldNumber,
                     JoinBytes(*run, kind, rank, full_state, &o), &request);
    omitted.push_back(o);
  }
  {
    std::lock_guard<std::mutex> lock(run->mu);
    ++run->report.join_calls;
  }
  const bool watched = workers_[WorkerOf(ranks.front())]->stream_opened;
  CallCoordinator(WorkerOf(ranks.front()), kJoinsMethod, request,
                  [this, run, kind, ranks, next = std::move(next), omitted = std::move(omitted),
                   watched](const grpc::Status& status, const std::string& bytes) {
                    std::vector<int64_t> again =
                        JoinsAnswered(run, watched, ranks, omitted, status, bytes);
                    if (!again.empty()) {  // keeps the window slot
                      JoinTogether(run, kind, std::move(again), next, /*full_state=*/true);
                    } else if (!next.empty()) {
                      JoinTogether(run, kind, next, {}, /*full_state=*/false);
                    } else {
                      window_.Release();
                    }
                  });
}

std::vector<int64_t> Driver::JoinsAnswered(const std::shared_ptr<OperationRun>& run, bool watched,
                                           const std::vector<int64_t>& ranks,
                                           const std::vector<Sent>& omitted,
                                           const grpc::Status& status, const std::string& bytes) {
  pb::JoinOperationsResponse response;
  const absl::Status whole = !status.ok() ? absl::UnavailableError(status.error_message())
                             : !response.ParseFromString(bytes) ||
                                     response.results_size() != static_cast<int>(ranks.size())
                                 ? absl::DataLossError("unreadable response")
                                 : absl::OkStatus();
  std::vector<int64_t> again;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const pb::JoinResult& result =
        whole.ok() ? response.results(static_cast<int>(i)) : pb::JoinResult::default_instance();
    const absl::Status s = whole.ok() ? FromDetail(result.status()) : whole;
    if (JoinAnswered(run, ranks[i], omitted[i], s, result.response())) {
      again.push_back(ranks[i]);
    } else if (s.ok() && !result.response().send_full_state()) {
      StartRankWait(run, ranks[i], watched);
    }
  }
  return again;
}

bool Driver::JoinAnswered(const std::shared_ptr<OperationRun>& run, int64_t rank, Sent sent,
                          const absl::Status& status, const pb::JoinOperationResponse& response) {
  std::lock_guard<std::mutex> lock(run->mu);
  if (status.ok() && response.send_full_state() && sent != Sent::kFull) {
    ++run->report.full_state_resends;
    described_[rank] = false;
    return true;
  }
  ++run->joins_answered;
  run->report.last_join_answered = absl::Now();
  if (status.ok() && !response.send_full_state()) {
    if (run->id.empty()) run->id = response.operation().id();
    if (sent == Sent::kDigest) ++run->report.joins_by_digest;
    if (sent == Sent::kClass) ++run->report.joins_by_class;
    if (sent != Sent::kDigest) described_[rank] = response.state_kept();
  } else if (run->report.join_errors++ == 0) {
    run->report.first_join_error = absl::StrCat(
        "rank ", rank, ": ",
        !status.ok()
            ? status.message()
            : "send_full_state after the full state: " + response.send_full_state_reason());
  }
  return false;
}

void Driver::TellRanksLocked(OperationRun& run, int64_t n) {
  run.report.ranks_told += n;
  if (run.report.ranks_told == options_.ranks) run.report.all_ranks_told = absl::Now();
  run.cv.notify_all();
}

void Driver::StartRankWait(const std::shared_ptr<OperationRun>& run, int64_t rank, bool watched) {
  if (options_.rank_waits == RankWaits::kNone) return;
  if (options_.rank_waits == RankWaits::kPerRank) {
    WaitRank(run, rank);
    return;
  }
  const int64_t worker = WorkerOf(rank);
  {
    std::lock_guard<std::mutex> lock(run->mu);
    OperationRun::WorkerWait& wait = run->worker_waits[worker];
    if (wait.ended) {  // the worker already knows the end: the rank is told at once
      TellRanksLocked(*run, 1);
      return;
    }
    ++wait.waiting;
    // Joined while the worker's stream was open: the stream brings the end (EndedOnStream).
    if (options_.rank_waits == RankWaits::kStream && watched) return;
    if (wait.started) return;
    wait.started = true;
  }
  WaitWorker(run, worker);
}

void Driver::EndedOnStream(int64_t worker, const pb::OperationStatus& status) {
  std::shared_ptr<OperationRun> run;
  {
    std::lock_guard<std::mutex> lock(current_mu_);
    run = current_;
  }
  if (run == nullptr) return;
  std::lock_guard<std::mutex> lock(run->mu);
  if (run->id != status.id()) return;
  ++run->report.ends_on_streams;
  if (options_.rank_waits != RankWaits::kStream) return;  // the ranks wait by WaitOperation
  OperationRun::WorkerWait& wait = run->worker_waits[worker];
  if (wait.ended) return;
  wait.ended = true;
  TellRanksLocked(*run, wait.waiting);
  wait.waiting = 0;
}

void Driver::WaitWorker(const std::shared_ptr<OperationRun>& run, int64_t worker) {
  WaitUntilFinal(run, worker, [this, run, worker] {
    std::lock_guard<std::mutex> lock(run->mu);
    OperationRun::WorkerWait& wait = run->worker_waits[worker];
    wait.ended = true;
    TellRanksLocked(*run, wait.waiting);
    wait.waiting = 0;
  });
}

void Driver::WaitRank(const std::shared_ptr<OperationRun>& run, int64_t rank) {
  WaitUntilFinal(run, WorkerOf(rank), [this, run] {
    std::lock_guard<std::mutex> lock(run->mu);
    TellRanksLocked(*run, 1);
  });
}

void Driver::WaitUntilFinal(const std::shared_ptr<OperationRun>& run, int64_t worker,
                            std::function<void()> ended) {
  pb::WaitOperationRequest request;
  {
    std::lock_guard<std::mutex> lock(run->mu);
    request.set_operation_id(run->id);
    ++run->report.wait_calls;
  }
  request.set_timeout_ms(absl::ToInt64Milliseconds(options_.wait_slice));
  AsyncUnary<pb::OperationStatus>(
      *loop_, options_.wait_slice + options_.rpc_timeout,
      [this, request, worker](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
        return StubOf(worker)->PrepareAsyncWaitOperation(c, request, cq);
      },
      [this, run, worker, ended = std::move(ended)](const grpc::Status& s,
                                                    pb::OperationStatus& status) mutable {
        if (s.ok() && !IsFinal(status.phase()) && !stopping_) {
          WaitUntilFinal(run, worker, std::move(ended));
          return;
        }
        ended();
      });
}

bool Driver::WaitFinal(const std::string& id, pb::OperationStatus* status) {
  const absl::Time deadline = absl::Now() + options_.operation_timeout;
  while (absl::Now() < deadline && CoordinatorAlive()) {
    pb::WaitOperationRequest request;
    request.set_operation_id(id);
    request.set_timeout_ms(absl::ToInt64Milliseconds(absl::Seconds(2)));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2) + options_.rpc_timeout));
    grpc::Status s = stubs_[0]->WaitOperation(&context, request, status);
    if (s.ok() && IsFinal(status->phase())) return true;
    if (!s.ok() && s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return false;
    }
  }
  return false;
}

void Driver::JoinEveryRank(const std::shared_ptr<OperationRun>& run, const std::string& kind) {
  if (options_.per_rank_joins) {
    for (int64_t r = 0; r < options_.ranks; ++r) {
      window_.Acquire();
      Join(run, kind, r);
    }
    return;
  }
  // A worker's ranks arrive together (worker/coordinator_joins): all in one call, its first
  // join having lingered for the others; without the linger, the first goes alone and the
  // rest, queued behind it, go in the next call.
  for (int64_t first = 0; first < options_.ranks;) {
    int64_t end = first + 1;
    while (end < options_.ranks && WorkerOf(end) == WorkerOf(first)) ++end;
    std::vector<int64_t> now, rest;
    for (int64_t r = first; r < end; ++r) {
      (options_.join_linger || r == first ? now : rest).push_back(r);
    }
    window_.Acquire();
    JoinTogether(run, kind, std::move(now), std::move(rest), /*full_state=*/false);
    first = end;
  }
}

OperationReport Driver::RunOperation(const std::string& kind, const std::string& path) {
  auto run = std::make_shared<OperationRun>();
  run->path = path;
  run->join_common = JoinCommonBytes(*run, kind);
  run->report.kind = kind;
  run->report.path = path;
  run->worker_waits.resize(options_.workers);
  {
    std::lock_guard<std::mutex> lock(current_mu_);
    current_ = run;
  }
  if (sampler_) {
    run->report.coordinator_before = sampler_->SampleNow();
    sampler_->ResetPeaks();
  }
  const double cpu_before = CpuSecondsOfSelf();
  run->report.start = absl::Now();
  JoinEveryRank(run, kind);
  window_.Drain();
  std::string id;
  {
    std::lock_guard<std::mutex> lock(run->mu);
    id = run->id;
  }
  pb::OperationStatus status;
  if (id.empty()) {
    run->report.phase = "not started";
  } else if (!WaitFinal(id, &status)) {
    run->report.phase = CoordinatorAlive() ? "timed out" : "coordinator died";
    run->report.final_seen = absl::Now();
  } else {
    run->report.final_seen = absl::Now();
    run->report.phase = PhaseName(status.phase());
    if (status.status().code() != 0) run->report.status = status.status().message();
    if (options_.rank_waits != RankWaits::kNone) {
      std::unique_lock<std::mutex> lock(run->mu);
      run->cv.wait_for(
          lock, absl::ToChronoNanoseconds(options_.rpc_timeout + options_.wait_slice),
          [&] { return run->report.ranks_told + run->report.join_errors >= options_.ranks; });
    }
  }
  run->report.loadgen_cpu_seconds = CpuSecondsOfSelf() - cpu_before;
  if (sampler_) {
    run->report.coordinator_after = sampler_->SampleNow();
    run->report.coordinator_peak_threads = sampler_->Peak().threads;
    run->report.coordinator_cpu = sampler_->CpuTimeline();
    run->report.loadgen_cpu = self_sampler_->CpuTimeline();
  }
  std::lock_guard<std::mutex> lock(run->mu);
  run->report.id = id;
  if (!options_.coordinator_log.empty() && !id.empty()) {
    std::ifstream in(options_.coordinator_log);
    std::stringstream text;
    text << in.rdbuf();
    const std::map<std::string, OperationLogTimes> times = ParseCoordinatorLog(text.str());
    if (auto it = times.find(id); it != times.end()) {
      run->report.log_gathered = it->second.gathered;
      run->report.log_planned = it->second.planned;
      run->report.log_committed = it->second.committed;
      run->report.log_done = it->second.done;
      run->report.plan_reused = it->second.plan_reused;
      run->report.planner_seconds = it->second.planner_seconds;
      run->report.planner_cpu_seconds = it->second.planner_cpu_seconds;
      if (run->report.status.empty() && !it->second.abort_line.empty()) {
        run->report.status = it->second.abort_line;
      }
    }
  }
  return run->report;
}

void Driver::Stop() {
  if (stopping_.exchange(true)) return;
  heartbeat_cv_.notify_all();
  if (heartbeats_.joinable()) heartbeats_.join();
  executor_.reset();  // runs what is queued (its reports go out on the loop)
  for (auto& w : workers_) w->watch_context.TryCancel();
  {
    std::unique_lock<std::mutex> lock(streams_mu_);
    streams_cv_.wait(lock, [this] { return open_streams_ == 0; });
  }
  stream_loops_.clear();
  loop_.reset();  // waits for every call in flight (each has a deadline)
}

absl::StatusOr<LoadgenReport> Driver::Run() {
  LoadgenReport report;
  report.parallelism = layout_.parallelism();
  Describe(&report);
  if (report.shards_total == 0) {
    return absl::InternalError("describing the ranks failed (see RankState)");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  const int channels = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(options_.channels, options_.workers)));
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments unique = args;
    unique.SetInt("ckpt.loadgen_channel", c);  // a connection of its own per channel
    channels_.push_back(grpc::CreateCustomChannel(options_.coordinator,
                                                  grpc::InsecureChannelCredentials(), unique));
    stubs_.push_back(pb::Coordinator::NewStub(channels_.back()));
    generic_.push_back(std::make_unique<grpc::GenericStub>(channels_.back()));
  }
  loop_ = std::make_unique<CompletionLoop>(options_.cq_threads);
  for (int i = 0; i < kStreamLoops; ++i) {
    stream_loops_.push_back(std::make_unique<CompletionLoop>(/*threads=*/1));
  }
  executor_ = std::make_unique<Executor>(options_.executor_threads);
  if (options_.coordinator_pid > 0) {
    sampler_ = std::make_unique<ProcSampler>(options_.coordinator_pid, absl::Milliseconds(100),
                                             options_.on_coordinator_sample);
    self_sampler_ = std::make_unique<ProcSampler>(getpid(), absl::Milliseconds(100));
  }
  report.load_average_start = ReadLoadAverage();
  if (options_.coordinator_pid > 0) {
    report.coordinator_grpc_library = ReadMappedLibraryPath(options_.coordinator_pid, "libgrpc.so");
  }
  report.loadgen_grpc_library = ReadMappedLibraryPath(/*pid=*/0, "libgrpc.so");
  absl::Time t = absl::Now();
  if (absl::Status s = RegisterWorkers(); !s.ok()) return s;
  report.register_time = absl::Now() - t;
  t = absl::Now();
  if (absl::Status s = AttachRanks(); !s.ok()) return s;
  report.attach_time = absl::Now() - t;
  int saves = 0;
  std::string last_saved = options_.checkpoint;
  for (const std::string& kind : options_.operations) {
    if (kind == "save") last_saved = SavePath(options_, saves++);
    report.operations.push_back(RunOperation(kind, last_saved));
    const std::string& phase = report.operations.back().phase;
    if (phase != "done") break;  // later operations depend on this one
  }
  if (sampler_) {
    const double cpu = sampler_->SampleNow().cpu_seconds;
    report.coordinator_peak = sampler_->AllTimePeak();
    report.coordinator_peak.cpu_seconds = cpu;
  }
  Stop();
  report.load_average_end = ReadLoadAverage();
  report.heartbeat_errors = heartbeat_errors_;
  report.stream_errors = stream_errors_;
  report.report_errors = report_errors_;
  return report;
}

std::string Seconds(absl::Time from, absl::Time to) {
  if (from == absl::InfinitePast() || to == absl::InfinitePast()) return "-";
  return absl::StrFormat("%.3f", absl::ToDoubleSeconds(to - from));
}

// "<kind> <process>_cpu_s gather G plan P dispatch D execute E commit C": the process's CPU
// seconds (from `readings`) over the same phases as the "seconds" line ("-" where unknown).
std::string PhaseCpuLine(const OperationReport& op, absl::string_view process,
                         const std::vector<CpuReading>& readings) {
  auto cpu = [&](absl::Time from, absl::Time to) -> std::string {
    const double c = CpuBetween(readings, from, to);
    return c < 0 ? "-" : absl::StrFormat("%.2f", c);
  };
  return absl::StrFormat("%s %s_cpu_s gather %s plan %s dispatch %s execute %s commit %s\n",
                         op.kind, process, cpu(op.start, op.log_gathered),
                         cpu(op.log_gathered, op.log_planned), cpu(op.log_planned, op.last_plan),
                         cpu(op.last_plan, op.last_result_sent),
                         op.kind == "save" ? cpu(op.last_result_sent, op.log_committed) : "-");
}

std::string MiB(int64_t bytes) {
  return absl::StrFormat("%.1f", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

absl::StatusOr<RankWaits> ParseRankWaits(const std::string& text) {
  if (text == "stream") return RankWaits::kStream;
  if (text == "per-worker") return RankWaits::kPerWorker;
  if (text == "per-rank") return RankWaits::kPerRank;
  if (text == "none") return RankWaits::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--rank-waits: \"", text, "\" is none of stream, per-worker, per-rank, none"));
}

absl::StatusOr<LoadgenReport> RunLoadgen(const LoadgenOptions& options,
                                         const GptPipelineLayout& layout) {
  if (options.ranks != layout.world_size() || options.workers < 1 ||
      options.workers > options.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 1 <= workers (", options.workers, ") <= ranks (", options.ranks,
                     ") and ranks = the layout's world size (", layout.world_size(), ")"));
  }
  Driver driver(options, layout);
  return driver.Run();
}

std::string SavePath(const LoadgenOptions& options, int n) {
  return n == 0 ? options.checkpoint : absl::StrCat(options.checkpoint, "-", n + 1);
}

// The report's lines about the whole run: the coordinator's peaks, errors, the machine's load
// and which gRPC libraries ran.
std::string FormatRunLines(const LoadgenReport& report) {
  std::string out =
      absl::StrFormat("coordinator peak_rss_mib %s peak_threads %d cpu_s %.2f\n",
                      MiB(report.coordinator_peak.peak_rss_bytes), report.coordinator_peak.threads,
                      report.coordinator_peak.cpu_seconds);
  absl::StrAppend(
      &out, absl::StrFormat("errors heartbeat %d watch_stream %d report_result %d\n",
                            report.heartbeat_errors, report.stream_errors, report.report_errors));
  absl::StrAppend(&out, absl::StrFormat("machine load_average_1m start %.2f end %.2f\n",
                                        report.load_average_start, report.load_average_end));
  auto known = [](const std::string& path) { return path.empty() ? "unknown" : path; };
  absl::StrAppend(&out, absl::StrFormat("grpc coordinator %s loadgen %s\n",
                                        known(report.coordinator_grpc_library),
                                        known(report.loadgen_grpc_library)));
  return out;
}

std::string FormatReport(const LoadgenOptions& options, const LoadgenReport& report) {
  std::string out;
  const Parallelism& p = report.parallelism;
  absl::StrAppend(
      &out, absl::StrFormat("ranks %d workers %d hosts %d tp %d pp %d dp %d\n", options.ranks,
                            options.workers, options.hosts > 0 ? options.hosts : options.workers,
                            p.tp, p.pp, p.dp));
  absl::StrAppend(
      &out, absl::StrFormat("shards_per_rank_max %d shards_total %d compact %d state_mib %s\n",
                            report.shards_per_rank_max, report.shards_total, report.compact_total,
                            MiB(report.state_bytes_total)));
  absl::StrAppend(&out, absl::StrFormat("setup_s describe %.3f register %.3f attach %.3f\n",
                                        absl::ToDoubleSeconds(report.describe_time),
                                        absl::ToDoubleSeconds(report.register_time),
                                        absl::ToDoubleSeconds(report.attach_time)));
  for (const OperationReport& op : report.operations) {
    absl::StrAppend(&out, absl::StrFormat("%s id %s phase %s%s\n", op.kind, op.id, op.phase,
                                          op.status.empty() ? "" : " status " + op.status));
    absl::StrAppend(&out, absl::StrFormat("%s joins_by_digest %d full_state_resends %d "
                                          "plan_reused %d joins_by_class %d\n",
                                          op.kind, op.joins_by_digest, op.full_state_resends,
                                          op.plan_reused ? 1 : 0, op.joins_by_class));
    if (op.join_errors > 0) {
      absl::StrAppend(&out, absl::StrFormat("%s join_errors %d first \"%s\"\n", op.kind,
                                            op.join_errors, op.first_join_error));
    }
    // Phases: gather = first join sent .. the coordinator logged "gathered" (last join
    // recorded); plan = gathered .. planned; dispatch = planned .. the last part arrived here;
    // execute = .. the last result was sent (the loadgen's own work); commit = .. committed
    // (saves); notify = done .. every rank's wait returned.
    const absl::Time plan_end = op.log_planned;
    const absl::Time exec_end = op.last_result_sent;
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "%s seconds gather %s plan %s dispatch %s execute %s commit %s "
            "notify %s total %s\n",
            op.kind, Seconds(op.start, op.log_gathered), Seconds(op.log_gathered, op.log_planned),
            Seconds(plan_end, op.last_plan), Seconds(op.last_plan, exec_end),
            op.kind == "save" ? Seconds(exec_end, op.log_committed) : "-",
            Seconds(op.log_done, op.all_ranks_told),
            Seconds(op.start, op.all_ranks_told != absl::InfinitePast() ? op.all_ranks_told
                                                                        : op.final_seen)));
    absl::StrAppend(&out, PhaseCpuLine(op, "coordinator", op.coordinator_cpu));
    if (!op.loadgen_cpu.empty()) absl::StrAppend(&out, PhaseCpuLine(op, "loadgen", op.loadgen_cpu));
    auto planner = [](double seconds) {
      return seconds < 0 ? std::string("-") : absl::StrFormat("%.3f", seconds);
    };
    absl::StrAppend(&out,
                    absl::StrFormat("%s planner_s %s planner_cpu_s %s\n", op.kind,
                                    planner(op.planner_seconds), planner(op.planner_cpu_seconds)));
    absl::StrAppend(&out, absl::StrFormat("%s waits ranks_told %d wait_calls %d ends_on_streams %d "
                                          "snapshot_calls %d join_calls %d\n",
                                          op.kind, op.ranks_told, op.wait_calls, op.ends_on_streams,
                                          op.snapshot_calls, op.join_calls));
    absl::StrAppend(
        &out, absl::StrFormat("%s joins_answered_s %s first_plan_s %s plan_parts %d "
                              "plan_mib %s max_part_mib %s files %d plan_bytes %d\n",
                              op.kind, Seconds(op.start, op.last_join_answered),
                              Seconds(op.start, op.first_plan), op.plan_parts, MiB(op.plan_bytes),
                              MiB(op.max_plan_part), op.files_written, op.plan_bytes));
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%s coordinator cpu_s %.2f peak_threads %d rss_mib_after %s loadgen_cpu_s %.2f\n",
                  op.kind, op.coordinator_after.cpu_seconds - op.coordinator_before.cpu_seconds,
                  op.coordinator_peak_threads, MiB(op.coordinator_after.rss_bytes),
                  op.loadgen_cpu_seconds));
  }
  absl::StrAppend(&out, FormatRunLines(report));
  return out;
}

}  // namespace ckpt::loadgen
