// Client::Publish and Client::Receive (client/transfer.h), over Save and Load of xfer:// paths,
// and the host shadows that stage device tensors for them and for memory saves (mem://).
#include "client/transfer.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/transfer_path.h"
#include "device/gpu.h"

namespace ckpt::client {
namespace {

// Whether `shadow` has exactly `state`'s tensors (keys, dtypes, shapes, regions), in order.
bool SameTensors(const StateDict& shadow, const StateDict& state) {
  if (shadow.tensors().size() != state.tensors().size()) return false;
  for (size_t i = 0; i < state.tensors().size(); ++i) {
    const StateTensor& a = *shadow.tensors()[i];
    const StateTensor& b = *state.tensors()[i];
    if (a.key != b.key || a.dtype != b.dtype || a.global_shape != b.global_shape ||
        a.region != b.region || a.nbytes != b.nbytes || a.replica_id != b.replica_id) {
      return false;
    }
  }
  return true;
}

}  // namespace

namespace {

// Copies one tensor's bytes between host memory and host or device memory (a shadow is always
// host memory). The CUDA error naming the tensor and device when a device copy fails.
absl::Status CopyTensor(const StateTensor& source, StateTensor& target) {
  const size_t bytes = static_cast<size_t>(target.nbytes);
  absl::Status s;
  const StateTensor* device = nullptr;
  if (source.memory == MemoryKind::kHost && target.memory == MemoryKind::kHost) {
    std::memcpy(target.data, source.data, bytes);
  } else if (source.memory == MemoryKind::kHost) {
    device = &target;
    s = CopyHostToDevice(target.data, target.device, source.data, bytes);
  } else {
    device = &source;
    s = CopyDeviceToHost(target.data, source.data, source.device, bytes);
  }
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("tensor ", device->key, " (device ", device->device,
                                             "): ", s.message()));
}

bool HasDeviceTensors(const StateDict& state) {
  for (const std::unique_ptr<StateTensor>& t : state.tensors()) {
    if (t->memory != MemoryKind::kHost) return true;
  }
  return false;
}

}  // namespace

absl::Status CopyTensors(const StateDict& from, StateDict& to) {
  for (size_t i = 0; i < to.tensors().size() && i < from.tensors().size(); ++i) {
    const StateTensor& source = *from.tensors()[i];
    StateTensor& target = *to.tensors()[i];
    if (target.nbytes <= 0 || target.nbytes != source.nbytes) continue;
    if (absl::Status s = CopyTensor(source, target); !s.ok()) return s;
  }
  return absl::OkStatus();
}

PublishHandle::PublishHandle(std::unique_ptr<SaveHandle> save, std::string name, int64_t version)
    : save_(std::move(save)), name_(std::move(name)), version_(version) {}

PublishHandle::~PublishHandle() = default;

const std::string& PublishHandle::operation_id() const { return save_->operation_id(); }

absl::Status PublishHandle::WaitPublished(absl::Duration timeout) {
  absl::Status s = save_->WaitDurable(timeout);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("publishing ", TransferPathString(name_, version_),
                                             ": ", s.message()));
}

absl::StatusOr<std::unique_ptr<PublishHandle>> Client::Publish(const std::string& name,
                                                               const StateDict& state,
                                                               const PublishOptions& options) {
  auto previous = published_versions_.find(name);
  absl::StatusOr<int64_t> next = NextTransferVersion(
      name, options.version, previous == published_versions_.end() ? 0 : previous->second);
  if (!next.ok()) return next.status();
  const int64_t version = *next;
  SaveOptions save;
  save.metadata = options.metadata;
  save.arrival_timeout = options.arrival_timeout;
  save.lending = Lending::kNone;  // snapshot: every byte is copied before Publish returns
  save.memory_replicas = options.memory_replicas;
  // A published version lives in the source workers' memory tiers, which hold host bytes: device
  // tensors are copied into a host shadow here first (the snapshot: the trainer may go on).
  absl::StatusOr<const StateDict*> source =
      StagedOnHost(absl::StrCat("publish:", name),
                   absl::StrCat("publishing ", TransferPathString(name, version)), state);
  if (!source.ok()) return source.status();
  absl::StatusOr<std::unique_ptr<SaveHandle>> handle =
      Save(TransferPathString(name, version), **source, save);
  if (!handle.ok()) return handle.status();
  published_versions_[name] = version;
  return std::make_unique<PublishHandle>(*std::move(handle), name, version);
}

absl::StatusOr<const StateDict*> Client::StagedOnHost(const std::string& key,
                                                      const std::string& what,
                                                      const StateDict& state) {
  if (!HasDeviceTensors(state)) return &state;
  absl::StatusOr<StateDict*> shadow = ShadowFor(key, state);
  if (!shadow.ok()) return shadow.status();
  if (absl::Status s = CopyTensors(state, **shadow); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  return *shadow;
}

absl::StatusOr<StateDict*> Client::ShadowFor(const std::string& name, const StateDict& state) {
  std::unique_ptr<StateDict>& shadow = shadows_[name];
  if (shadow != nullptr && SameTensors(*shadow, state)) return shadow.get();
  // Its own segment names ("/ckpt.<job>-rx<n>.r<rank>.p<pid>.<k>"): the state dicts of one
  // process must not share a prefix.
  shadow = std::make_unique<StateDict>(absl::StrCat(options_.job, "-rx", ++shadows_made_),
                                       options_.rank);
  // Device tensors get host shadows too: the version is received into host memory and copied
  // to the GPU only once it is whole.
  for (const std::unique_ptr<StateTensor>& t : state.tensors()) {
    TensorDeclaration spec;
    spec.key = t->key;
    spec.dtype = t->dtype;
    spec.global_shape = t->global_shape;
    spec.layout = t->region;
    spec.replica_id = t->replica_id;
    absl::StatusOr<StateTensor*> added = shadow->AddHost(spec);
    if (!added.ok()) {
      shadows_.erase(name);
      return absl::Status(added.status().code(),
                          absl::StrCat("allocating the host shadow (", name, ") of ", t->key, ": ",
                                       added.status().message()));
    }
  }
  return shadow.get();
}

absl::StatusOr<ReceivedVersion> Client::Receive(const std::string& name, StateDict& state,
                                                const ReceiveOptions& options) {
  if (absl::Status s = CheckReceiveVersion(name, options.version); !s.ok()) return s;
  absl::StatusOr<StateDict*> shadow = ShadowFor(name, state);
  if (!shadow.ok()) return shadow.status();
  LoadOptions load;
  load.arrival_timeout = options.arrival_timeout;
  load.deadline = options.deadline;
  load.memory_budget_bytes = options.memory_budget_bytes;
  load.exchange_algorithm = options.exchange_algorithm;
  absl::StatusOr<OperationProgress> received =
      LoadToEnd(TransferPathString(name, options.version, options.verify), **shadow, load);
  if (!received.ok()) return received.status();  // `state` untouched: the previous version
  if (!received->status.ok()) return received->status;
  // Every rank (and every serving worker) reported success: the version is whole. Copy it in.
  if (absl::Status copied = CopyTensors(**shadow, state); !copied.ok()) {
    return absl::Status(copied.code(),
                        absl::StrCat("receiving ", TransferPathString(name, 0),
                                     ": the version arrived whole, but ", copied.message()));
  }
  return ReceivedVersion{name, received->received_version};
}

}  // namespace ckpt::client
