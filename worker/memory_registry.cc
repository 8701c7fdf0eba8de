#include "worker/memory_registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "device/device_uuid.h"
#include "device/gpu.h"
#include "proto/convert.h"
#include "proto/wire_names.h"
#include "sharding/dtype.h"
#include "sharding/region.h"

namespace ckpt::worker {
namespace {

absl::StatusOr<int64_t> ElementSize(pb::DType dtype, const std::string& key) {
  absl::StatusOr<DType> parsed = DTypeFromProto(dtype);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", key, ": ", parsed.status().message()));
  }
  return DTypeSize(*parsed);
}

}  // namespace

uint64_t ProcfsProcessProbe::StartToken(pid_t pid) const {
  if (pid <= 0) return 0;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return 0;
  // Fields after the command name (which may contain spaces) start after the last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string state;
  rest >> state;
  if (state == "Z" || state == "X" || state == "x") return 0;
  // Field 22 (starttime) follows fields 4..21 (18 of them) after the state (field 3).
  std::string field;
  for (int i = 0; i < 18 && rest >> field; ++i) {
  }
  uint64_t start = 0;
  if (!(rest >> start)) return 0;
  return start + 1;  // never 0 for a live process
}

absl::Status ValidateSegmentName(const std::string& name, pid_t pid) {
  std::string marker = absl::StrCat(".p", pid, ".");
  if (name.size() > 255 || !absl::StartsWith(name, "/ckpt.") ||
      name.find('/', 1) != std::string::npos || !absl::StrContains(name, marker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory segment name \"", name, "\" is not one the client library of pid ", pid,
        " allocates (\"/ckpt.<job>.r<rank>.p", pid, ".<n>\")"));
  }
  return absl::OkStatus();
}

std::vector<std::string> SweepOrphanSegments(const ProcessProbe& probe,
                                             const std::vector<uid_t>& trainer_uids,
                                             const std::string& shm_dir) {
  std::vector<std::string> removed;
  DIR* dir = opendir(shm_dir.c_str());
  if (dir == nullptr) return removed;
  const uid_t uid = getuid();
  while (struct dirent* entry = readdir(dir)) {
    absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, "ckpt.")) continue;
    // The pid sits in the ".p<pid>." component before the last one.
    size_t last = name.rfind('.');
    if (last == absl::string_view::npos || last == 0) continue;
    size_t marker = name.rfind(".p", last - 1);
    if (marker == absl::string_view::npos) continue;
    pid_t pid = 0;
    if (!absl::SimpleAtoi(name.substr(marker + 2, last - marker - 2), &pid) || pid <= 0) continue;
    struct stat st;
    std::string path = absl::StrCat(shm_dir, "/", name);
    if (stat(path.c_str(), &st) != 0) continue;
    if (st.st_uid != uid && absl::c_find(trainer_uids, st.st_uid) == trainer_uids.end()) continue;
    if (probe.StartToken(pid) != 0) continue;
    std::string shm_name = absl::StrCat("/", name);
    if (shm_unlink(shm_name.c_str()) == 0) removed.push_back(shm_name);
  }
  closedir(dir);
  return removed;
}

