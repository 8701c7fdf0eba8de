// GetStatus in pages (issue 39): one answer listing every worker, job, operation, memory
// checkpoint and published name grew past gRPC's send limit (every operator's `ckptctl status`
// failed) and then past protobuf's 2 GB (the coordinator aborted). A page holds at most
// page_size entries (a job's ranks and a memory checkpoint's replicas count one each) and
// about kStatusPageBytes, so no answer comes near the message limits; next_page_token says
// where the next page starts (coordinator/request_bounds.h StatusCursor).
#include <string>
#include <vector>

#include "common/grpc_auth.h"
#include "common/grpc_status.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/operation_wire.h"
#include "coordinator/request_bounds.h"
#include "coordinator/transfer_kinds.h"

namespace ckpt::coordinator {
namespace {

// About this many serialized bytes per page (one entry may pass it by its own size).
constexpr size_t kStatusPageBytes = size_t{2} << 20;

enum Section { kWorkers = 0, kJobs = 1, kOperations = 2, kMemory = 3, kPublished = 4 };

// What one page has room for, from where the request's token starts it.
class StatusPage {
 public:
  StatusPage(StatusCursor start, int max_items) : start_(start), max_items_(max_items) {}

  // Whether section `s` is at or past the page's start and the page is not full yet.
  bool Wants(int s) const { return !full_ && s >= start_.section; }
  // The first entry of section `s` on this page.
  int64_t FirstEntry(int s) const { return s == start_.section ? start_.entry : 0; }
  // The first item of entry `e` of section `s` on this page.
  int64_t FirstItem(int s, int64_t e) const {
    return s == start_.section && e == start_.entry ? start_.item : 0;
  }
  // Whether item `item` of entry `entry` of `section` goes on this page; once full, records it
  // as where the next page starts.
  bool Room(int section, int64_t entry, int64_t item) {
    if (full_) return false;
    if (items_ < max_items_ && bytes_ < kStatusPageBytes) return true;
    full_ = true;
    next_ = StatusCursor{section, entry, item};
    return false;
  }
  void Add(size_t bytes) {
    ++items_;
    bytes_ += bytes;
  }
  // "" when everything fit.
  std::string NextToken() const { return full_ ? FormatStatusPageToken(next_) : ""; }

