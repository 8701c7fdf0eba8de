#include "worker/save_executor.h"

#include <algorithm>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "proto/wire_names.h"
#include "storage/checkpoint_writer.h"
#include "storage/data_file_stream.h"

namespace ckpt::worker {
namespace {

// Raw bytes of a compressed piece one pool chunk of `chunk_bytes` holds: whole codec chunks
// (0: not even one; the save is then not pipelined).
int64_t PackedRunBytes(int64_t chunk_bytes, const CompressionOptions& compression) {
  if (compression.chunk_bytes <= 0) return 0;
  return chunk_bytes / compression.chunk_bytes * compression.chunk_bytes;
}

// Threads that encode a compressed save's runs (the writer's and its helpers): as asked, else
// one per CPU, at most 8.
int EncodeThreads(const CompressionOptions& compression) {
  const int n = compression.threads > 0
                    ? compression.threads
                    : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::min(n, 8);
}

// Where a device piece's bytes go: piece `piece` of the snapshot's file `file`.
struct StreamTarget {
  int file = 0;
  int piece = 0;
};

// `report` with the host copies' waits for the pool folded into the figures the trainer hears.
SnapshotReport WithHostWaits(SnapshotReport report) {
  report.waited_for_writes = report.waited_for_writes || report.host_waited_for_pool;
  report.bytes_written_before_snapshot += report.host_bytes_written_before_snapshot;
  return report;
}

// The report the trainer hears with the snapshot signal: every device byte has left the device
// (the pipeline counts bytes as they are written, so the report says all of them), and those
// written before the signal.
SnapshotReport ReportAtDrain(const SnapshotReport& report, absl::Span<const DeviceRange> ranges) {
  SnapshotReport at_drain = report;
  at_drain.device.bytes = 0;
  for (const DeviceRange& r : ranges) at_drain.device.bytes += r.bytes;
  at_drain.bytes_written_before_snapshot = report.device.bytes_consumed_before_drained;
  at_drain.waited_for_writes = at_drain.bytes_written_before_snapshot > 0;
  return WithHostWaits(at_drain);
}

// Stages the device pieces through the worker's pinned pool straight into their data files
// (`streams`), inside the gate (closing it stops the staging after the copies in flight): each
// staged chunk is written and hashed while the next ones are copied. Signals the drain (also
// when there are no device pieces: the host pieces are copied already).
absl::Status StreamDeviceSnapshot(absl::Span<const DeviceRange> ranges,
                                  absl::Span<const StreamTarget> targets, const std::string& who,
                                  MemoryGate& gate, const DeviceSnapshotOptions& device,
                                  SaveSnapshot* snapshot) {
  SnapshotReport* report = &snapshot->report;
  if (ranges.empty()) {
    *report = WithHostWaits(*report);
    if (device.on_device_drained) device.on_device_drained(*report);
    return absl::OkStatus();
  }
  report->pinned_budget_bytes = device.staging->budget_bytes();
  const absl::Time deadline = absl::Now() + device.timeout;
  absl::StatusOr<PinnedStagingPool::Lease> lease = device.staging->Acquire(deadline);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat(who, ": staging device tensors: ", lease.status().message()));
  }
  absl::Status staged = gate.Run([&] {
    return StageDeviceToHost(
        *lease, ranges, who, [&gate] { return gate.status(); },
        [&](const StagedChunk& c) {
          // An abort stops the writes too, so closing the gate waits for one write at most.
          CKPT_RETURN_IF_ERROR(gate.status());
          const StreamTarget& to = targets[c.range];
          if (snapshot->writer != nullptr) {  // the host pieces' writer uses the files too
            return snapshot->writer->AppendLocked(to.file, to.piece, c.host, c.bytes);
          }
          return snapshot->streams[to.file]->Append(to.piece, c.host, c.bytes);
        },
        [&] {
          const SnapshotReport at_drain = ReportAtDrain(*report, ranges);
          if (device.on_device_drained) device.on_device_drained(at_drain);
        },
        deadline, &report->device);
  });
  report->bytes_written_before_snapshot = report->device.bytes_consumed_before_drained;
  report->waited_for_writes = report->bytes_written_before_snapshot > 0;
  *report = WithHostWaits(*report);
  return staged;
}

