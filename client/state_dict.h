// A trainer rank's sharded state dict as the checkpoint system sees it: per tensor its key,
// dtype, global shape, where this rank's piece sits (an N-d region, a DTensor placement over
// a device mesh, or a flat range of the flattened tensor), its replica id and its memory.
// Host tensors are allocated by this library in POSIX shared-memory segments that the local
// worker daemon maps too, so the worker reads (save) and writes (load) them without copies.
// No gRPC, threads or logging.
#ifndef CKPT_CLIENT_STATE_DICT_H_
#define CKPT_CLIENT_STATE_DICT_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/shared_memory.h"
#include "proto/worker.pb.h"
#include "sharding/dtensor.h"
#include "sharding/dtype.h"
#include "sharding/region.h"

namespace ckpt::client {

// Where a tensor's bytes live in the trainer.
enum class MemoryKind { kHost, kDevice };

// What a save borrows from the trainer until the save ends (committed or aborted): the worker
// writes lent host bytes straight from shared memory instead of copying them at the snapshot,
// so the trainer must not change them before then. Bytes not lent are copied by the worker
// before Save returns.
enum class Lending {
  kNone,            // nothing: every byte is copied at the snapshot
  kMarkedTensors,   // host tensors marked StateTensor::lent_until_durable (a binding's staging)
  kAllHostTensors,  // every host tensor: for a caller that waits for the commit before it
                    // touches its tensors (a blocking save)
};

// A DTensor-style layout: the rank's piece follows from the mesh and one placement per mesh
// dimension exactly as PyTorch computes it (torch.chunk semantics, empty shards included);
// the replica id is the rank's coordinates along the Replicate() mesh dims.
struct DTensorLayout {
  std::vector<int64_t> mesh_shape;
  std::vector<Placement> placements;
  // This rank's index in the mesh (row-major); -1: the trainer's global rank.
  int64_t mesh_rank = -1;
};

// What the trainer declares about one tensor. `layout` is one of:
//  - Region: an N-d box of the global tensor, optionally narrowed to a flat range of the box;
//  - DTensorLayout: placements over a device mesh;
//  - FlatRange: a contiguous range of the whole tensor's row-major flattening (ZeRO/FSDP).
struct TensorDeclaration {
  std::string key;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  std::variant<Region, DTensorLayout, FlatRange> layout;
  // Replica id for Region/FlatRange layouts (all zeros, or empty, marks the main replica).
  // For a DTensorLayout it is appended to the mesh's own replica id (the coordinates along
  // the Replicate() dims): it tells apart copies of the whole mesh within the job.
  std::vector<int64_t> replica_id;
  MemoryKind memory = MemoryKind::kHost;
};

// A tensor of the state dict: its resolved region and, for host memory, its bytes.
struct StateTensor {
  std::string key;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  Region region;  // resolved from the layout
  std::vector<int64_t> replica_id;
  MemoryKind memory = MemoryKind::kHost;
  std::string segment;         // host: the shared-memory segment's name
  int64_t segment_offset = 0;  // host: where the tensor's bytes start in the segment
  std::byte* data = nullptr;   // host: the bytes (row-major over the region); device: the pointer
  int64_t nbytes = 0;
  int device = -1;          // device tensors: CUDA ordinal
  std::string device_uuid;  // device tensors: the GPU's UUID (the worker matches by it)
  // How the piece was described (informational, for the manifest's saved layout).
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> mesh_coordinate;  // DTensors: this rank's coordinate in mesh_shape
  std::vector<Placement> placements;
  bool flat_sharded = false;
  // Device tensors: the CUDA IPC handle of the allocation containing the tensor, the tensor's
  // offset in it and the allocation's size (see device/gpu.h ExportDeviceAllocation).
  std::string cuda_ipc_handle;
  int64_t ipc_offset = 0;
  int64_t allocation_bytes = 0;
  // Host: ckpt-owned staging its owner does not change while a save of it runs (until the
  // save ends), so saves with Lending::kMarkedTensors lend it (see Lending).
  bool lent_until_durable = false;

