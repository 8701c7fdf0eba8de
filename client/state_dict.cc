#include "client/state_dict.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "device/gpu.h"
#include "proto/convert.h"
#include "sharding/overlap.h"

namespace ckpt::client {
namespace {

std::string Sanitize(const std::string& job) {
  std::string out;
  for (char c : job.substr(0, 64)) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    out.push_back(ok ? c : '_');
  }
  return out.empty() ? "job" : out;
}

}  // namespace

std::string SegmentPrefix(const std::string& job, int rank, pid_t pid) {
  return absl::StrCat("/ckpt.", Sanitize(job), ".r", rank, ".p", pid, ".");
}

absl::StatusOr<std::pair<Region, std::vector<int64_t>>> ResolveLayout(const TensorDeclaration& spec,
                                                                      int rank) {
  if (spec.key.empty()) return absl::InvalidArgumentError("tensor spec without a key");
  auto fail = [&](const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.key, ": ", s.message()));
  };
  if (absl::StatusOr<int64_t> n = CheckedNumElements(spec.global_shape); !n.ok()) {
    return fail(n.status());
  }
  Region region;
  std::vector<int64_t> replica_id = spec.replica_id;
  if (const Region* r = std::get_if<Region>(&spec.layout)) {
    region = *r;
  } else if (const FlatRange* f = std::get_if<FlatRange>(&spec.layout)) {
    region = WholeRegion(spec.global_shape);
    region.flat = *f;
  } else {
    const DTensorLayout& d = std::get<DTensorLayout>(spec.layout);
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(d.mesh_shape);
    if (!mesh.ok()) return fail(mesh.status());
    absl::StatusOr<LocalShard> local = ComputeLocalShard(spec.global_shape, *mesh, d.placements,
                                                         d.mesh_rank >= 0 ? d.mesh_rank : rank);
    if (!local.ok()) return fail(local.status());
    region = local->region();
    // The mesh's Replicate() coordinates, then the spec's own id (which copy of the mesh this
    // is, when the job holds several, e.g. a tensor-parallel mesh per data-parallel rank).
    replica_id = local->replica_id;
    replica_id.insert(replica_id.end(), spec.replica_id.begin(), spec.replica_id.end());
  }
  if (absl::Status s = ValidateRegion(region, spec.global_shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", spec.key, " region ", region.DebugString(), " of shape ",
                     ShapeString(spec.global_shape), ": ", s.message()));
  }
  for (int64_t id : replica_id) {
    if (id < 0) return fail(absl::InvalidArgumentError("negative replica id"));
  }
  return std::make_pair(std::move(region), std::move(replica_id));
}

StateDict::StateDict(const std::string& job, int rank)
    : prefix_(SegmentPrefix(job, rank, getpid())), rank_(rank) {}

StateDict::~StateDict() = default;  // segments unmap and unlink when their last owner goes

absl::StatusOr<StateDict::Segment*> StateDict::NewSegment(size_t size, const std::string& key) {
  absl::StatusOr<std::shared_ptr<SharedSegment>> shared =
      SharedSegment::Create(absl::StrCat(prefix_, next_segment_++), size, key);
  if (!shared.ok()) return shared.status();
  segments_.push_back(Segment{*std::move(shared), 0});
  return &segments_.back();
}