// A piece of the plan (the raw bytes [data, data + bytes), or none yet).
PieceData MakePiece(const std::string& key, const Region& region, const void* data, int64_t bytes) {
  PieceData p;
  p.key = key;
  p.region = region;
  p.data = data;
  p.size_bytes = bytes;
  return p;
}

// A planned piece checked against what the trainer shares: the tensor it comes from and its
// region. Errors name the rank and the tensor.
struct PlannedPiece {
  const RegisteredTensor* tensor = nullptr;
  Region region;
  const std::string& key() const { return tensor->shard.tensor().key(); }
};

// Whether `piece`, which gives its key, dtype, shape and region (pb::PlanPiece), names the
// shared tensor `t` (whose region is `shared`).
bool GivenPieceMatches(const pb::PlanPiece& piece, const RegisteredTensor& t, const Region& shared,
                       const std::string& who, absl::Status* error) {
  absl::StatusOr<Region> region = RegionFromProto(piece.region());
  if (!region.ok()) {
    *error = absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor ", piece.key(), ": ", region.status().message()));
    return false;
  }
  const pb::TensorMeta& meta = t.shard.tensor();
  if (meta.key() == piece.key() && *region == shared && meta.dtype() == piece.dtype() &&
      std::equal(meta.global_shape().begin(), meta.global_shape().end(),
                 piece.global_shape().begin(), piece.global_shape().end())) {
    return true;
  }
  *error = absl::FailedPreconditionError(
      absl::StrCat(who, ": the plan's piece ", piece.key(), " ", region->DebugString(),
                   " does not match the shared tensor ", meta.key(), " ", shared.DebugString()));
  return false;
}

// The shared tensor a plan piece names (by local index; a piece that gives its key, dtype,
// shape and region must match it), its size checked.
absl::StatusOr<PlannedPiece> ResolvePlannedPiece(const pb::PlanPiece& piece,
                                                 const SessionInfo& session,
                                                 const DeviceSnapshotOptions& device,
                                                 const std::string& who) {
  const std::string named =
      piece.key().empty() ? absl::StrCat("local index ", piece.local_index()) : piece.key();
  if (piece.local_index() < 0 || piece.local_index() >= static_cast<int>(session.tensors.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": tensor ", named, " (local index ", piece.local_index(), ") is not among the ",
        session.tensors.size(),
        " tensors the trainer shares now (did it re-register its state during the save?)"));
  }
  const RegisteredTensor& t = session.tensors[piece.local_index()];
  absl::StatusOr<Region> shared = RegionFromProto(t.shard.region());
  if (!shared.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": shared tensor ", t.shard.tensor().key(), ": ", shared.status().message()));
  }
  absl::Status mismatch;
  if (!piece.key().empty() && !GivenPieceMatches(piece, t, *shared, who, &mismatch)) {
    return mismatch;
  }
  if (t.nbytes != piece.size_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": the plan's piece ", named, " of ", piece.size_bytes(),
                     " bytes does not match the shared tensor ", t.shard.tensor().key(), " ",
                     shared->DebugString(), " of ", t.nbytes,
                     " bytes (did the trainer re-register its state during the save?)"));
  }
  const bool on_device = t.memory_kind == pb::MEMORY_DEVICE;
  const std::string& key = t.shard.tensor().key();
  if (on_device && device.staging == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": tensor ", key, " is in device memory (device ", t.device,
                     ") but this worker has no device staging (it serves no GPU)"));
  }
  if ((!on_device && (t.memory_kind != pb::MEMORY_HOST || (t.data == nullptr && t.nbytes > 0))) ||
      (on_device && t.device_ptr == nullptr && t.nbytes > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": tensor ", key, " is in ",
                                                      MemoryKindName(t.memory_kind),
                                                      " memory not mapped here"));
  }
  return PlannedPiece{&t, *std::move(shared)};
}