 private:
  const StatusCursor start_;
  const int max_items_;
  int items_ = 0;
  size_t bytes_ = 0;
  bool full_ = false;
  StatusCursor next_;
};

void AddWorkers(const WorkerRegistry& workers, absl::Time now, StatusPage& page,
                pb::GetStatusResponse* response) {
  if (!page.Wants(kWorkers)) return;
  const std::vector<const WorkerRecord*> all = workers.All();
  for (int64_t i = page.FirstEntry(kWorkers); i < static_cast<int64_t>(all.size()); ++i) {
    if (!page.Room(kWorkers, i, 0)) return;
    const WorkerRecord* w = all[i];
    pb::WorkerStatus* out = response->add_workers();
    out->set_worker_id(w->id);
    pb::WorkerInfo* info = out->mutable_info();
    info->set_host(w->description.host);
    info->set_pid(static_cast<int32_t>(w->description.pid));
    info->set_data_plane_address(w->description.data_plane_address);
    for (pb::MemoryKind kind : w->description.memory_kinds) info->add_memory_kinds(kind);
    info->set_local_rank(w->description.local_rank);
    info->set_gpu(w->description.gpu);
    info->set_nccl(w->description.nccl);
    out->set_alive(w->alive);
    out->set_death_cause(w->death_cause);
    out->set_ms_since_heartbeat(absl::ToInt64Milliseconds(now - w->last_heartbeat));
    page.Add(out->ByteSizeLong());
  }
}

// Jobs' entries continue across pages by rank number (the cursor's item is the next rank).
void AddJobs(const JobState& jobs, const std::string& only, StatusPage& page,
             pb::GetStatusResponse* response) {
  if (!page.Wants(kJobs)) return;
  std::vector<const Job*> listed;
  for (const Job* job : jobs.Jobs()) {
    if (only.empty() || job->name == only) listed.push_back(job);
  }
  for (int64_t i = page.FirstEntry(kJobs); i < static_cast<int64_t>(listed.size()); ++i) {
    const Job& job = *listed[i];
    auto it = job.ranks.lower_bound(static_cast<int>(page.FirstItem(kJobs, i)));
    if (!page.Room(kJobs, i, it == job.ranks.end() ? 0 : it->first)) return;
    pb::JobStatus* out = response->add_jobs();
    out->set_name(job.name);
    out->set_world_size(job.world_size);
    page.Add(out->ByteSizeLong());
    for (; it != job.ranks.end(); ++it) {
      if (!page.Room(kJobs, i, it->first)) return;
      pb::RankAttachment* a = out->add_ranks();
      a->set_rank(it->first);
      a->set_worker_id(it->second.worker_id);
      a->set_host(it->second.host);
      page.Add(a->ByteSizeLong());
    }
  }
}

void AddOperations(const JobState& jobs, const std::string& only, StatusPage& page,
                   pb::GetStatusResponse* response) {
  if (!page.Wants(kOperations)) return;
  std::vector<const Operation*> listed;
  for (const Operation* op : jobs.Operations()) {
    if (only.empty() || op->job == only) listed.push_back(op);
  }
  for (int64_t i = page.FirstEntry(kOperations); i < static_cast<int64_t>(listed.size()); ++i) {
    if (!page.Room(kOperations, i, 0)) return;
    pb::OperationStatus* out = response->add_operations();
    ToProto(*listed[i], out);
    page.Add(out->ByteSizeLong());
  }
}

// Memory checkpoints' entries continue across pages by replica index.
void AddMemory(const MemoryCatalog& catalog, StatusPage& page, pb::GetStatusResponse* response) {
  if (!page.Wants(kMemory)) return;
  google::protobuf::RepeatedPtrField<pb::MemoryCheckpointStatus> all;
  catalog.ToProto(&all);
  for (int64_t i = page.FirstEntry(kMemory); i < all.size(); ++i) {
    pb::MemoryCheckpointStatus& entry = all[static_cast<int>(i)];
    int64_t r = page.FirstItem(kMemory, i);
    if (!page.Room(kMemory, i, r)) return;
    pb::MemoryCheckpointStatus* out = response->add_memory_checkpoints();
    google::protobuf::RepeatedPtrField<pb::MemoryReplicaStatus> replicas;
    replicas.Swap(entry.mutable_replicas());
    *out = std::move(entry);
    page.Add(out->ByteSizeLong());
    for (; r < replicas.size(); ++r) {
      if (!page.Room(kMemory, i, r)) return;
      *out->add_replicas() = std::move(replicas[static_cast<int>(r)]);
      page.Add(out->replicas(out->replicas_size() - 1).ByteSizeLong());
    }
  }
}

void AddPublished(const PublishedRegistry& registry, const MemoryCatalog* catalog, StatusPage& page,
                  pb::GetStatusResponse* response) {
  if (!page.Wants(kPublished)) return;
  google::protobuf::RepeatedPtrField<pb::PublishedStatus> all;
  PublishedToProto(registry, catalog, &all);
  for (int64_t i = page.FirstEntry(kPublished); i < all.size(); ++i) {
    if (!page.Room(kPublished, i, 0)) return;
    pb::PublishedStatus* out = response->add_published();
    *out = std::move(all[static_cast<int>(i)]);
    page.Add(out->ByteSizeLong());
  }
}

}  // namespace

grpc::Status CoordinatorService::DoGetStatus(const grpc::ServerContextBase* context,
                                             const pb::GetStatusRequest* request,
                                             pb::GetStatusResponse* response) {
  absl::StatusOr<Peer> peer = AuthorizeCall(*context, {Role::kOperator}, "GetStatus");
  if (!peer.ok()) return ToGrpcStatus(peer.status());
  if (absl::Status s = CheckGetStatus(*request); !s.ok()) return Refuse(s, *peer);
  absl::StatusOr<StatusCursor> start = ParseStatusPageToken(request->page_token());
  if (!start.ok()) return Refuse(start.status(), *peer);
  StatusPage page(*start, request->page_size() > 0 ? request->page_size() : kMaxStatusPageItems);
  std::lock_guard<std::mutex> lock(mu_);
  ApplyRenewals();
  response->set_lease_ms(absl::ToInt64Milliseconds(workers_.lease()));
  response->set_incarnation(incarnation_);
  response->set_started_unix_ms(absl::ToUnixMillis(started_));
  response->set_heartbeat_lag_ms(absl::ToInt64Milliseconds(HeartbeatLag()));
  AddWorkers(workers_, clock_->Now(), page, response);
  AddJobs(jobs_, request->job(), page, response);
  AddOperations(jobs_, request->job(), page, response);
  if (memory_catalog_ != nullptr) AddMemory(*memory_catalog_, page, response);
  if (published_ != nullptr) AddPublished(*published_, memory_catalog_, page, response);
  response->set_next_page_token(page.NextToken());
  return grpc::Status::OK;
}

}  // namespace ckpt::coordinator
