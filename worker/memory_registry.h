// The worker's view of its trainers' memory. Each trainer process that says Hello gets a
// session; the tensors it registers live in POSIX shared-memory segments that the client
// library allocated (names "/ckpt.<job>.r<rank>.p<pid>.<n>"), which the worker maps too, so
// saves read and loads write the trainer's tensors without copies. When the trainer process
// dies (or says Goodbye) the worker unlinks its segments, so nothing leaks in /dev/shm even
// when the trainer was killed with SIGKILL. A segment stays mapped in the worker as long as
// anything refers to it: every SessionInfo handed out pins the mappings of its tensors, so a
// plan part that still copies into a session closed meanwhile never touches unmapped memory.
//
// Device tensors arrive as (CUDA IPC handle of their allocation, offset, allocation size): the
// worker opens each allocation once, on the GPU it serves (ServeDevice), and keeps it open while
// the trainer stays attached and still registers tensors in it. A worker serving no GPU refuses
// them (FailedPrecondition naming the tensor and why there is no GPU).
//
// Thread-safe (the gRPC handlers and the reaper thread share it). No gRPC, no logging.
#ifndef CKPT_WORKER_MEMORY_REGISTRY_H_
#define CKPT_WORKER_MEMORY_REGISTRY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "device/gpu.h"
#include "proto/types.pb.h"
#include "proto/worker.pb.h"

namespace ckpt::worker {

// Who a session belongs to.
struct TrainerIdentity {
  std::string job;
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  pid_t pid = 0;  // from the connection (SO_PEERCRED), never from the trainer's word
  uid_t uid = 0;  // likewise; later calls naming the session must come from this uid
};

// A shared-memory segment mapped into this process; unmapped when the last reference goes.
class MappedSegment {
 public:
  MappedSegment(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~MappedSegment();
  MappedSegment(const MappedSegment&) = delete;
  MappedSegment& operator=(const MappedSegment&) = delete;

  void* addr() const { return addr_; }
  size_t size() const { return size_; }

 private:
  void* addr_;
  size_t size_;
};

// A registered tensor and where its bytes are mapped in this process.
struct RegisteredTensor {
  pb::PieceMeta shard;
  pb::MemoryKind memory_kind = pb::MEMORY_KIND_UNSPECIFIED;
  std::string segment;
  int64_t offset = 0;
  int64_t nbytes = 0;
  std::byte* data = nullptr;  // host: the mapped bytes; device: nullptr
  // Keeps `data` mapped while this copy of the tensor exists (host tensors).
  std::shared_ptr<const MappedSegment> mapping;
  // Device tensors: the bytes in this process (the opened allocation's base + offset), the GPU,
  // and what keeps the allocation open while this copy of the tensor exists.
  void* device_ptr = nullptr;
  int device = -1;
  std::shared_ptr<const OpenedDeviceAllocation> device_allocation;
  pb::TensorLayout layout;  // as the trainer described it (informational)
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> mesh_coordinate;  // DTensors: the trainer's coordinate in mesh_shape
  // Host: lent to the save it is registered for until that save ends (see
  // pb::SharedTensor.lent_until_durable): the save writes from `data` without a snapshot copy.
  bool lent_until_durable = false;
};

// A snapshot of one session, for status and for building the rank's shard metadata.
struct SessionInfo {
  std::string id;
  TrainerIdentity trainer;
  std::vector<std::string> segments;
  std::vector<RegisteredTensor> tensors;
};

// Liveness of a process, as seen from this host. Injectable for tests.
class ProcessProbe {
 public:
  virtual ~ProcessProbe() = default;
  // A token that changes when the pid is reused by another process (start time); 0 if the
  // process does not exist or is a zombie.
  virtual uint64_t StartToken(pid_t pid) const = 0;
};

// Reads /proc/<pid>/stat: zombies count as dead.
class ProcfsProcessProbe final : public ProcessProbe {
 public:
  uint64_t StartToken(pid_t pid) const override;
};

// Whether `name` is a segment name that the client library of (job, rank, pid) may register:
// "/ckpt.<anything without '/'>.p<pid>.<suffix>", at most 255 bytes.
absl::Status ValidateSegmentName(const std::string& name, pid_t pid);

// Unlinks shared-memory segments in `shm_dir` (normally /dev/shm) that the client library
// created ("ckpt.<job>.r<rank>.p<pid>.<n>"), that this user or one of `trainer_uids` (the
// worker's --trainer_uids: other users whose trainers it serves) owns, and whose process is
// gone by `probe`: the leftovers of trainers that died while their worker was down too.
// Returns the names removed (with a leading '/'); a segment this process may not unlink
// (another user's, without the right to) stays.
std::vector<std::string> SweepOrphanSegments(const ProcessProbe& probe,
                                             const std::vector<uid_t>& trainer_uids = {},
                                             const std::string& shm_dir = "/dev/shm");

// Checks a device tensor's share before anything is opened: the worker serves a GPU
// (`worker_gpu` >= 0, else FailedPrecondition with `no_gpu_reason`), the tensor is on it (its
// device_uuid equals `worker_gpu_uuid`; ordinals are only reported, see
// device/device_uuid.h), the handle has kCudaIpcHandleBytes bytes and
// [ipc_offset, ipc_offset + nbytes) lies inside the allocation. Errors name the tensor and
// device; the caller adds job and rank.
absl::Status CheckDeviceShare(const pb::SharedTensor& tensor, int worker_gpu,
                              const std::string& worker_gpu_uuid, const std::string& no_gpu_reason);

// The registry. See the file comment.
class MemoryRegistry {
 public:
  explicit MemoryRegistry(
      std::unique_ptr<ProcessProbe> probe = std::make_unique<ProcfsProcessProbe>());
  ~MemoryRegistry();  // drops (but does not unlink) every segment; unmapped once unpinned
  MemoryRegistry(const MemoryRegistry&) = delete;
  MemoryRegistry& operator=(const MemoryRegistry&) = delete;