// The tensor of `meta`, appended to `tensors` the first time its key is seen.
absl::Status AddTensorOnce(const pb::TensorMeta& meta, const std::string& who,
                           std::set<std::string>* keys, std::vector<TensorMeta>* tensors) {
  if (!keys->insert(meta.key()).second) return absl::OkStatus();
  absl::StatusOr<DType> dtype = DTypeFromProto(meta.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tensor ", meta.key(), ": ", dtype.status().message()));
  }
  tensors->push_back(
      TensorMeta{meta.key(), *dtype,
                 std::vector<int64_t>(meta.global_shape().begin(), meta.global_shape().end())});
  return absl::OkStatus();
}

// Takes a save part's pieces out of the trainer's memory: SnapshotSavePart's steps.
class SnapshotTaker {
 public:
  SnapshotTaker(std::string who, const SessionInfo& session, MemoryGate& gate,
                const DeviceSnapshotOptions& device)
      : who_(std::move(who)), session_(session), gate_(gate), device_(device) {}

  SaveSnapshot& snapshot() { return snapshot_; }

  // Checks `piece` against the session and adds it to `plan` (the snapshot's next file): a host
  // piece copied into a worker buffer (or lent: written from the trainer's mapping later), a
  // device piece without data, queued for streaming into its file.
  absl::Status TakePiece(const pb::PlanPiece& piece, DataFilePlan* plan) {
    CKPT_ASSIGN_OR_RETURN(PlannedPiece planned,
                          ResolvePlannedPiece(piece, session_, device_, who_));
    const RegisteredTensor& t = *planned.tensor;
    CKPT_RETURN_IF_ERROR(AddTensorOnce(t.shard.tensor(), who_, &keys_, &snapshot_.tensors));
    const std::string& key = planned.key();
    if (t.memory_kind == pb::MEMORY_DEVICE) {  // staged once every host piece is copied
      targets_.push_back(StreamTarget{static_cast<int>(snapshot_.files.size()),
                                      static_cast<int>(plan->pieces.size())});
      ranges_.push_back(DeviceRange{key, t.device_ptr, t.nbytes});
      plan->pieces.push_back(MakePiece(key, planned.region, nullptr, t.nbytes));
      return absl::OkStatus();
    }
    const HostPiece host{static_cast<int>(snapshot_.files.size()),
                         static_cast<int>(plan->pieces.size()), &key,
                         reinterpret_cast<const char*>(t.data), t.nbytes};
    if (t.lent_until_durable) {
      // Lent until the save ends: written from the trainer's mapping, which stays mapped.
      snapshot_.mappings.push_back(t.mapping);
      snapshot_.report.lent_bytes += t.nbytes;
      plan->pieces.push_back(MakePiece(key, planned.region, t.data, t.nbytes));
      lent_.push_back(host);
      return absl::OkStatus();
    }
    if (device_.host_pool != nullptr) {  // copied into pool chunks by CopyHostPieces
      plan->pieces.push_back(MakePiece(key, planned.region, nullptr, t.nbytes));
      copies_.push_back(host);
      return absl::OkStatus();
    }
    // The copy is what gets written: the trainer may change its tensors once this returns.
    snapshot_.buffers.emplace_back(new char[std::max<int64_t>(t.nbytes, 1)]);
    char* copy = snapshot_.buffers.back().get();
    absl::Status copied = gate_.Copy(copy, t.data, static_cast<size_t>(t.nbytes));
    if (!copied.ok()) {
      return absl::Status(copied.code(),
                          absl::StrCat(who_, ": stopped copying ", key, ": ", copied.message()));
    }
    snapshot_.report.copied_bytes += t.nbytes;
    plan->pieces.push_back(MakePiece(key, planned.region, copy, t.nbytes));
    return absl::OkStatus();
  }

  // Creates the data files that hold device pieces in the staging directory (every file's
  // pieces and tensors are known now), so the staged chunks can be written into them.
  absl::Status OpenStreams() {
    snapshot_.streams.resize(snapshot_.files.size());
    for (const StreamTarget& target : targets_) {
      if (snapshot_.streams[target.file] != nullptr) continue;
      absl::StatusOr<std::unique_ptr<DataFileStream>> stream = DataFileStream::Create(
          snapshot_.staging_dir, snapshot_.tensors, snapshot_.files[target.file], target.file);
      if (!stream.ok()) {
        return absl::Status(
            stream.status().code(),
            absl::StrCat(who_, ": creating ", snapshot_.file_paths[target.file], " in ",
                         snapshot_.staging_dir, ": ", stream.status().message()));
      }
      snapshot_.streams[target.file] = *std::move(stream);
    }
    return absl::OkStatus();
  }