// A further piece of a key the state dict holds (several shards of one tensor on one rank, as a
// ShardedTensor may place them): the same dtype and global shape, and no element in common with
// any piece of the key already there. Errors name the key, the rank and the regions.
absl::Status StateDict::CheckAnotherPiece(const TensorDeclaration& spec,
                                          const Region& region) const {
  for (const auto& t : tensors_) {
    if (t->key != spec.key) continue;
    if (t->dtype != spec.dtype || t->global_shape != spec.global_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", spec.key, " is already in rank ", rank_, "'s state dict as ",
                       DTypeName(t->dtype), " ", ShapeString(t->global_shape),
                       "; another piece of it cannot be ", DTypeName(spec.dtype), " ",
                       ShapeString(spec.global_shape)));
    }
    absl::StatusOr<int64_t> common = OverlapElements(t->region, region, t->global_shape);
    if (!common.ok()) return common.status();
    if (*common > 0 || region == t->region) {
      return absl::AlreadyExistsError(absl::StrCat(
          "tensor ", spec.key, " region ", region.DebugString(), " is already in rank ", rank_,
          "'s state dict (a piece at ", t->region.DebugString(), " overlaps it)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StateTensor>> StateDict::Resolve(
    const TensorDeclaration& spec) const {
  auto resolved = ResolveLayout(spec, rank_);
  if (!resolved.ok()) return resolved.status();
  if (absl::Status s = CheckAnotherPiece(spec, resolved->first); !s.ok()) return s;
  auto t = std::make_unique<StateTensor>();
  t->key = spec.key;
  t->dtype = spec.dtype;
  t->global_shape = spec.global_shape;
  t->region = std::move(resolved->first);
  t->replica_id = std::move(resolved->second);
  t->memory = spec.memory;
  t->nbytes = t->region.NumElements() * DTypeSize(spec.dtype);
  if (const DTensorLayout* d = std::get_if<DTensorLayout>(&spec.layout)) {
    t->mesh_shape = d->mesh_shape;
    t->placements = d->placements;
    // ResolveLayout checked the mesh and the rank in it. The coordinate lets the worker
    // describe the tensor to the coordinator compactly (issue 16).
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(d->mesh_shape);
    absl::StatusOr<std::vector<int64_t>> coordinate =
        mesh.ok() ? mesh->Coordinate(d->mesh_rank >= 0 ? d->mesh_rank : rank_) : mesh.status();
    if (!coordinate.ok()) return coordinate.status();
    t->mesh_coordinate = *std::move(coordinate);
  }
  t->flat_sharded = std::holds_alternative<FlatRange>(spec.layout);
  return t;
}

absl::StatusOr<StateTensor*> StateDict::AddHost(const TensorDeclaration& spec) {
  auto t = Resolve(spec);
  if (!t.ok()) return t.status();
  if (spec.memory != MemoryKind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", spec.key, " is declared in device memory; use AddDevice"));
  }
  // Small tensors share arena segments (fewer mappings and descriptors in trainer and worker);
  // large ones get their own. Offsets are 64-byte aligned.
  const size_t size = static_cast<size_t>((*t)->nbytes);
  Segment* seg = nullptr;
  if (size <= kSmallTensorBytes) {
    if (arena_ == nullptr || arena_->used + size > arena_->shared->size()) {
      absl::StatusOr<Segment*> fresh = NewSegment(kArenaBytes, spec.key);
      if (!fresh.ok()) return fresh.status();
      arena_ = *fresh;
    }
    seg = arena_;
  } else {
    absl::StatusOr<Segment*> own = NewSegment(size, spec.key);
    if (!own.ok()) return own.status();
    seg = *own;
  }
  (*t)->segment = seg->shared->name();
  (*t)->segment_offset = static_cast<int64_t>(seg->used);
  (*t)->data = seg->shared->data() == nullptr ? nullptr : seg->shared->data() + seg->used;
  seg->used += (size + 63) / 64 * 64;
  tensors_.push_back(*std::move(t));
  return tensors_.back().get();
}

absl::StatusOr<StateTensor*> StateDict::AddHostView(const TensorDeclaration& spec,
                                                    std::shared_ptr<SharedSegment> segment,
                                                    int64_t offset, int64_t nbytes) {
  if (segment == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.key, ": no shared segment"));
  }
  auto t = Resolve(spec);
  if (!t.ok()) return t.status();
  if (spec.memory != MemoryKind::kHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", spec.key, " is declared in device memory; use AddDevice"));
  }
  if ((*t)->nbytes != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", spec.key, ": its layout's region ", (*t)->region.DebugString(), " of ",
        DTypeName(spec.dtype), " needs ", (*t)->nbytes, " bytes but the memory holds ", nbytes));
  }
  if (offset < 0 || static_cast<uint64_t>(offset) + static_cast<uint64_t>(nbytes) >
                        static_cast<uint64_t>(segment->size())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.key, ": bytes [", offset, ", ",
                                                   offset + nbytes, ") lie outside segment ",
                                                   segment->name(), " of ", segment->size()));
  }
  (*t)->segment = segment->name();
  (*t)->segment_offset = offset;
  (*t)->data = segment->data() == nullptr ? nullptr : segment->data() + offset;
  bool held = false;
  for (const Segment& s : segments_) held = held || s.shared == segment;
  if (!held) segments_.push_back(Segment{std::move(segment), 0});
  tensors_.push_back(*std::move(t));
  return tensors_.back().get();
}

