#include "coordinator/persist_driver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::coordinator {
namespace {

constexpr size_t kEndedKept = 64;  // PersistEnded notices remembered per worker

// The flight id of an item key "<flight>/<n>".
std::string FlightOf(const std::string& key) { return key.substr(0, key.rfind('/')); }

}  // namespace

void PersistDriver::Enqueue(PersistRequest request) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string id = incarnation_.empty()
                             ? absl::StrCat("persist-", next_flight_++)
                             : absl::StrCat("persist-", incarnation_, "-", next_flight_++);
  Flight& flight = flights_[id];
  flight.id = id;
  flight.request = std::move(request);
}

bool PersistDriver::HasSteps() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, flight] : flights_) {
    if (flight.step == Step::kBegin || flight.step == Step::kCommit ||
        flight.step == Step::kAbort) {
      return true;
    }
  }
  return false;
}

size_t PersistDriver::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flights_.size();
}

std::vector<std::string> PersistDriver::RunSteps() {
  std::vector<std::string> log;
  while (true) {
    std::string id;
    Step step = Step::kBusy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [fid, flight] : flights_) {
        if (flight.step == Step::kBegin || flight.step == Step::kCommit ||
            flight.step == Step::kAbort) {
          id = fid;
          step = flight.step;
          flight.step = Step::kBusy;  // reports and failures wait (see dead_)
          break;
        }
      }
    }
    if (id.empty()) return log;
    log.push_back(step == Step::kBegin ? RunBegin(id) : RunEnd(id, step));
  }
}

std::string PersistDriver::RunBegin(const std::string& id) {
  PersistRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request = flights_.at(id).request;
  }
  // Storage I/O (the staging directory) happens here, unlocked.
  absl::StatusOr<MemoryCheckpoint> checkpoint = catalog_->Find(request.name);
  if (checkpoint.ok() && request.recovered && IsPersistedAt(*checkpoint, request.path)) {
    std::lock_guard<std::mutex> lock(mu_);
    Flight& flight = flights_.at(id);
    for (const auto& [file, holders] : checkpoint->holders) {
      for (const MemoryHolder& h : holders) flight.holders.insert(h.worker_id);
    }
    FinishLocked(flight, PersistState::kPersisted, "");
    return absl::StrCat("persist_committed checkpoint=mem://", request.name, " path=", request.path,
                        " (committed before the coordinator restarted)");
  }
  absl::StatusOr<std::unique_ptr<MemoryPersist>> persist = BeginStaging(id, checkpoint, request);
  std::lock_guard<std::mutex> lock(mu_);
  Flight& flight = flights_.at(id);
  if (!persist.ok()) {
    const std::string why(persist.status().message());
    FinishLocked(flight, PersistState::kFailed, why);
    return absl::StrCat("persist_failed checkpoint=mem://", request.name, " path=", request.path,
                        " error=\"", why, "\"");
  }
  flight.persist = *std::move(persist);
  flight.step = Step::kRunning;
  flight.manifest = checkpoint->manifest.SerializeAsString();
  for (const auto& [file, holders] : checkpoint->holders) {
    for (const MemoryHolder& h : holders) flight.holders.insert(h.worker_id);
  }
  QueueWork(flight, flight.persist->pending());
  // Workers lost while the staging directory was made: their files move on now.
  for (const std::string& dead : dead_) {
    if (flight.step != Step::kRunning || flight.holders.count(dead) == 0) continue;
    Apply(flight, dead,
          flight.persist->WorkerFailed(dead, absl::UnavailableError("worker lost its lease")));
  }
  return absl::StrCat("persist_started checkpoint=mem://", request.name, " path=", request.path,
                      " staging=", flight.persist->staging_dir(), " id=", id);
}

absl::StatusOr<std::unique_ptr<MemoryPersist>> PersistDriver::BeginStaging(
    const std::string& id, const absl::StatusOr<MemoryCheckpoint>& checkpoint,
    const PersistRequest& request) {
  if (!checkpoint.ok()) return checkpoint.status();
  if (journal_ != nullptr) {
    if (absl::Status s = journal_->Begin(id, request.path); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("recording the staging directory of ",
                                                 request.path, " in the journal: ", s.message()));
    }
  }
  absl::StatusOr<std::unique_ptr<MemoryPersist>> persist =
      MemoryPersist::Begin(*checkpoint, request.path, request.overwrite);
  if (!persist.ok() && journal_ != nullptr) (void)journal_->End(id);  // nothing staged
  return persist;
}

