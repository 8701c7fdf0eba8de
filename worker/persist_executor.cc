#include "worker/persist_executor.h"

#include <chrono>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "spdlog/spdlog.h"
#include "worker/memory_persist.h"

namespace ckpt::worker {
namespace {

constexpr size_t kResultsKept = 256;  // results re-sent for repeated items
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);
constexpr int kReportAttempts = 300;  // about a minute of retries

}  // namespace

PersistExecutor::PersistExecutor(MemoryTier* const* tier, CoordinatorLink* link)
    : tier_(tier), link_(link) {
  thread_ = std::thread([this] { Loop(); });
}

PersistExecutor::~PersistExecutor() { Stop(); }

void PersistExecutor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Weak: the testonly worker/test_hooks_on.cc replaces it (see persist_executor.h).
ABSL_ATTRIBUTE_WEAK bool PassPersistGateForTest(
    const std::function<bool(absl::Duration)>& /*stopped_within*/) {
  return true;
}

std::vector<pb::HeldMemoryCheckpoint> DescribeHeld(const MemoryTier& tier) {
  std::vector<pb::HeldMemoryCheckpoint> out;
  for (const HeldCheckpoint& held : tier.List()) {
    pb::HeldMemoryCheckpoint h;
    h.set_name(held.name);
    for (const std::string& file : held.files) h.add_files(file);
    h.set_complete(held.complete);
    h.set_pinned(held.pinned);
    h.set_persist_outcome(held.persist_outcome);
    if (!held.record.empty() && !h.mutable_record()->ParseFromString(held.record)) {
      h.clear_record();  // unreadable: reported as unrecorded
    }
    out.push_back(std::move(h));
  }
  return out;
}

void PersistExecutor::Handle(const pb::WorkItem& item) {
  if (item.item_case() == pb::WorkItem::kMemoryRecord) {
    const std::string& name = item.memory_record().name();
    const bool kept =
        *tier_ != nullptr && (*tier_)->Record(name, item.memory_record().SerializeAsString());
    spdlog::info("memory_record checkpoint=mem://{} kept={}", name, kept);
    return;
  }
  if (item.item_case() == pb::WorkItem::kPersistEnded) {
    if (*tier_ != nullptr) {
      (*tier_)->Unpin(item.persist_ended().name(), item.persist_ended().outcome());
    }
    spdlog::info("persist_ended checkpoint=mem://{} outcome=\"{}\"", item.persist_ended().name(),
                 item.persist_ended().outcome());
    return;
  }
  if (item.item_case() != pb::WorkItem::kPersist) return;
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& id = item.persist().persist_id();
  if (queued_.count(id) > 0) return;  // queued or running: its report follows
  queued_[id] = true;
  queue_.push_back(item.persist());
  cv_.notify_all();
}

void PersistExecutor::Loop() {
  while (true) {
    pb::PersistWork work;
    pb::PersistReportRequest again;
    bool resend = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      work = std::move(queue_.front());
      queue_.pop_front();
      if (auto it = done_.find(work.persist_id()); it != done_.end()) {
        again = it->second;  // written here before: report it again, do not write twice
        resend = true;
      }
    }
    pb::PersistReportRequest report = resend ? again : Run(work);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queued_.erase(work.persist_id());
      if (done_.emplace(work.persist_id(), report).second) {
        done_order_.push_back(work.persist_id());
        if (done_order_.size() > kResultsKept) {
          done_.erase(done_order_.front());
          done_order_.pop_front();
        }
      }
    }
    Report(report);
  }
}

bool PersistExecutor::PassGate() {
  return PassPersistGateForTest([this](absl::Duration wait) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(wait), [this] { return stopping_; });
  });
}

pb::PersistReportRequest PersistExecutor::Run(const pb::PersistWork& work) {
  pb::PersistReportRequest report;
  report.set_persist_id(work.persist_id());
  report.mutable_files()->CopyFrom(work.files());
  absl::Status status;
  pb::Manifest manifest;
  if (!PassGate()) {
    status = absl::CancelledError("the worker is shutting down");
  } else if (*tier_ == nullptr) {
    status = absl::FailedPreconditionError("this worker has no memory tier");
  } else if (!manifest.ParseFromString(work.manifest())) {
    status = absl::InvalidArgumentError(
        absl::StrCat("the manifest of mem://", work.name(), " sent to persist does not parse"));
  } else {
    const absl::Time start = absl::Now();
    std::vector<std::string> files(work.files().begin(), work.files().end());
    absl::StatusOr<int64_t> bytes =
        PersistHeldFiles(**tier_, work.name(), manifest, files, work.staging_dir());
    status = bytes.status();
    if (bytes.ok()) {
      report.set_bytes_written(*bytes);
      spdlog::info("persist_written checkpoint=mem://{} path={} files={} bytes={} seconds={:.3f}",
                   work.name(), work.path(), files.size(), *bytes,
                   absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  if (!status.ok()) {
    spdlog::error("persist_write_failed checkpoint=mem://{} path={} error=\"{}\"", work.name(),
                  work.path(), status.ToString());
  }
  report.mutable_result()->set_code(static_cast<int>(status.code()));
  report.mutable_result()->set_message(std::string(status.message()));
  return report;
}

void PersistExecutor::Report(const pb::PersistReportRequest& sent) {
  pb::PersistReportRequest report = sent;
  for (int attempt = 0; attempt < kReportAttempts; ++attempt) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    report.set_worker_id(link_->worker_id());
    pb::PersistReportResponse response;
    grpc::Status s = link_->stub()->ReportPersist(link_->Context().get(), report, &response);
    if (s.ok()) return;
    const absl::StatusCode code = FromGrpcStatus(s, "ReportPersist").code();
    if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
      spdlog::warn("persist_report_refused id={} error=\"{}\"", report.persist_id(),
                   s.error_message());
      return;  // the coordinator cannot take it (restarted, unknown): it re-plans or gave up
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, absl::ToChronoNanoseconds(kRetryPause), [this] { return stopping_; })) {
      return;
    }
  }
  spdlog::error("persist_report_gave_up id={}", report.persist_id());
}

}  // namespace ckpt::worker
