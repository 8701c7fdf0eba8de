// The coordinator's long-lived calls as gRPC callback reactors: a WatchWork stream and a
// WaitOperation call hold no thread while they wait. Each is registered with the service
// (under its mutex) and woken by WakeWaiters on every change of state; the ticker wakes them
// for deadlines, lost workers and shutdown. Everything a reactor shares with the service is
// guarded by the service's mutex, and a reactor leaves the service's lists before it is
// deleted (OnDone), so the service only ever touches live reactors.
#include <deque>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/operation_wire.h"
#include "coordinator/request_bounds.h"
#include "proto/status_detail.h"

namespace ckpt::coordinator {

// One worker's WatchWork stream: writes the plan parts of its ranks once each (and the aborts
// of operations that ended after the stream opened), one write at a time, in order.
class CoordinatorService::WorkWatcher final : public grpc::ServerWriteReactor<pb::WorkItem> {
 public:
  WorkWatcher(CoordinatorService* service, std::string worker_id)
      : service_(service), worker_id_(std::move(worker_id)), started_(service->clock_->Now()) {}

  // Queues what is new for the worker and writes it, or finishes when the stream is over
  // (shutdown, worker unknown or dead). `index`: the operations changed, and these are the
  // joined ranks of every worker (null: they did not; the first refresh scans on its own).
  // Requires the service's mutex.
  void Refresh(const RanksByWorker* index) {
    if (finish_requested_) return;
    if (absl::Status over = Over(); !over.ok()) {
      RequestFinish(ToGrpcStatus(over));
      return;
    }
    if (index != nullptr) {
      auto own = index->find(worker_id_);
      if (own != index->end()) CollectItems(own->second);
    } else if (first_) {
      QueueStreamOpened();
      RanksByWorker scanned = service_->IndexRanks(worker_id_);
      CollectItems(scanned[worker_id_]);
    }
    first_ = false;
    CollectPersistItems();
    CollectMemoryRecords();
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(service_->mu_);
    writing_ = false;
    pending_.pop_front();
    if (!ok) {
      DropQueued();
      RequestFinish(grpc::Status::CANCELLED);
      return;
    }
    WriteNext();
  }

  // A newer stream for the same worker replaced this one: it ends (Aborted) once what was
  // queued is written. Requires the service's mutex.
  void Supersede() {
    RequestFinish(ToGrpcStatus(absl::AbortedError(
        absl::StrCat("a newer WatchWork stream for worker ", worker_id_, " replaced this one"))));
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(service_->mu_);
    DropQueued();  // a write in flight fails and then finishes the stream
    RequestFinish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(service_->mu_);
      service_->watchers_.erase(this);
      auto own = service_->stream_of_worker_.find(worker_id_);
      if (own != service_->stream_of_worker_.end() && own->second == this) {
        service_->stream_of_worker_.erase(own);
      }
    }
    delete this;
  }