  // Stages the device pieces into their files and signals the drain (StreamDeviceSnapshot).
  absl::Status StreamDevicePieces() {
    return StreamDeviceSnapshot(ranges_, targets_, who_, gate_, device_, &snapshot_);
  }

  // A pipelined save: creates every data file (O_DIRECT, where asked for, for the files that
  // hold copied host pieces only) and starts the writer.
  absl::Status OpenPipelinedStreams();
  // A pipelined save: copies the host pieces not lent into pool chunks, in file order, each
  // chunk handed to the writer once full.
  absl::Status CopyHostPieces();
  // A pipelined save: hands the lent pieces to the writer after the copied chunks, and tells it
  // nothing more comes.
  void QueueLentPieces();

 private:
  // A host piece of the plan: piece `piece` of file `file`.
  struct HostPiece {
    int file = 0;
    int piece = 0;
    const std::string* key = nullptr;
    const char* data = nullptr;
    int64_t bytes = 0;
  };
  // A pool chunk being filled.
  struct Fill {
    HostBufferPool::Chunk chunk;
    int64_t used = 0;
  };
  absl::Status NextChunk(Fill* fill);
  absl::Status CopyInto(Fill* fill, const HostPiece& from, int64_t offset, int64_t bytes);
  void Hand(int file, int piece, Fill* fill);
  // A file whose data section arrives in order (AppendData): one of copied pieces only.
  bool Sequential(int file) const { return !mixed_files_.count(file) && !Packed(file); }
  bool Packed(int file) const { return !snapshot_.packed.empty() && snapshot_.packed[file]; }
  // Raw bytes of a piece in one pool chunk: for a compressed file, whole codec chunks.
  int64_t RunBytes(int file) const {
    return Packed(file) ? PackedRunBytes(device_.host_pool->chunk_bytes(), snapshot_.compression)
                        : device_.host_pool->chunk_bytes();
  }
  absl::Status OpenPackedStream(int f, std::vector<CompressedFileStream*>* packed);

  const std::string who_;
  const SessionInfo& session_;
  MemoryGate& gate_;
  const DeviceSnapshotOptions& device_;
  SaveSnapshot snapshot_;
  std::set<std::string> keys_;
  std::vector<DeviceRange> ranges_;    // the device pieces, in plan order
  std::vector<StreamTarget> targets_;  // where each range goes
  std::vector<HostPiece> copies_;      // pipelined: host pieces to copy into the pool
  std::vector<HostPiece> lent_;        // lent host pieces
  std::set<int> mixed_files_;          // files holding device or lent pieces
  int64_t next_sequence_ = 0;          // of pool chunks handed to the writer
};

absl::Status SnapshotTaker::OpenPackedStream(int f, std::vector<CompressedFileStream*>* packed) {
  absl::StatusOr<std::unique_ptr<CompressedFileStream>> stream = CompressedFileStream::Create(
      snapshot_.staging_dir, snapshot_.tensors, snapshot_.files[f], f, snapshot_.compression);
  if (!stream.ok()) {
    return absl::Status(stream.status().code(),
                        absl::StrCat(who_, ": creating ", snapshot_.file_paths[f], " in ",
                                     snapshot_.staging_dir, ": ", stream.status().message()));
  }
  snapshot_.packed[f] = *std::move(stream);
  (*packed)[f] = snapshot_.packed[f].get();
  ++snapshot_.report.compressed_files;
  return absl::OkStatus();
}