std::string PersistDriver::RunEnd(const std::string& id, Step step) {
  MemoryPersist* persist;
  absl::Status failure;
  PersistRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Flight& flight = flights_.at(id);
    persist = flight.persist.get();  // only this thread touches it while the flight is busy
    failure = flight.failure;
    request = flight.request;
  }
  absl::Status outcome = step == Step::kCommit ? persist->Commit() : persist->Abort();
  if (step == Step::kAbort && outcome.ok()) outcome = failure;
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Flight& flight = flights_.at(id);
    const std::string why(outcome.message());
    // The flight (and with it an uncommitted staging directory) goes here.
    FinishLocked(flight, outcome.ok() ? PersistState::kPersisted : PersistState::kFailed, why);
    line = outcome.ok() ? absl::StrCat("persist_committed checkpoint=mem://", request.name,
                                       " path=", request.path)
                        : absl::StrCat("persist_failed checkpoint=mem://", request.name,
                                       " path=", request.path, " error=\"", why, "\"");
  }
  if (journal_ != nullptr) (void)journal_->End(id);  // committed or discarded: nothing to find
  return line;
}

void PersistDriver::FinishLocked(Flight& flight, PersistState state, const std::string& detail) {
  // NotFound only when the catalog forgot the checkpoint meanwhile: nothing left to record.
  (void)catalog_->SetPersistState(flight.request.name, state, detail, keep_newest_);
  const std::string outcome = PersistDescription(state, flight.request.path, detail);
  for (const std::string& worker : flight.holders) {
    PersistItem notice;
    notice.key = absl::StrCat(flight.id, "/ended");
    notice.worker = worker;
    notice.item.set_operation_id(flight.id);
    notice.item.set_rank(-1);
    notice.item.set_path(flight.request.path);
    notice.item.mutable_persist_ended()->set_name(flight.request.name);
    notice.item.mutable_persist_ended()->set_outcome(outcome);
    std::deque<PersistItem>& notices = ended_[worker];
    notices.push_back(std::move(notice));
    while (notices.size() > kEndedKept) notices.pop_front();
  }
  flights_.erase(flight.id);
}

void PersistDriver::QueueWork(Flight& flight, const PersistAssignment& assignment) {
  for (const auto& [worker, files] : assignment) {
    PersistItem work;
    work.key = absl::StrCat(flight.id, "/", next_item_++);
    work.worker = worker;
    work.item.set_operation_id(flight.id);
    work.item.set_rank(-1);
    work.item.set_path(flight.request.path);
    pb::PersistWork* p = work.item.mutable_persist();
    p->set_name(flight.request.name);
    p->set_persist_id(work.key);
    p->set_staging_dir(flight.persist->staging_dir());
    for (const std::string& f : files) p->add_files(f);
    p->set_manifest(flight.manifest);
    p->set_path(flight.request.path);
    std::string key = work.key;
    flight.outstanding.emplace(std::move(key), std::move(work));
  }
}

bool PersistDriver::Apply(Flight& flight, const std::string& failed_worker,
                          const absl::StatusOr<PersistAssignment>& next) {
  if (!failed_worker.empty()) {
    for (auto it = flight.outstanding.begin(); it != flight.outstanding.end();) {
      it = it->second.worker == failed_worker ? flight.outstanding.erase(it) : std::next(it);
    }
  }
  if (!next.ok()) {
    flight.step = Step::kAbort;
    flight.failure = next.status();
    return true;
  }
  QueueWork(flight, *next);
  if (flight.persist->AllWritten()) flight.step = Step::kCommit;
  return !next->empty() || flight.step == Step::kCommit;
}

std::vector<PersistItem> PersistDriver::ItemsFor(const std::string& worker_id,
                                                 const std::set<std::string>& sent) const {
  std::vector<PersistItem> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, flight] : flights_) {
    for (const auto& [key, work] : flight.outstanding) {
      if (work.worker == worker_id && sent.count(key) == 0) out.push_back(work);
    }
  }
  if (auto it = ended_.find(worker_id); it != ended_.end()) {
    for (const PersistItem& notice : it->second) {
      if (sent.count(notice.key) == 0) out.push_back(notice);
    }
  }
  return out;
}

bool PersistDriver::Report(const std::string& worker_id, const pb::PersistReportRequest& report) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = flights_.find(FlightOf(report.persist_id()));
  if (it == flights_.end() || it->second.step != Step::kRunning) return false;  // ended, late
  Flight& flight = it->second;
  auto item = flight.outstanding.find(report.persist_id());
  if (item == flight.outstanding.end() || item->second.worker != worker_id) return false;
  flight.outstanding.erase(item);
  const absl::Status result(static_cast<absl::StatusCode>(report.result().code()),
                            report.result().message());
  std::vector<std::string> files(report.files().begin(), report.files().end());
  return Apply(flight, result.ok() ? "" : worker_id,
               flight.persist->Report(
                   worker_id, files,
                   result.ok() ? result
                               : absl::Status(result.code(),
                                              absl::StrCat(worker_id, ": ", result.message()))));
}

bool PersistDriver::WorkerFailed(const std::string& worker_id, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  dead_.insert(worker_id);
  ended_.erase(worker_id);
  bool changed = false;
  for (auto& [id, flight] : flights_) {
    if (flight.step != Step::kRunning || flight.holders.count(worker_id) == 0) continue;
    changed |= Apply(flight, worker_id, flight.persist->WorkerFailed(worker_id, why));
  }
  return changed;
}

}  // namespace ckpt::coordinator