  absl::Span<std::byte> bytes() const { return {data, static_cast<size_t>(nbytes)}; }
};

// Resolves a spec's layout to (region, replica id) for global rank `rank`. Errors name the key.
absl::StatusOr<std::pair<Region, std::vector<int64_t>>> ResolveLayout(const TensorDeclaration& spec,
                                                                      int rank);

inline constexpr size_t kArenaBytes = size_t{64} << 20;
inline constexpr size_t kSmallTensorBytes = size_t{8} << 20;

// The state dict. Owns its shared-memory segments: they are unmapped and unlinked when it is
// destroyed (and by the worker when the process dies first).
class StateDict {
 public:
  // Segment names are "/ckpt.<job>.r<rank>.p<pid>.<n>" (job reduced to [A-Za-z0-9_-]).
  StateDict(const std::string& job, int rank);
  ~StateDict();
  StateDict(const StateDict&) = delete;
  StateDict& operator=(const StateDict&) = delete;

  // Allocates a zero-filled host tensor in shared memory and adds it: tensors up to
  // kSmallTensorBytes share kArenaBytes arena segments, larger ones get their own segment.
  // A key may be added again for another piece of the same tensor (several shards on one rank:
  // same dtype and global shape, no element in common; each piece is saved and loaded on its
  // own). AlreadyExists for a piece overlapping one of its key already added (a duplicate);
  // InvalidArgument for an invalid shape/layout or another dtype or shape of a key;
  // ResourceExhausted when shared memory cannot be allocated.
  absl::StatusOr<StateTensor*> AddHost(const TensorDeclaration& spec);

  // Adds a host tensor whose bytes already lie in a shared segment this process created
  // (SharedAllocator): `nbytes` at `offset` in `segment`, which the state dict keeps alive.
  // InvalidArgument when the layout's bytes (region x dtype) differ from `nbytes` or do not
  // fit in the segment; the other errors as AddHost.
  absl::StatusOr<StateTensor*> AddHostView(const TensorDeclaration& spec,
                                           std::shared_ptr<SharedSegment> segment, int64_t offset,
                                           int64_t nbytes);

  // Adds a tensor that lives in CUDA memory at `device_ptr` on `device`, shared with the
  // worker through the CUDA IPC handle of the allocation containing it (plus its offset there).
  // FailedPrecondition naming the tensor, device and CUDA error without a GPU, and for
  // allocations CUDA IPC cannot export (virtual-memory allocations, e.g. PyTorch's
  // expandable_segments); InvalidArgument when the pointer is not on `device`.
  absl::StatusOr<StateTensor*> AddDevice(const TensorDeclaration& spec, void* device_ptr,
                                         int device);

  StateTensor* Find(const std::string& key);  // the first piece of `key` added, or nullptr
  const std::vector<std::unique_ptr<StateTensor>>& tensors() const { return tensors_; }
  int rank() const { return rank_; }

  // The description sent to the worker; host tensors `lending` lends are marked
  // lent_until_durable.
  std::vector<pb::SharedTensor> Describe(Lending lending = Lending::kNone) const;

 private:
  absl::StatusOr<std::unique_ptr<StateTensor>> Resolve(const TensorDeclaration& spec) const;
  absl::Status CheckAnotherPiece(const TensorDeclaration& spec, const Region& region) const;

  // A shared-memory segment this state dict created or borrowed (AddHostView).
  struct Segment {
    std::shared_ptr<SharedSegment> shared;
    size_t used = 0;  // arena: bytes handed out
  };
  absl::StatusOr<Segment*> NewSegment(size_t size, const std::string& key);

  std::string prefix_;  // "/ckpt.<job>.r<rank>.p<pid>."
  int rank_;
  int next_segment_ = 1;
  std::deque<Segment> segments_;  // stable addresses
  Segment* arena_ = nullptr;      // the arena small tensors go to now
  std::vector<std::unique_ptr<StateTensor>> tensors_;
};

// Shared-memory segment name prefix of (job, rank, pid).
std::string SegmentPrefix(const std::string& job, int rank, pid_t pid);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_STATE_DICT_H_