absl::Status SnapshotTaker::OpenPipelinedStreams() {
  std::set<int> device_files;
  for (const StreamTarget& t : targets_) device_files.insert(t.file);
  mixed_files_ = device_files;
  for (const HostPiece& p : lent_) mixed_files_.insert(p.file);
  snapshot_.streams.resize(snapshot_.files.size());
  std::vector<DataFileStream*> streams(snapshot_.files.size(), nullptr);
  std::vector<CompressedFileStream*> packed;
  if (snapshot_.compression.enabled) {
    snapshot_.packed.resize(snapshot_.files.size());
    packed.resize(snapshot_.files.size(), nullptr);
    snapshot_.report.compression_pipelined = true;
  }
  for (size_t f = 0; f < snapshot_.files.size(); ++f) {
    if (snapshot_.compression.enabled && !device_files.count(static_cast<int>(f))) {
      CKPT_RETURN_IF_ERROR(OpenPackedStream(static_cast<int>(f), &packed));  // device: raw
      continue;
    }
    DataFileStreamOptions options;
    options.direct_io = device_.direct_io && Sequential(static_cast<int>(f));
    absl::StatusOr<std::unique_ptr<DataFileStream>> stream = DataFileStream::Create(
        snapshot_.staging_dir, snapshot_.tensors, snapshot_.files[f], static_cast<int>(f), options);
    if (!stream.ok()) {
      return absl::Status(stream.status().code(),
                          absl::StrCat(who_, ": creating ", snapshot_.file_paths[f], " in ",
                                       snapshot_.staging_dir, ": ", stream.status().message()));
    }
    snapshot_.streams[f] = *std::move(stream);
    streams[f] = snapshot_.streams[f].get();
  }
  MemoryGate* gate = &gate_;
  snapshot_.writer = std::make_unique<SaveWritePipeline>(
      std::move(streams), who_, [gate] { return gate->status(); }, device_.trace, std::move(packed),
      EncodeThreads(snapshot_.compression));
  return absl::OkStatus();
}

absl::Status SnapshotTaker::NextChunk(Fill* fill) {
  CKPT_RETURN_IF_ERROR(snapshot_.writer->status());
  HostBufferPool& pool = *device_.host_pool;
  const int64_t waits_before = pool.stats().waits;
  absl::StatusOr<HostBufferPool::Chunk> chunk = pool.Acquire(absl::Now() + device_.timeout);
  if (!chunk.ok()) {
    return absl::Status(
        chunk.status().code(),
        absl::StrCat(who_, ": snapshot of host tensors: ", chunk.status().message()));
  }
  if (pool.stats().waits > waits_before) snapshot_.report.host_waited_for_pool = true;
  fill->chunk = *std::move(chunk);
  fill->used = 0;
  ++snapshot_.report.pool_chunks;
  // The writer may have failed while this waited for its chunk.
  return snapshot_.writer->status();
}

absl::Status SnapshotTaker::CopyInto(Fill* fill, const HostPiece& from, int64_t offset,
                                     int64_t bytes) {
  absl::Status copied =
      gate_.Copy(fill->chunk.data() + fill->used, from.data + offset, static_cast<size_t>(bytes));
  if (!copied.ok()) {
    return absl::Status(
        copied.code(), absl::StrCat(who_, ": stopped copying ", *from.key, ": ", copied.message()));
  }
  fill->used += bytes;
  snapshot_.report.copied_bytes += bytes;
  return absl::OkStatus();
}

void SnapshotTaker::Hand(int file, int piece, Fill* fill) {
  SaveWriteItem item;
  item.file = file;
  item.piece = piece;
  item.data = fill->chunk.data();
  item.bytes = fill->used;
  item.chunk = std::move(fill->chunk);
  item.sequence = next_sequence_++;
  if (device_.trace) device_.trace(SavePipelineEvent{SavePipelineEvent::kCopied, item.sequence});
  snapshot_.writer->Push(std::move(item));
  fill->used = 0;
}

absl::Status SnapshotTaker::CopyHostPieces() {
  Fill fill;
  for (size_t i = 0; i < copies_.size(); ++i) {
    const HostPiece& p = copies_[i];
    const bool sequential = Sequential(p.file);
    const int64_t chunk_bytes = RunBytes(p.file);
    for (int64_t offset = 0; offset < p.bytes;) {
      if (!fill.chunk) CKPT_RETURN_IF_ERROR(NextChunk(&fill));
      const int64_t n = std::min(p.bytes - offset, chunk_bytes - fill.used);
      CKPT_RETURN_IF_ERROR(CopyInto(&fill, p, offset, n));
      offset += n;
      // A file of copied pieces fills each chunk with its data section in order (the chunk may
      // end one piece and begin the next); any other file gets one piece per chunk.
      if (fill.used == chunk_bytes || !sequential) Hand(p.file, sequential ? -1 : p.piece, &fill);
    }
    const bool file_ends = i + 1 == copies_.size() || copies_[i + 1].file != p.file;
    if (fill.used > 0 && (file_ends || !sequential)) {
      Hand(p.file, sequential ? -1 : p.piece, &fill);
    }
  }
  snapshot_.report.host_bytes_written_before_snapshot = snapshot_.writer->bytes_written();
  return absl::OkStatus();
}

