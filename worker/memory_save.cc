#include "worker/memory_save.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "rendezvous/grpc_store.h"
#include "spdlog/spdlog.h"
#include "storage/manifest_codec.h"
#include "worker/load_communicator.h"

namespace ckpt::worker {
namespace {

// One file of this rank's share, as sent to its replica ranks.
struct OwnFile {
  std::string name;
  std::shared_ptr<const std::string> bytes;
};

// Where a memory save's time went, for its log line.
struct KeepStats {
  absl::Duration encode, rendezvous, replicate;
  bool communicator_reused = false;
  int64_t bytes_sent = 0, bytes_received = 0;
};

// One file announced by a peer: its name and size.
struct AnnouncedFile {
  std::string name;
  uint64_t size = 0;
};

void AppendU64(uint64_t v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// The header a rank sends its replica ranks before the files: per file [u64 name length][name]
// [u64 size]. The files themselves then go one per round, straight from the tier's buffers.
std::string FileHeader(const std::vector<OwnFile>& files) {
  std::string out;
  for (const OwnFile& f : files) {
    AppendU64(f.name.size(), &out);
    out.append(f.name);
    AppendU64(f.bytes->size(), &out);
  }
  return out;
}

// The files a peer's header announces; InvalidArgument naming the peer for a truncated header
// or a file larger than this tier's budget (checked before anything is allocated for it).
absl::StatusOr<std::vector<AnnouncedFile>> ParseHeader(const char* data, size_t size, int peer,
                                                       int64_t budget) {
  std::vector<AnnouncedFile> out;
  size_t at = 0;
  auto take = [&](uint64_t* v) {
    if (size - at < sizeof(*v)) return false;
    std::memcpy(v, data + at, sizeof(*v));
    at += sizeof(*v);
    return true;
  };
  while (at < size) {
    uint64_t n = 0;
    AnnouncedFile f;
    if (!take(&n) || size - at < n) {
      return absl::InvalidArgumentError(absl::StrCat("truncated replica header from rank ", peer));
    }
    f.name.assign(data + at, n);
    at += n;
    if (!take(&f.size)) {
      return absl::InvalidArgumentError(absl::StrCat("truncated replica header from rank ", peer));
    }
    if (f.size > static_cast<uint64_t>(budget)) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", peer, " announces replica file ",
                                                     f.name, " of ", f.size,
                                                     " bytes, more than this tier's budget"));
    }
    out.push_back(std::move(f));
  }
  return out;
}

// The replica headers every peer sent this rank (empty for a peer that does not replicate
// here), and the most files any rank sends (the rounds every rank runs).
absl::StatusOr<std::vector<std::vector<AnnouncedFile>>> ExchangeHeaders(
    Communicator& comm, const std::vector<bool>& targets, const std::vector<OwnFile>& mine,
    int64_t budget, absl::Time deadline, int* rounds) {
  const int world = comm.size();
  const std::string header = FileHeader(mine);
  // To every peer: [header bytes (0 unless a replica target)][this rank's file count].
  std::vector<uint64_t> send_counts(2 * world, 0), recv_counts(2 * world, 0);
  std::string headers;
  std::vector<size_t> header_sizes(world, 0);
  for (int r = 0; r < world; ++r) {
    send_counts[2 * r + 1] = mine.size();
    if (!targets[r]) continue;
    send_counts[2 * r] = header.size();
    header_sizes[r] = header.size();
    headers.append(header);
  }
  const std::vector<size_t> sixteen(world, 2 * sizeof(uint64_t));
  CKPT_RETURN_IF_ERROR(
      comm.AllToAllV(send_counts.data(), sixteen, recv_counts.data(), sixteen, deadline));
  std::vector<size_t> recv_sizes(world);
  size_t total = 0;
  *rounds = static_cast<int>(mine.size());
  for (int r = 0; r < world; ++r) {
    recv_sizes[r] = recv_counts[2 * r];
    total += recv_sizes[r];
    *rounds = std::max<int>(*rounds, static_cast<int>(recv_counts[2 * r + 1]));
  }
  std::string received(total, '\0');
  CKPT_RETURN_IF_ERROR(
      comm.AllToAllV(headers.data(), header_sizes, received.data(), recv_sizes, deadline));
  std::vector<std::vector<AnnouncedFile>> out(world);
  size_t at = 0;
  for (int r = 0; r < world; ++r) {
    CKPT_ASSIGN_OR_RETURN(out[r], ParseHeader(received.data() + at, recv_sizes[r], r, budget));
    at += recv_sizes[r];
  }
  return out;
}