absl::StatusOr<StateTensor*> StateDict::AddDevice(const TensorDeclaration& spec, void* device_ptr,
                                                  int device) {
  TensorDeclaration device_spec = spec;
  device_spec.memory = MemoryKind::kDevice;
  auto t = Resolve(device_spec);
  if (!t.ok()) return t.status();
  absl::StatusOr<ExportedAllocation> exported = ExportDeviceAllocation(device_ptr);
  if (!exported.ok()) {
    return absl::Status(exported.status().code(),
                        absl::StrCat("tensor ", spec.key, " (device ", device,
                                     "): cannot share device memory with the worker: ",
                                     exported.status().message()));
  }
  if (exported->device != device) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.key, " was declared on device ",
                                                   device, " but its memory is on device ",
                                                   exported->device));
  }
  if (exported->offset + (*t)->nbytes > exported->allocation_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", spec.key, " (device ", device, "): its ", (*t)->nbytes,
                     " bytes at offset ", exported->offset, " overrun its CUDA allocation of ",
                     exported->allocation_bytes, " bytes"));
  }
  (*t)->data = static_cast<std::byte*>(device_ptr);
  (*t)->device = device;
  (*t)->device_uuid = std::move(exported->device_uuid);
  (*t)->cuda_ipc_handle = std::move(exported->ipc_handle);
  (*t)->ipc_offset = exported->offset;
  (*t)->allocation_bytes = exported->allocation_bytes;
  tensors_.push_back(*std::move(t));
  return tensors_.back().get();
}

StateTensor* StateDict::Find(const std::string& key) {
  for (const auto& t : tensors_) {
    if (t->key == key) return t.get();
  }
  return nullptr;
}

std::vector<pb::SharedTensor> StateDict::Describe(Lending lending) const {
  std::vector<pb::SharedTensor> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) {
    pb::SharedTensor s;
    pb::PieceMeta* shard = s.mutable_shard();
    shard->mutable_tensor()->set_key(t->key);
    shard->mutable_tensor()->set_dtype(DTypeToProto(t->dtype));
    for (int64_t d : t->global_shape) shard->mutable_tensor()->add_global_shape(d);
    *shard->mutable_region() = RegionToProto(t->region);
    for (int64_t r : t->replica_id) shard->add_replica_id(r);
    s.mutable_layout()->set_key(t->key);
    for (const Placement& p : t->placements) {
      if (p.is_shard()) {
        s.mutable_layout()->add_placements()->set_shard_dim(p.dim);
      } else {
        s.mutable_layout()->add_placements()->set_replicate(true);
      }
    }
    s.mutable_layout()->set_flat_sharded(t->flat_sharded);
    for (int64_t d : t->mesh_shape) s.add_mesh_shape(d);
    s.mutable_mesh_coordinate()->Add(t->mesh_coordinate.begin(), t->mesh_coordinate.end());
    s.set_nbytes(t->nbytes);
    if (t->memory == MemoryKind::kHost) {
      s.set_memory_kind(pb::MEMORY_HOST);
      s.set_segment(t->segment);
      s.set_offset(t->segment_offset);
      s.set_lent_until_durable(lending == Lending::kAllHostTensors ||
                               (lending == Lending::kMarkedTensors && t->lent_until_durable));
    } else {
      s.set_memory_kind(pb::MEMORY_DEVICE);
      s.set_cuda_ipc_handle(t->cuda_ipc_handle);
      s.set_device_uuid(t->device_uuid);
      s.set_device(t->device);
      s.set_ipc_offset(t->ipc_offset);
      s.set_allocation_bytes(t->allocation_bytes);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ckpt::client