void SnapshotTaker::QueueLentPieces() {
  for (const HostPiece& p : lent_) {
    // A compressed file's runs are a pool chunk's worth, so that encoding and writing overlap
    // and the encoded chunks in memory stay bounded.
    const int64_t run = Packed(p.file) ? RunBytes(p.file) : std::max<int64_t>(p.bytes, 1);
    for (int64_t offset = 0; offset < p.bytes; offset += run) {
      SaveWriteItem item;
      item.file = p.file;
      item.piece = p.piece;
      item.data = p.data + offset;
      item.bytes = std::min(run, p.bytes - offset);
      snapshot_.writer->Push(std::move(item));
    }
  }
  snapshot_.writer->CloseInput();
}

// Completes a file whose device pieces were streamed into it: appends its host pieces (those
// with data) and finishes it.
absl::StatusOr<WrittenData> FinishStreamedFile(const DataFilePlan& plan, DataFileStream& stream) {
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const PieceData& p = plan.pieces[i];
    if (p.data == nullptr || p.size_bytes == 0) continue;
    CKPT_RETURN_IF_ERROR(stream.Append(static_cast<int>(i), p.data, p.size_bytes));
  }
  return stream.Finish();
}

}  // namespace

absl::StatusOr<SaveSnapshot> SnapshotSavePart(const pb::SavePlanPart& part,
                                              const SessionInfo& session, MemoryGate& gate,
                                              const DeviceSnapshotOptions& device) {
  const std::string who = absl::StrCat("rank ", part.rank(), " of job ", session.trainer.job);
  if (part.rank() != session.trainer.rank) {
    return absl::InternalError(
        absl::StrCat("save plan part of rank ", part.rank(), " delivered for ", who));
  }
  if (part.staging_dir().empty() && part.files_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": save plan part has no staging dir"));
  }
  absl::StatusOr<CompressionOptions> compression = ParseCompression(part.compression());
  if (!compression.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": save plan part: ", compression.status().message()));
  }
  // A compressed save is pipelined through the pool where a pool chunk holds a codec chunk;
  // otherwise it copies into buffers of its own, written whole by WriteDataFiles.
  DeviceSnapshotOptions unpooled = device;
  unpooled.host_pool = nullptr;
  const bool pooled =
      device.host_pool != nullptr &&
      (!compression->enabled || PackedRunBytes(device.host_pool->chunk_bytes(), *compression) > 0);
  const DeviceSnapshotOptions& used = pooled ? device : unpooled;
  SnapshotTaker taker(who, session, gate, used);
  taker.snapshot().compression = *compression;
  taker.snapshot().rank = part.rank();
  taker.snapshot().job = session.trainer.job;
  taker.snapshot().staging_dir = part.staging_dir();
  for (const pb::PlanFile& file : part.files()) {
    taker.snapshot().file_paths.push_back(file.path());
    DataFilePlan plan;
    plan.writer_rank = part.rank();
    for (const pb::PlanPiece& piece : file.pieces()) {
      CKPT_RETURN_IF_ERROR(taker.TakePiece(piece, &plan));
    }
    taker.snapshot().files.push_back(std::move(plan));
  }
  if (used.host_pool != nullptr) {
    CKPT_RETURN_IF_ERROR(taker.OpenPipelinedStreams());
    CKPT_RETURN_IF_ERROR(taker.CopyHostPieces());
  } else {
    CKPT_RETURN_IF_ERROR(taker.OpenStreams());
  }
  CKPT_RETURN_IF_ERROR(taker.StreamDevicePieces());
  if (used.host_pool != nullptr) taker.QueueLentPieces();
  return std::move(taker.snapshot());
}