// Sends `mine` to every replica rank and keeps what the others send here: a header round, then
// one round per file in which every target is sent the tier's own buffer of that file and each
// peer's file lands in the buffer the tier keeps (no framing copy, no unframing copy).
absl::Status Replicate(const pb::SavePlanPart& part, const std::string& operation_id,
                       const std::vector<OwnFile>& mine, const MemorySaveContext& context,
                       const std::string& who, KeepStats* stats) {
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
  CommunicatorCache* cache =
      context.communicators != nullptr ? context.communicators : SharedCommunicators();
  absl::Time start = absl::Now();
  CKPT_ASSIGN_OR_RETURN(PartCommunicator joined,
                        JoinOrReuseLoadCommunicator(group, config, &store, who, cache,
                                                    CommunicatorCacheKey(group, config)));
  stats->rendezvous = absl::Now() - start;
  stats->communicator_reused = joined.reused();
  start = absl::Now();
  Communicator* comm = &joined.get();
  const int world = part.world_size();
  const absl::Time deadline = absl::Now() + context.timeout;
  std::vector<bool> targets(world, false);
  for (int r : part.replica_ranks()) {
    if (r < 0 || r >= world || r == part.rank()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": replica rank ", r, " of ", world));
    }
    targets[r] = true;
  }
  int rounds = 0;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::vector<AnnouncedFile>> announced,
                        ExchangeHeaders(*comm, targets, mine, context.tier->options().budget_bytes,
                                        deadline, &rounds));
  for (int k = 0; k < rounds; ++k) {
    std::vector<SendBuffer> sends(world);
    std::vector<RecvBuffer> recvs(world);
    std::vector<std::shared_ptr<std::string>> received(world);
    for (int r = 0; r < world; ++r) {
      if (targets[r] && k < static_cast<int>(mine.size())) {
        sends[r] = SendBuffer{mine[k].bytes->data(), mine[k].bytes->size()};
      }
      if (k >= static_cast<int>(announced[r].size())) continue;
      CKPT_RETURN_IF_ERROR(ValidateDataFileName(announced[r][k].name));
      received[r] = std::make_shared<std::string>();
      received[r]->resize(static_cast<size_t>(announced[r][k].size));
      recvs[r] = RecvBuffer{received[r]->data(), received[r]->size()};
    }
    CKPT_RETURN_IF_ERROR(comm->AllToAllVBuffers(sends, recvs, deadline));
    for (int r = 0; r < world; ++r) {
      stats->bytes_sent += static_cast<int64_t>(sends[r].bytes);
      if (received[r] == nullptr) continue;
      stats->bytes_received += static_cast<int64_t>(received[r]->size());
      CKPT_RETURN_IF_ERROR(context.tier->Put(part.memory_checkpoint(), operation_id,
                                             announced[r][k].name, std::move(received[r])));
    }
  }
  stats->replicate = absl::Now() - start;
  joined.Finish(absl::OkStatus());  // kept for the job's next memory save over these ranks
  return absl::OkStatus();
}

absl::StatusOr<std::string> KeepAndReplicate(const pb::SavePlanPart& part,
                                             const std::string& operation_id,
                                             const SaveSnapshot& snapshot,
                                             const MemorySaveContext& context,
                                             const MemoryGate& gate, const std::string& who,
                                             KeepStats* stats) {
  const absl::Time start = absl::Now();
  pb::Manifest written;
  std::vector<OwnFile> mine;
  for (size_t i = 0; i < snapshot.files.size(); ++i) {
    if (absl::Status closed = gate.status(); !closed.ok()) return closed;
    CKPT_ASSIGN_OR_RETURN(EncodedFile file,
                          EncodeDataFile(snapshot.tensors, snapshot.files[i], static_cast<int>(i),
                                         kDefaultChecksumBlockBytes));
    CKPT_RETURN_IF_ERROR(
        context.tier->Put(part.memory_checkpoint(), operation_id, file.name, file.bytes));
    if (part.replica_ranks_size() > 0) mine.push_back(OwnFile{file.name, file.bytes});
    for (pb::StoredPiece& p : file.records.pieces) *written.add_pieces() = std::move(p);
    for (pb::DataFile& f : file.records.files) *written.add_files() = std::move(f);
  }
  stats->encode = absl::Now() - start;
  if (!part.group().empty() && part.world_size() > 1) {
    CKPT_RETURN_IF_ERROR(Replicate(part, operation_id, mine, context, who, stats));
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
  KeepStats stats;
  absl::StatusOr<std::string> written =
      KeepAndReplicate(part, operation_id, snapshot, context, gate, who, &stats);
  spdlog::info(
      "memory_save_kept op={} rank={} checkpoint=mem://{} replicas={} encode_s={:.3f} "
      "rendezvous_s={:.3f} communicator_reused={} replicate_s={:.3f} bytes_sent={} "
      "bytes_received={} ok={}",
      operation_id, part.rank(), part.memory_checkpoint(), part.replica_ranks_size(),
      absl::ToDoubleSeconds(stats.encode), absl::ToDoubleSeconds(stats.rendezvous),
      stats.communicator_reused, absl::ToDoubleSeconds(stats.replicate), stats.bytes_sent,
      stats.bytes_received, written.ok());
  if (!written.ok()) {
    context.tier->Drop(part.memory_checkpoint());
    return absl::Status(written.status().code(),
                        absl::StrCat(who, ": ", written.status().message()));
  }
  context.tier->Seal(part.memory_checkpoint(), part.keep_newest(), part.retention_group());
  return written;
}

}  // namespace ckpt::worker