absl::Status CheckDeviceShare(const pb::SharedTensor& t, int worker_gpu,
                              const std::string& worker_gpu_uuid,
                              const std::string& no_gpu_reason) {
  const std::string& key = t.shard().tensor().key();
  const std::string what = absl::StrCat("tensor ", key, " (device ", t.device(), ")");
  if (worker_gpu < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is in device memory, but this worker serves no GPU: ", no_gpu_reason));
  }
  if (t.cuda_ipc_handle().size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": its CUDA IPC handle has ",
                                                   t.cuda_ipc_handle().size(), " bytes, expected ",
                                                   kCudaIpcHandleBytes));
  }
  // By UUID: the trainer's ordinal and the worker's differ under different
  // CUDA_VISIBLE_DEVICES, and the same ordinal may name different GPUs.
  if (absl::Status same =
          CheckSameDevice(key, t.device_uuid(), t.device(), worker_gpu_uuid, worker_gpu);
      !same.ok()) {
    return same;
  }
  if (t.ipc_offset() < 0 || t.nbytes() < 0 || t.allocation_bytes() <= 0 ||
      static_cast<uint64_t>(t.ipc_offset()) + static_cast<uint64_t>(t.nbytes()) >
          static_cast<uint64_t>(t.allocation_bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bytes [", t.ipc_offset(), ", ", t.ipc_offset() + t.nbytes(),
                     ") lie outside its CUDA allocation of ", t.allocation_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

MappedSegment::~MappedSegment() {
  if (addr_ != nullptr) munmap(addr_, size_);
}

MemoryRegistry::MemoryRegistry(std::unique_ptr<ProcessProbe> probe) : probe_(std::move(probe)) {}

MemoryRegistry::~MemoryRegistry() {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.clear();
}

absl::StatusOr<std::string> MemoryRegistry::OpenSession(const TrainerIdentity& trainer) {
  if (trainer.job.empty()) return absl::InvalidArgumentError("trainer hello without a job name");
  if (trainer.world_size <= 0 || trainer.rank < 0 || trainer.rank >= trainer.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("job ", trainer.job, ": rank ", trainer.rank,
                                                   " is outside world size ", trainer.world_size));
  }
  uint64_t token = probe_->StartToken(trainer.pid);
  if (token == 0) {
    return absl::InvalidArgumentError(absl::StrCat("job ", trainer.job, " rank ", trainer.rank,
                                                   ": trainer pid ", trainer.pid,
                                                   " is not a live process on this host"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = absl::StrCat("s-", next_session_++, "-p", trainer.pid);
  Session& session = sessions_[id];
  session.trainer = trainer;
  session.start_token = token;
  return id;
}

absl::StatusOr<std::shared_ptr<const MappedSegment>> MemoryRegistry::MapSegment(
    const std::string& name) const {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open shared-memory segment ", name, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of segment ", name, ": ", std::strerror(err)));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* addr = nullptr;
  if (size > 0) {
    addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of segment ", name, " (", size, " bytes): ", std::strerror(err)));
    }
  }
  close(fd);
  return std::make_shared<const MappedSegment>(addr, size);
}

namespace {

// The shared tensor names a key, a region valid for its shape, and exactly the region's bytes.
absl::Status CheckSharedTensorSize(const pb::SharedTensor& t, const std::string& who) {
  const std::string& key = t.shard().tensor().key();
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(who, ": tensor without key"));
  std::vector<int64_t> shape(t.shard().tensor().global_shape().begin(),
                             t.shard().tensor().global_shape().end());
  absl::StatusOr<Region> parsed = RegionFromProto(t.shard().region());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor ", key, ": ", parsed.status().message()));
  }
  const Region& region = *parsed;
  if (absl::Status s = ValidateRegion(region, shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor ", key, " region ", region.DebugString(), ": ", s.message()));
  }
  absl::StatusOr<int64_t> elem = ElementSize(t.shard().tensor().dtype(), key);
  if (!elem.ok())
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", elem.status().message()));
  const int64_t expected = region.NumElements() * *elem;
  if (t.nbytes() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": tensor ", key, " region ",
                                                   region.DebugString(), " needs ", expected,
                                                   " bytes but ", t.nbytes(), " were shared"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MemoryRegistry::RegisterTensors(const std::string& session_id,
                                             absl::Span<const pb::SharedTensor> tensors) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "trainer session ", session_id, " is unknown (the worker restarted?); say Hello again"));
  }
  Session& session = it->second;
  const std::string who = absl::StrCat("job ", session.trainer.job, " rank ", session.trainer.rank);
  std::vector<RegisteredTensor> registered;
  // The device allocations the new tensors use (opened ones reused; the rest close).
  std::map<std::string, std::shared_ptr<const OpenedDeviceAllocation>> opened;
  for (const pb::SharedTensor& t : tensors) {
    const std::string& key = t.shard().tensor().key();
    if (absl::Status s = CheckSharedTensorSize(t, who); !s.ok()) return s;
    RegisteredTensor r;
    r.shard = t.shard();
    r.memory_kind = t.memory_kind();
    r.segment = t.segment();
    r.offset = t.offset();
    r.nbytes = t.nbytes();
    r.layout = t.layout();
    r.mesh_shape.assign(t.mesh_shape().begin(), t.mesh_shape().end());
    r.mesh_coordinate.assign(t.mesh_coordinate().begin(), t.mesh_coordinate().end());
    if (t.memory_kind() == pb::MEMORY_DEVICE) {
      if (absl::Status s = RegisterDeviceTensor(t, who, session, opened, r); !s.ok()) return s;
      registered.push_back(std::move(r));
      continue;
    }
    if (t.memory_kind() != pb::MEMORY_HOST) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": tensor ", key, " has memory kind ",
                                                     MemoryKindName(t.memory_kind()),
                                                     " (expected host or device)"));
    }
    if (absl::Status s = ValidateSegmentName(t.segment(), session.trainer.pid); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": tensor ", key, ": ", s.message()));
    }
    auto seg = session.segments.find(t.segment());
    if (seg == session.segments.end()) {
      absl::StatusOr<std::shared_ptr<const MappedSegment>> m = MapSegment(t.segment());
      if (!m.ok()) {
        return absl::Status(m.status().code(),
                            absl::StrCat(who, ": tensor ", key, ": ", m.status().message()));
      }
      seg = session.segments.emplace(t.segment(), *m).first;
    }
    if (t.offset() < 0 || t.nbytes() < 0 ||
        static_cast<uint64_t>(t.offset()) + static_cast<uint64_t>(t.nbytes()) >
            seg->second->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": tensor ", key, " bytes [", t.offset(), ", ", t.offset() + t.nbytes(),
          ") lie outside segment ", t.segment(), " of ", seg->second->size(), " bytes"));
    }
    r.data = static_cast<std::byte*>(seg->second->addr()) + t.offset();
    r.mapping = seg->second;
    r.lent_until_durable = t.lent_until_durable();
    registered.push_back(std::move(r));
  }
  session.tensors = std::move(registered);
  session.device_allocations = std::move(opened);
  return absl::OkStatus();
}