namespace {

// Finishes (fsyncs) file `i` of a pipelined save, compressed or not, and reports how it was
// written.
absl::StatusOr<WrittenData> FinishPipelinedFile(SaveSnapshot& snapshot, size_t i) {
  SnapshotReport& report = snapshot.report;
  if (i < snapshot.packed.size() && snapshot.packed[i] != nullptr) {
    CompressedFileStream& packed = *snapshot.packed[i];
    report.buffered_files += 1;
    report.compressed_raw_bytes += packed.raw_bytes_appended();
    report.compressed_stored_bytes += packed.stored_bytes_written();
    return packed.Finish();
  }
  DataFileStream& stream = *snapshot.streams[i];
  const bool direct = stream.direct_bytes() > 0 && !stream.direct_io_refused();
  report.direct_io_files += direct ? 1 : 0;
  report.buffered_files += direct ? 0 : 1;
  report.direct_io_refused = report.direct_io_refused || stream.direct_io_refused();
  return stream.Finish();
}

// WriteSnapshot of a pipelined save: waits for the writer, then finishes (fsyncs) each file.
absl::StatusOr<std::string> WritePipelined(SaveSnapshot& snapshot, const std::string& who,
                                           const std::function<void(int64_t bytes_done)>& progress,
                                           const std::function<bool()>& cancelled) {
  CKPT_RETURN_IF_ERROR(snapshot.writer->Drain(progress, cancelled));
  pb::Manifest written;
  for (size_t i = 0; i < snapshot.streams.size(); ++i) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat(who, ": the operation was aborted; stopped after ",
                                               i, " of ", snapshot.streams.size(),
                                               " data files were synced"));
    }
    absl::StatusOr<WrittenData> data = FinishPipelinedFile(snapshot, i);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat(who, ": writing ", snapshot.file_paths[i], " into ",
                                       snapshot.staging_dir, ": ", data.status().message()));
    }
    for (pb::StoredPiece& p : data->pieces) *written.add_pieces() = std::move(p);
    for (pb::DataFile& f : data->files) *written.add_files() = std::move(f);
  }
  if (progress) progress(snapshot.writer->bytes_written());
  return written.SerializeAsString();
}

}  // namespace

absl::StatusOr<std::string> WriteSnapshot(SaveSnapshot& snapshot,
                                          const std::function<void(int64_t bytes_done)>& progress,
                                          const std::function<bool()>& cancelled) {
  const std::string who = absl::StrCat("rank ", snapshot.rank, " of job ", snapshot.job);
  if (snapshot.writer != nullptr) return WritePipelined(snapshot, who, progress, cancelled);
  const std::vector<DataFilePlan>& files = snapshot.files;
  // One file at a time (file i is r<rank>_<i>), so that progress can be reported between them.
  WriteOptions options;
  options.compression = snapshot.compression;
  pb::Manifest written;
  int64_t bytes_done = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat(who, ": the operation was aborted; stopped after ",
                                               i, " of ", files.size(), " data files"));
    }
    absl::StatusOr<WrittenData> data =
        i < snapshot.streams.size() && snapshot.streams[i] != nullptr
            ? FinishStreamedFile(files[i], *snapshot.streams[i])
            : WriteDataFiles(snapshot.staging_dir, snapshot.tensors, {files[i]},
                             static_cast<int>(i), options);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat(who, ": writing ", snapshot.file_paths[i], " into ",
                                       snapshot.staging_dir, ": ", data.status().message()));
    }
    for (pb::StoredPiece& p : data->pieces) *written.add_pieces() = std::move(p);
    for (pb::DataFile& f : data->files) *written.add_files() = std::move(f);
    for (const PieceData& p : files[i].pieces) bytes_done += p.size_bytes;
    if (progress) progress(bytes_done);
  }
  return written.SerializeAsString();
}

absl::StatusOr<std::string> ExecuteSavePart(
    const pb::SavePlanPart& part, const SessionInfo& session,
    const std::function<void(int64_t bytes_done)>& progress) {
  MemoryGate gate;
  absl::StatusOr<SaveSnapshot> snapshot = SnapshotSavePart(part, session, gate);
  if (!snapshot.ok()) return snapshot.status();
  return WriteSnapshot(*snapshot, progress);
}

}  // namespace ckpt::worker