 private:
  // Why the stream ends now; OK while it goes on.
  absl::Status Over() const {
    if (service_->shutting_down_) return absl::UnavailableError("coordinator is shutting down");
    const WorkerRecord* w = service_->workers_.Find(worker_id_);
    if (w == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("worker ", worker_id_, " is not registered with this coordinator ",
                       "(incarnation ", service_->incarnation_hex_, "); register again"));
    }
    if (!w->alive) {
      return absl::FailedPreconditionError(absl::StrCat(w->DebugString(), " was declared dead (",
                                                        w->death_cause, "); register again"));
    }
    return absl::OkStatus();
  }

  // Queues the stream's first message: the ends of operations from now on come on it.
  void QueueStreamOpened() {
    pb::WorkItem item;
    item.set_incarnation(service_->incarnation_);
    item.set_rank(-1);
    item.set_stream_opened(true);
    pending_.push_back(Queued{std::move(item), {}});
  }

  // Queues the plan parts and aborts of the worker's ranks (`ranks`) not sent yet, and the
  // end of each of their operations that ended after the stream opened (once per operation).
  // Runs for every watcher on every phase change: a rank with nothing to send costs a few
  // comparisons, and its item is built only when something goes.
  void CollectItems(const std::vector<std::pair<const Operation*, int>>& ranks) {
    for (const auto& [op, r] : ranks) {
      const RankEntry& e = op->ranks[r];
      if (op->phase == Phase::kExecuting) {
        if (e.has_plan && !e.result.has_value() && plans_sent_.insert({op->id, r}).second) {
          QueuePart(NewItem(*op, r), e);
        }
        continue;  // executing: neither aborted nor ended
      }
      if (!IsFinal(op->phase) || op->finished < started_) continue;
      if (op->phase == Phase::kAborted && aborts_sent_.insert({op->id, r}).second) {
        pb::WorkItem abort = NewItem(*op, r);
        *abort.mutable_abort() = ToDetail(op->status);
        pending_.push_back(Queued{std::move(abort), {}});
      }
      if (ends_sent_.insert(op->id).second) {
        pb::WorkItem end = NewItem(*op, r);
        *end.mutable_ended() = service_->FinalStatus(*op);
        pending_.push_back(Queued{std::move(end), {}});
      }
    }
  }

  // A work item about rank `r` of `op`, with what every item names.
  pb::WorkItem NewItem(const Operation& op, int r) const {
    const RankEntry& e = op.ranks[r];
    pb::WorkItem item;
    item.set_operation_id(op.id);
    item.set_incarnation(service_->incarnation_);
    item.set_job(op.job);
    item.set_rank(r);
    item.set_kind(e.serving ? pb::OPERATION_RECEIVE : ToProto(op.kind));
    item.set_path(op.path);
    if (e.serving) item.set_serving_source(e.serving_source);
    return item;
  }

  // Queues the background-persistence items for this worker not sent on this stream yet.
  void CollectPersistItems() {
    if (service_->persist_ == nullptr) return;
    for (PersistItem& p : service_->persist_->ItemsFor(worker_id_, persist_sent_)) {
      persist_sent_.insert(p.key);
      p.item.set_incarnation(service_->incarnation_);
      pending_.push_back(Queued{std::move(p.item), {}});
    }
  }

  // Queues the records of committed memory checkpoints this worker holds files of.
  void CollectMemoryRecords() {
    if (service_->memory_catalog_ == nullptr) return;
    for (RecordItem& r : service_->memory_catalog_->RecordsFor(worker_id_, records_sent_)) {
      records_sent_.insert(r.key);
      pb::WorkItem item;
      item.set_incarnation(service_->incarnation_);
      item.set_rank(-1);
      item.set_path(absl::StrCat("mem://", r.record.name()));
      *item.mutable_memory_record() = std::move(r.record);
      pending_.push_back(Queued{std::move(item), {}});
    }
  }

  // Forgets the queued items, except the one being written (gRPC holds it until OnWriteDone).
  void DropQueued() {
    while (pending_.size() > (writing_ ? 1u : 0u)) pending_.pop_back();
  }

  // Starts the next write unless one is in flight; finishes once a requested finish has
  // nothing left to write.
  void WriteNext() {
    if (writing_ || finished_) return;
    if (!pending_.empty()) {
      writing_ = true;
      Queued next = std::move(pending_.front());
      pending_.pop_front();
      size_t bytes = Materialize(next);
      // Items queued behind it go in the same message (WorkItem.batched), up to a bound.
      while (!pending_.empty() && next.item.batched_size() < kMaxBatched &&
             bytes < kMaxBatchBytes) {
        Queued more = std::move(pending_.front());
        pending_.pop_front();
        bytes += Materialize(more);
        *next.item.add_batched() = std::move(more.item);
      }
      pending_.push_front(std::move(next));  // in flight until OnWriteDone pops it
      StartWrite(&pending_.front().item);
    } else if (finish_requested_) {
      finished_ = true;
      Finish(final_status_);
    }
  }

  // Finishes with `status` once the writes queued before it are out (at once when cancelled:
  // the queue was dropped).
  void RequestFinish(grpc::Status status) {
    if (!finish_requested_) {
      finish_requested_ = true;
      final_status_ = std::move(status);
    }
    WriteNext();
  }

  // At most this many items, or past this many plan part bytes, are batched in one write.
  static constexpr int kMaxBatched = 63;
  static constexpr size_t kMaxBatchBytes = size_t{1} << 20;

  // An item to write, and the plan part it carries (shared with the operation until written).
  struct Queued {
    pb::WorkItem item;
    PlanPartBytes part;
    bool tail_only = false;  // the worker keeps the part's body: send its tail
  };

  // Copies `q`'s plan part bytes into its item (only now: queuing every rank's part at once,
  // all workers' streams when a plan is set, held a whole copy of the plan); returns them.
  static size_t Materialize(Queued& q) {
    if (!q.part.empty()) q.item.set_plan_part(q.tail_only ? q.part.TailBytes() : q.part.Bytes());
    q.part = PlanPartBytes();
    return q.item.plan_part().size();
  }

  // Queues rank entry `e`'s plan part: by reference (its tail) when the rank's worker said it
  // keeps the part's named body, else whole, naming its body for the worker to keep.
  void QueuePart(pb::WorkItem item, const RankEntry& e) {
    const std::string& body = e.plan_part.body_id();
    const bool tail_only = !body.empty() && e.held_plan_part_body == body;
    if (!body.empty()) {
      item.set_plan_part_body_id(body);
      item.set_plan_part_by_reference(tail_only);
      if (!tail_only) item.set_plan_part_body_size(static_cast<int64_t>(e.plan_part.body_size()));
    }
    pending_.push_back(Queued{std::move(item), e.plan_part, tail_only});
  }

  CoordinatorService* const service_;
  const std::string worker_id_;
  const absl::Time started_;
  // All below: guarded by service_->mu_.
  bool first_ = true;
  std::set<std::pair<std::string, int>> plans_sent_;   // (operation, rank)
  std::set<std::pair<std::string, int>> aborts_sent_;  // (operation, rank)
  std::set<std::string> ends_sent_;                    // operations
  std::set<std::string> persist_sent_;                 // PersistItem keys
  std::set<std::string> records_sent_;                 // RecordItem keys
  std::deque<Queued> pending_;                         // front: in flight while writing_
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finished_ = false;
  grpc::Status final_status_;
};

