// The coordinator service's recovery of the in-memory tier after a restart (issue 17): the
// workers are the source of truth. Every worker keeps, beside the files of each committed
// memory checkpoint it holds, the coordinator's record of it (manifest, published version,
// asked-for persistence; WorkItem.memory_record), and reports what it holds whenever it
// registers. A restarted coordinator rebuilds its MemoryCatalog and PublishedRegistry from these
// reports, and starts again the persistences that were in flight once every data file has a
// holder again. A file no worker reports stays without a holder: loads of it are refused
// naming it, and a persistence of it fails naming it.
#include "absl/strings/str_cat.h"
#include "common/memory_path.h"
#include "common/transfer_path.h"
#include "coordinator/coordinator_service.h"
#include "spdlog/spdlog.h"

namespace ckpt::coordinator {

void CoordinatorService::AdoptMemory(const std::string& worker_id, const std::string& host,
                                     const pb::RegisterWorkerRequest& request) {
  if (memory_catalog_ == nullptr || request.memory_held().empty()) return;
  for (const std::string& line : memory_catalog_->Adopt(worker_id, host, request.memory_held())) {
    spdlog::info("{}", line);
  }
  for (const pb::HeldMemoryCheckpoint& held : request.memory_held()) {
    const pb::MemoryCheckpointRecord& record = held.record();
    if (published_ == nullptr || record.published_version() <= 0) continue;
    // A published name is what a receive's path names: one that path cannot carry is not taken.
    absl::StatusOr<TransferPath> path =
        ParseTransferPath(TransferPathString(record.published_name(), record.published_version()));
    if (!path.ok() || path->name != record.published_name()) {
      spdlog::warn("published_version_not_adopted name={} worker={} reason=\"{}\"",
                   record.published_name(), worker_id,
                   path.ok() ? "not a transfer name" : std::string(path.status().message()));
      continue;
    }
    absl::StatusOr<MemoryCheckpoint> checkpoint = memory_catalog_->Find(held.name());
    if (!checkpoint.ok() || checkpoint->published_name != record.published_name() ||
        checkpoint->published_version != record.published_version()) {
      continue;  // not adopted (logged above)
    }
    if (published_->Adopt(record.published_name(), record.published_version(),
                          checkpoint->committed)) {
      spdlog::info("published_version_adopted name={} version={} worker={}",
                   record.published_name(), record.published_version(), worker_id);
    }
  }
  StartRecoveredPersists(/*even_uncovered=*/false);
}

void CoordinatorService::StartRecoveredPersists(bool even_uncovered) {
  if (memory_catalog_ == nullptr) return;
  for (const std::string& name : memory_catalog_->TakeRecoveredPersists(even_uncovered)) {
    absl::StatusOr<MemoryCheckpoint> checkpoint = memory_catalog_->Find(name);
    if (!checkpoint.ok()) continue;
    // The target comes from a worker's report: it passes the checks a saving rank's
    // persist_to passes (a directory under the checkpoint roots, resolved the same way).
    absl::StatusOr<std::string> target = PersistTarget(
        OperationKind::kSave, absl::StrCat(kMemoryPathPrefix, name), checkpoint->persist_to,
        absl::StrCat("recovered persistence of mem://", name));
    if (target.ok() && *target != checkpoint->persist_to) {
      target = absl::InvalidArgumentError(absl::StrCat(
          "recovered persistence of mem://", name, ": persist_to '", checkpoint->persist_to,
          "' is not the resolved path '", *target, "' a save would have recorded"));
    }
    if (!target.ok()) {
      const std::string why(target.status().message());
      (void)memory_catalog_->SetPersistState(name, PersistState::kFailed, why);
      spdlog::error("persist_failed checkpoint=mem://{} path={} error=\"{}\"", name,
                    checkpoint->persist_to, why);
      continue;
    }
    persist_->Enqueue({name, checkpoint->persist_to, checkpoint->persist_overwrite,
                       /*recovered=*/true});
    spdlog::info("persist_recovered checkpoint=mem://{} path={} overwrite={} wait_over={}", name,
                 checkpoint->persist_to, checkpoint->persist_overwrite, even_uncovered);
    PersistChanged(true);
  }
}

}  // namespace ckpt::coordinator
