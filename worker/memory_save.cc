#include "worker/memory_save.h"

#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rendezvous/grpc_store.h"
#include "storage/manifest_codec.h"
#include "worker/load_communicator.h"

namespace ckpt::worker {
namespace {

// Frames files as [u64 name length][name][u64 size][bytes]...
void AppendFrame(const std::string& name, const std::string& bytes, std::string* out) {
  const uint64_t n = name.size(), b = bytes.size();
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
  out->append(name);
  out->append(reinterpret_cast<const char*>(&b), sizeof(b));
  out->append(bytes);
}

// The files framed in `data`; InvalidArgument for a truncated frame.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseFrames(const char* data,
                                                                             size_t size) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 0;
  auto take = [&](uint64_t* v) {
    if (size - at < sizeof(*v)) return false;
    std::memcpy(v, data + at, sizeof(*v));
    at += sizeof(*v);
    return true;
  };
  while (at < size) {
    uint64_t n = 0, b = 0;
    if (!take(&n) || size - at < n) return absl::InvalidArgumentError("truncated replica frame");
    std::string name(data + at, n);
    at += n;
    if (!take(&b) || size - at < b) return absl::InvalidArgumentError("truncated replica frame");
    out.emplace_back(std::move(name), std::string(data + at, b));
    at += b;
  }
  return out;
}

// Sends `mine` (framed files) to every replica rank and keeps what the others send here.
absl::Status Replicate(const pb::SavePlanPart& part, const std::string& operation_id,
                       const std::string& mine, const MemorySaveContext& context,
                       const std::string& who) {
  pb::LoadPlanPart group;  // the communicator's coordinates, in the load part's terms
  group.set_rank(part.rank());
  group.set_world_size(part.world_size());
  group.set_group(part.group());
  LoadCommunicatorConfig config;
  config.hostname = context.hostname;
  config.gloo_loop_thread_nice = context.gloo_loop_thread_nice;
  config.rendezvous_address = context.rendezvous_address;
  config.rendezvous_timeout = context.timeout;
  GrpcStore store(context.rendezvous_address, context.rendezvous_security);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                        JoinLoadCommunicator(group, config, &store, who));
  const int world = part.world_size();
  const absl::Time deadline = absl::Now() + context.timeout;
  std::vector<uint64_t> send_sizes(world, 0), recv_sizes(world, 0);
  for (int r : part.replica_ranks()) {
    if (r < 0 || r >= world || r == part.rank()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": replica rank ", r, " of ", world));
    }
    send_sizes[r] = mine.size();
  }
  const std::vector<size_t> eight(world, sizeof(uint64_t));
  CKPT_RETURN_IF_ERROR(
      comm->AllToAllV(send_sizes.data(), eight, recv_sizes.data(), eight, deadline));
  // Every replica rank is sent `mine` itself, and each peer's files land in their own buffer:
  // no copy per target.
  std::vector<SendBuffer> sends(world);
  std::vector<RecvBuffer> recvs(world);
  std::vector<std::string> received(world);
  for (int r = 0; r < world; ++r) {
    if (send_sizes[r] > 0) sends[r] = SendBuffer{mine.data(), mine.size()};
    if (r == part.rank()) continue;  // nothing to itself: send_sizes[rank] stays 0
    received[r].resize(static_cast<size_t>(recv_sizes[r]));
    recvs[r] = RecvBuffer{received[r].data(), received[r].size()};
  }
  CKPT_RETURN_IF_ERROR(comm->AllToAllVBuffers(sends, recvs, deadline));
  for (int r = 0; r < world; ++r) {
    if (received[r].empty()) continue;
    CKPT_ASSIGN_OR_RETURN(auto files, ParseFrames(received[r].data(), received[r].size()));
    for (auto& [name, bytes] : files) {
      CKPT_RETURN_IF_ERROR(ValidateDataFileName(name));
      CKPT_RETURN_IF_ERROR(
          context.tier->Put(part.memory_checkpoint(), operation_id, name,
                            std::make_shared<const std::string>(std::move(bytes))));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> KeepAndReplicate(const pb::SavePlanPart& part,
                                             const std::string& operation_id,
                                             const SaveSnapshot& snapshot,
                                             const MemorySaveContext& context,
                                             const MemoryGate& gate, const std::string& who) {
  pb::Manifest written;
  std::string framed;
  for (size_t i = 0; i < snapshot.files.size(); ++i) {
    if (absl::Status closed = gate.status(); !closed.ok()) return closed;
    CKPT_ASSIGN_OR_RETURN(EncodedFile file,
                          EncodeDataFile(snapshot.tensors, snapshot.files[i], static_cast<int>(i),
                                         kDefaultChecksumBlockBytes));
    CKPT_RETURN_IF_ERROR(
        context.tier->Put(part.memory_checkpoint(), operation_id, file.name, file.bytes));
    if (part.replica_ranks_size() > 0) AppendFrame(file.name, *file.bytes, &framed);
    for (pb::StoredPiece& p : file.records.pieces) *written.add_pieces() = std::move(p);
    for (pb::DataFile& f : file.records.files) *written.add_files() = std::move(f);
  }
  if (!part.group().empty() && part.world_size() > 1) {
    CKPT_RETURN_IF_ERROR(Replicate(part, operation_id, framed, context, who));
  }
  return written.SerializeAsString();
}

}  // namespace

absl::StatusOr<std::string> KeepSnapshotInMemory(const pb::SavePlanPart& part,
                                                 const std::string& operation_id,
                                                 const SaveSnapshot& snapshot,
                                                 const MemorySaveContext& context,
                                                 const MemoryGate& gate) {
  const std::string who = absl::StrCat("rank ", part.rank(), " of job ", snapshot.job, " (mem://",
                                       part.memory_checkpoint(), ")");
  if (context.tier == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": this worker has no memory tier (--memory_tier_bytes 0)"));
  }
  absl::StatusOr<std::string> written =
      KeepAndReplicate(part, operation_id, snapshot, context, gate, who);
  if (!written.ok()) {
    context.tier->Drop(part.memory_checkpoint());
    return absl::Status(written.status().code(),
                        absl::StrCat(who, ": ", written.status().message()));
  }
  context.tier->Seal(part.memory_checkpoint(), part.keep_newest(), part.retention_group());
  return written;
}

}  // namespace ckpt::worker