// One WaitOperation call: answers the operation's status when it ended, at the deadline, when
// the client cancels or at shutdown; NotFound once the operation is pruned.
class CoordinatorService::OperationWaiter final : public grpc::ServerUnaryReactor {
 public:
  OperationWaiter(CoordinatorService* service, std::string operation_id, absl::Time deadline,
                  pb::OperationStatus* response)
      : service_(service),
        operation_id_(std::move(operation_id)),
        deadline_(deadline),
        response_(response) {}

  const std::string& operation_id() const { return operation_id_; }
  absl::Time deadline() const { return deadline_; }

  // Finishes when the wait is over (`cancelled`: it is), leaving the service's list first
  // (gRPC may delete a finished reactor at once); returns whether it finished. Requires the
  // service's mutex; the caller must not touch a finished waiter.
  bool FinishIfOver(bool cancelled) {
    const Operation* op = service_->jobs_.FindOperation(operation_id_);
    if (op == nullptr) {
      Unregister();
      Finish(ToGrpcStatus(absl::NotFoundError(
          absl::StrCat("operation ", operation_id_, " is unknown to this coordinator (incarnation ",
                       service_->incarnation_hex_,
                       "): long finished, or run by a coordinator process since restarted"))));
      return true;
    }
    if (IsFinal(op->phase) || service_->clock_->Now() >= deadline_ || service_->shutting_down_ ||
        cancelled) {
      if (IsFinal(op->phase)) {
        *response_ = service_->FinalStatus(*op);
      } else {
        ToProto(*op, response_);
      }
      Unregister();
      Finish(grpc::Status::OK);
      return true;
    }
    return false;
  }

  // Registers this waiter in the service's lists (by operation and by deadline). Requires the
  // service's mutex.
  void Register() {
    registration_ = service_->waiters_.emplace(operation_id_, this);
    deadline_registration_ = service_->wait_deadlines_.emplace(deadline_, this);
    registered_ = true;
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(service_->mu_);
    if (registered_) FinishIfOver(/*cancelled=*/true);  // else it has finished already
  }

  void OnDone() override { delete this; }

 private:
  CoordinatorService* const service_;
  const std::string operation_id_;
  const absl::Time deadline_;
  pb::OperationStatus* const response_;
  // Leaves the service's list (if on it). Requires the service's mutex.
  void Unregister() {
    if (!registered_) return;
    service_->waiters_.erase(registration_);
    service_->wait_deadlines_.erase(deadline_registration_);
    registered_ = false;
  }

  // Guarded by service_->mu_.
  bool registered_ = false;
  std::multimap<std::string, OperationWaiter*>::iterator registration_;
  std::multimap<absl::Time, OperationWaiter*>::iterator deadline_registration_;
};