absl::Status MemoryRegistry::RegisterDeviceTensor(
    const pb::SharedTensor& t, const std::string& who, Session& session,
    std::map<std::string, std::shared_ptr<const OpenedDeviceAllocation>>& opened,
    RegisteredTensor& r) const {
  std::string no_gpu_reason = "started with --gpu -1";
  if (gpu_ < 0) {
    absl::StatusOr<int> gpus = CudaDeviceCount();
    if (!gpus.ok()) no_gpu_reason = std::string(gpus.status().message());
  }
  if (absl::Status s = CheckDeviceShare(t, gpu_, gpu_uuid_, no_gpu_reason); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who, ": ", s.message()));
  }
  std::shared_ptr<const OpenedDeviceAllocation> allocation;
  if (auto it = opened.find(t.cuda_ipc_handle()); it != opened.end()) {
    allocation = it->second;
  } else if (auto kept = session.device_allocations.find(t.cuda_ipc_handle());
             kept != session.device_allocations.end()) {
    allocation = kept->second;  // opened once while the trainer stays attached
  } else {
    absl::StatusOr<std::shared_ptr<const OpenedDeviceAllocation>> fresh =
        OpenDeviceAllocation(t.cuda_ipc_handle(), gpu_);
    if (!fresh.ok()) {
      return absl::Status(
          fresh.status().code(),
          absl::StrCat(who, ": tensor ", t.shard().tensor().key(), " (device ", gpu_,
                       "): opening its CUDA IPC handle: ", fresh.status().message()));
    }
    allocation = *std::move(fresh);
  }
  opened.emplace(t.cuda_ipc_handle(), allocation);
  r.device = gpu_;
  r.device_ptr = static_cast<std::byte*>(allocation->base()) + t.ipc_offset();
  r.device_allocation = std::move(allocation);
  return absl::OkStatus();
}

void MemoryRegistry::Release(Session& session, bool unlink) {
  // Unmapped when the last SessionInfo copy of a running plan part lets go of them.
  for (auto& [name, mapping] : session.segments) {
    if (unlink) shm_unlink(name.c_str());  // ENOENT when the trainer already unlinked it: fine
  }
  session.segments.clear();
  session.tensors.clear();
  session.device_allocations.clear();  // closed once no running part holds them
}

absl::Status MemoryRegistry::CloseSession(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("trainer session ", session_id, " is unknown"));
  }
  Release(it->second, /*unlink=*/false);
  sessions_.erase(it);
  return absl::OkStatus();
}

std::vector<SessionInfo> MemoryRegistry::ReapDeadTrainers() {
  std::vector<SessionInfo> reaped;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (probe_->StartToken(it->second.trainer.pid) != it->second.start_token) {
      reaped.push_back(Summarize(it->first, it->second));
      Release(it->second, /*unlink=*/true);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  return reaped;
}

SessionInfo MemoryRegistry::Summarize(const std::string& id, const Session& session) {
  SessionInfo info;
  info.id = id;
  info.trainer = session.trainer;
  for (const auto& [name, mapping] : session.segments) info.segments.push_back(name);
  info.tensors = session.tensors;
  return info;
}

absl::StatusOr<SessionInfo> MemoryRegistry::Find(const std::string& session_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "trainer session ", session_id, " is unknown (the worker restarted?); say Hello again"));
  }
  return Summarize(it->first, it->second);
}

std::vector<SessionInfo> MemoryRegistry::Sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, session] : sessions_) out.push_back(Summarize(id, session));
  return out;
}

int MemoryRegistry::SessionsOfJob(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [id, session] : sessions_) n += session.trainer.job == job ? 1 : 0;
  return n;
}

int MemoryRegistry::SessionsOfRank(const std::string& job, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [id, session] : sessions_) {
    n += session.trainer.job == job && session.trainer.rank == rank ? 1 : 0;
  }
  return n;
}

}  // namespace ckpt::worker