  // Opens a session for a live trainer process. InvalidArgument for a bad identity or a pid
  // that is not running on this host.
  absl::StatusOr<std::string> OpenSession(const TrainerIdentity& trainer);

  // The GPU whose device tensors this worker serves, by ordinal and UUID (DeviceUuid; device
  // tensors are matched by it). Call before serving; default none, with CUDA's reason when no
  // GPU exists.
  void ServeDevice(int gpu, std::string uuid) {
    gpu_ = gpu;
    gpu_uuid_ = std::move(uuid);
  }
  int device() const { return gpu_; }

  // Replaces the session's tensors. Host tensors: the segment is mapped (once per segment)
  // and [offset, offset + nbytes) must lie inside it; nbytes must equal the region's element
  // count times the dtype size. Device tensors need a GPU. Errors name the tensor key.
  absl::Status RegisterTensors(const std::string& session_id,
                               absl::Span<const pb::SharedTensor> tensors);

  // Ends a session the trainer closed (Goodbye): its segments are unmapped here once no
  // SessionInfo pins them any more, and left to the trainer, which still owns them (a
  // ckpt.empty tensor outlives its Client and may be registered by the next one). NotFound for
  // an unknown id.
  absl::Status CloseSession(const std::string& session_id);

  // Closes the sessions of trainer processes that are gone and returns what they were.
  std::vector<SessionInfo> ReapDeadTrainers();

  absl::StatusOr<SessionInfo> Find(const std::string& session_id) const;
  std::vector<SessionInfo> Sessions() const;
  // How many sessions of `job` are open (cheap: copies nothing).
  int SessionsOfJob(const std::string& job) const;
  // How many sessions of rank `rank` of `job` are open (a replacement trainer of a rank whose
  // previous trainer is being reaped shows here).
  int SessionsOfRank(const std::string& job, int rank) const;

 private:
  struct Session {
    TrainerIdentity trainer;
    uint64_t start_token = 0;
    std::map<std::string, std::shared_ptr<const MappedSegment>> segments;
    std::vector<RegisteredTensor> tensors;
    // By IPC handle: the device allocations opened for the current tensors.
    std::map<std::string, std::shared_ptr<const OpenedDeviceAllocation>> device_allocations;
  };
  absl::Status RegisterDeviceTensor(
      const pb::SharedTensor& t, const std::string& who, Session& session,
      std::map<std::string, std::shared_ptr<const OpenedDeviceAllocation>>& opened,
      RegisteredTensor& r) const;
  static SessionInfo Summarize(const std::string& id, const Session& session);
  // Drops the session's mappings; `unlink`: also removes its segments' names (a dead trainer's).
  static void Release(Session& session, bool unlink);
  absl::StatusOr<std::shared_ptr<const MappedSegment>> MapSegment(const std::string& name) const;

  std::unique_ptr<ProcessProbe> probe_;
  int gpu_ = -1;
  std::string gpu_uuid_;
  mutable std::mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MEMORY_REGISTRY_H_