grpc::ServerWriteReactor<pb::WorkItem>* CoordinatorService::WatchWork(
    grpc::CallbackServerContext* context, const pb::WatchWorkRequest* request) {
  auto* watcher = new WorkWatcher(this, request->worker_id());
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kWorker}, "WatchWork");
  if (peer.ok()) {
    if (absl::Status s = CheckWatchWork(*request); !s.ok()) {
      watcher->Finish(Refuse(s, *peer));
      return watcher;  // never registered: OnDone finds nothing to erase
    }
  }
  absl::Status allowed = peer.ok() ? ActsForWorker(*peer, request->worker_id()) : peer.status();
  if (!allowed.ok()) {
    watcher->Finish(ToGrpcStatus(allowed));
    return watcher;  // never registered: OnDone finds nothing to erase
  }
  // One stream per worker: the newer replaces the older (a worker that reconnects while its
  // old connection is not yet known dead), so one worker id never holds more than one.
  WorkWatcher*& current = stream_of_worker_[request->worker_id()];
  if (current != nullptr) current->Supersede();
  current = watcher;
  watchers_.insert(watcher);
  watcher->Refresh(/*index=*/nullptr);
  return watcher;
}

grpc::ServerUnaryReactor* CoordinatorService::WaitOperation(grpc::CallbackServerContext* context,
                                                            const pb::WaitOperationRequest* request,
                                                            pb::OperationStatus* response) {
  absl::Time deadline = std::min(clock_->Now() + absl::Milliseconds(request->timeout_ms()),
                                 absl::FromChrono(context->deadline()));
  auto* waiter = new OperationWaiter(this, request->operation_id(), deadline, response);
  absl::StatusOr<Peer> peer =
      AuthorizeCall(*context, {Role::kWorker, Role::kOperator}, "WaitOperation");
  if (!peer.ok()) {
    waiter->Finish(ToGrpcStatus(peer.status()));
    return waiter;
  }
  if (absl::Status s = CheckWaitOperation(*request); !s.ok()) {
    waiter->Finish(Refuse(s, *peer));
    return waiter;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (waiter->FinishIfOver(/*cancelled=*/false)) return waiter;
  waiter->Register();
  // The ticker ends the wait at its deadline; wake it if it would sleep past that.
  if (deadline < ticker_sleeps_until_) ticker_wake_.notify_all();
  return waiter;
}

void CoordinatorService::WakeWaiters(bool all) {
  // One lookup per operation, not per waiter, and the waits of an ongoing operation are
  // skipped as a group: every tick (and every wait's deadline) comes here, and walking every
  // wait made the ticker O(waits) per wake and O(waits^2) per operation, under the lock.
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    const Operation* op = jobs_.FindOperation(it->first);
    const auto group_end = waiters_.upper_bound(it->first);
    const bool ongoing = op != nullptr && !IsFinal(op->phase) && !shutting_down_;
    if (ongoing) {
      it = group_end;  // nothing to tell this operation's waiters yet (deadlines: below)
      continue;
    }
    while (it != group_end) {
      OperationWaiter* waiter = it->second;
      ++it;  // before the waiter may erase itself
      waiter->FinishIfOver(/*cancelled=*/false);
    }
  }
  if (all) ExpireWaits();
  const bool scan = jobs_.phase_version() != watchers_version_;
  watchers_version_ = jobs_.phase_version();
  if ((!all && !scan) || watchers_.empty()) return;
  // One pass over the ranks for all watchers, not one per watcher (1,280 workers x 10,240
  // ranks held the lock for seconds on each phase change).
  RanksByWorker index;
  if (scan) index = IndexRanks();
  for (WorkWatcher* watcher : watchers_) watcher->Refresh(scan ? &index : nullptr);
}

void CoordinatorService::ExpireWaits() {
  // Earliest first; each finished wait leaves wait_deadlines_.
  const absl::Time now = clock_->Now();
  while (!wait_deadlines_.empty() && wait_deadlines_.begin()->first <= now) {
    if (!wait_deadlines_.begin()->second->FinishIfOver(/*cancelled=*/false)) break;
  }
}

CoordinatorService::RanksByWorker CoordinatorService::IndexRanks(
    const std::optional<std::string>& only) const {
  RanksByWorker index;
  for (const Operation* op : jobs_.Operations()) {
    for (int r = 0; r < static_cast<int>(op->ranks.size()); ++r) {  // serving ranks too
      const RankEntry& e = op->ranks[r];
      if (!e.joined || (only.has_value() && e.location.worker_id != *only)) continue;
      index[e.location.worker_id].emplace_back(op, r);
    }
  }
  return index;
}

absl::Time CoordinatorService::EarliestWaitDeadline() const {
  return wait_deadlines_.empty() ? absl::InfiniteFuture() : wait_deadlines_.begin()->first;
}

size_t CoordinatorService::open_watchers() {
  std::lock_guard<std::mutex> lock(mu_);
  return watchers_.size();
}

size_t CoordinatorService::open_waits() {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

}  // namespace ckpt::coordinator
