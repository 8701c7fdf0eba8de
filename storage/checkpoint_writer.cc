#include "storage/checkpoint_writer.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "sharding/coverage.h"
#include "storage/file_util.h"
#include "storage/manifest_file.h"
#include "storage/overwrite_guard.h"
#include "storage/piece_compression.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

constexpr char kManifestName[] = "manifest.pb";
constexpr char kManifestTempName[] = "manifest.pb.tmp";
// Data sections start on a 4 KiB boundary so O_DIRECT writes and reads of pieces whose sizes are
// multiples of 4 KiB go straight between tensor memory and the device.
constexpr int64_t kDirectIoAlignment = 4096;

void Step(const WriteOptions& options, CommitStep step) {
  if (options.after_step) options.after_step(step);
}

std::string UniqueSibling(const std::string& final_path, absl::string_view tag) {
  static std::atomic<int> counter{0};
  return JoinPath(ParentDir(final_path), absl::StrCat(".", BaseName(final_path), ".", tag, "-",
                                                      ::getpid(), "-", counter.fetch_add(1)));
}

// rename(2) that refuses to replace `to` (renameat2 RENAME_NOREPLACE; falls back to a check
// plus rename where the filesystem lacks it).
absl::Status RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
  }
  if (PathExists(to)) return absl::AlreadyExistsError(absl::StrCat(to, " already exists"));
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", from, " to ", to));
  }
  return absl::OkStatus();
}

absl::Status ExistingPathError(const std::string& path) {
  return absl::AlreadyExistsError(
      absl::StrCat(path, " already exists; pass the overwrite flag to replace it"));
}

// Whether `path` is a directory (not a link to one) with no entries: a checkpoint may be
// committed in its place (as DCP writes into the directory it is given, which callers often
// create first). The commit removes it with rmdir, which fails on anything that appeared in it.
bool IsEmptyDirectory(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  absl::StatusOr<std::vector<std::string>> names = ListDir(path);
  return names.ok() && names->empty();
}

// An existing path that is neither an empty directory nor (with `overwrite`) a committed
// checkpoint: AlreadyExists naming a few of its entries when it is a directory.
absl::Status OccupiedPathError(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> names = ListDir(path);
  if (!IsDirectory(path) || !names.ok() ||
      std::find(names->begin(), names->end(), "manifest.pb") != names->end()) {
    return ExistingPathError(path);
  }
  constexpr size_t kShown = 3;
  std::vector<std::string> shown(names->begin(), names->begin() + std::min(names->size(), kShown));
  return absl::AlreadyExistsError(
      absl::StrCat(path, " already exists and is not an empty directory (it holds ",
                   absl::StrJoin(shown, ", "), names->size() > kShown ? ", ..." : "",
                   "); a checkpoint is written only into a new path or "
                   "an empty directory"));
}

// Commits `staging_dir` as `final_path`, which does not exist or is an empty directory: the
// checkpoint takes the empty directory's permission bits (a private 0700 mkdtemp stays
// private), and the empty directory is removed (rmdir, so nothing that appeared in it meanwhile
// is lost) right before the no-replace rename. A crash between the two leaves no checkpoint.
absl::Status RenameIntoPlace(const std::string& staging_dir, const std::string& final_path) {
  struct stat st;
  if (IsEmptyDirectory(final_path) && ::lstat(final_path.c_str(), &st) == 0 &&
      ::chmod(staging_dir.c_str(), st.st_mode & 07777) != 0) {
    return ErrnoStatus(errno, absl::StrCat("give ", staging_dir, " the mode of ", final_path));
  }
  if (IsEmptyDirectory(final_path) && ::rmdir(final_path.c_str()) != 0 && errno != ENOENT) {
    if (errno == ENOTEMPTY || errno == EEXIST) return OccupiedPathError(final_path);
    return ErrnoStatus(errno, absl::StrCat("remove the empty directory ", final_path));
  }
  return RenameNoReplace(staging_dir, final_path);
}

// "ckpts/step5/" -> "ckpts/step5": the last component itself is committed, never what a
// trailing slash would resolve a symbolic link to.
std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// A checkpoint path must end in a name ("ckpts/step5", not "", "/", "." or "ckpts/..").
absl::Status CheckCheckpointName(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty checkpoint path");
  const std::string base = BaseName(path);
  if (base.empty() || base == "/" || base == "." || base == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint path ", path, " does not end in a name to commit under"));
  }
  return absl::OkStatus();
}

// Swaps the committed staging directory in for the checkpoint `target` at `final_path`
// (RENAME_EXCHANGE, or moving the old one aside where the filesystem lacks it), then checks
// that what was swapped out is the directory the guard approved; if something else had taken
// its place meanwhile, it is put back and nothing is removed. Returns where the old one is.
absl::StatusOr<std::string> SwapIn(const std::string& staging_dir, const std::string& final_path,
                                   const ReplaceTarget& target) {
  const std::string parent = ParentDir(final_path);
  if (::renameat2(AT_FDCWD, staging_dir.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) ==
      0) {
    if (IsSameTarget(staging_dir, target)) return staging_dir;
    ::renameat2(AT_FDCWD, staging_dir.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE);
    return absl::FailedPreconditionError(
        absl::StrCat(final_path,
                     " was replaced by something else while the checkpoint was committed; "
                     "nothing was overwritten"));
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return ErrnoStatus(errno, absl::StrCat("exchange ", staging_dir, " with ", final_path));
  }
  // No RENAME_EXCHANGE here: move the old one aside first. A crash between the two renames
  // leaves the old checkpoint complete under the ".old" sibling name.
  const std::string old_path = UniqueSibling(final_path, "old");
  if (::rename(final_path.c_str(), old_path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", final_path, " to ", old_path));
  }
  if (!IsSameTarget(old_path, target)) {
    (void)RenameNoReplace(old_path, final_path);
    return absl::FailedPreconditionError(
        absl::StrCat(final_path,
                     " was replaced by something else while the checkpoint was committed; "
                     "nothing was overwritten"));
  }
  CKPT_RETURN_IF_ERROR(FsyncDir(parent));
  CKPT_RETURN_IF_ERROR(RenameNoReplace(staging_dir, final_path));
  return old_path;
}

// Before anything is written: the contents must store every element of every tensor exactly
// once (the commit validates the manifest again; this fails early with InvalidArgument).
// Pieces with invalid regions are left to WriteDataFiles, which names them.
absl::Status CheckContentsCoverage(const CheckpointContents& contents) {
  absl::flat_hash_map<absl::string_view, std::vector<Region>> regions;
  for (const DataFilePlan& f : contents.files) {
    for (const PieceData& p : f.pieces) regions[p.key].push_back(p.region);
  }
  for (const TensorMeta& t : contents.tensors) {
    const std::vector<Region>& pieces = regions[absl::string_view(t.key)];
    for (const Region& r : pieces) {
      if (!ValidateRegion(r, t.global_shape).ok()) return absl::OkStatus();
    }
    absl::Status s = CheckExactCoverage(t.key, t.global_shape, pieces);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write a checkpoint whose pieces do "
                       "not store each element once: ",
                       s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* CommitStepName(CommitStep step) {
  switch (step) {
    case CommitStep::kStagingCreated:
      return "staging_created";
    case CommitStep::kDataFilesSynced:
      return "data_files_synced";
    case CommitStep::kStagingDirSynced:
      return "staging_dir_synced";
    case CommitStep::kManifestTempWritten:
      return "manifest_temp_written";
    case CommitStep::kManifestRenamed:
      return "manifest_renamed";
    case CommitStep::kManifestDirSynced:
      return "manifest_dir_synced";
    case CommitStep::kCheckpointRenamed:
      return "checkpoint_renamed";
    case CommitStep::kOldRemoved:
      return "old_removed";
  }
  return "?";
}

absl::StatusOr<CommitStep> ParseCommitStep(absl::string_view name) {
  for (CommitStep s : kAllCommitSteps) {
    if (name == CommitStepName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown commit step \"", name, "\""));
}

absl::StatusOr<std::string> CreateStagingDir(const std::string& path, bool overwrite) {
  const std::string final_path = WithoutTrailingSlashes(path);
  CKPT_RETURN_IF_ERROR(CheckCheckpointName(final_path));
  const bool empty_dir = IsEmptyDirectory(final_path);
  if (!overwrite && !empty_dir && PathExists(final_path)) return OccupiedPathError(final_path);
  // Overwriting replaces only a committed checkpoint; refuse anything else before any work.
  if (overwrite && !empty_dir) CKPT_RETURN_IF_ERROR(CheckReplaceable(final_path).status());
  if (!IsDirectory(ParentDir(final_path))) {
    return absl::NotFoundError(absl::StrCat("parent directory of ", final_path, " does not exist"));
  }
  const std::string staging = UniqueSibling(final_path, "tmp");
  CKPT_RETURN_IF_ERROR(MakeDir(staging));
  CKPT_RETURN_IF_ERROR(MakeDir(JoinPath(staging, "data")));
  return staging;
}

absl::Status DiscardStagingDir(const std::string& staging_dir) {
  if (!PathExists(staging_dir)) return absl::OkStatus();
  std::string doomed = UniqueSibling(staging_dir, "discard");
  if (::rename(staging_dir.c_str(), doomed.c_str()) != 0) doomed = staging_dir;
  absl::Status removed = RemoveTree(doomed);
  // A writer that opened a file just before the rename may have added one during the first
  // pass; its later files fail to open, so a second pass finds the directory quiet. Not after
  // an entry was swapped (Aborted): that is reported, not removed on a second look.
  if (!removed.ok() && !absl::IsAborted(removed) && PathExists(doomed)) {
    removed = RemoveTree(doomed);
  }
  return removed;
}

namespace {

using TensorsByKey = absl::flat_hash_map<absl::string_view, const TensorMeta*>;

// Validates a file's pieces (known tensor, region inside it, size matching the dtype, bytes in
// memory unless `require_data` is false) and lays them out back to back as safetensors entries;
// *data_bytes is set to their total.
// `packed` (when not null) holds the frames of plan.pieces, in order; a piece whose frame's
// codec is kNone is stored raw.
absl::StatusOr<std::vector<SafetensorsEntry>> LayOutEntries(const DataFilePlan& plan,
                                                            const TensorsByKey& by_key,
                                                            bool require_data, int64_t* data_bytes,
                                                            const PackedPieces* packed) {
  std::vector<SafetensorsEntry> entries;
  int64_t pos = 0;
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const PieceData& p = plan.pieces[i];
    auto t = by_key.find(p.key);
    if (t == by_key.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece of unknown tensor \"", p.key, "\" (rank ", plan.writer_rank, ")"));
    }
    absl::Status valid = ValidateRegion(p.region, t->second->global_shape);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", p.key, "\" region ", p.region.DebugString(), ": ", valid.message()));
    }
    const int64_t bytes = p.region.NumElements() * DTypeSize(t->second->dtype);
    if (bytes != p.size_bytes || (require_data && bytes > 0 && p.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", p.key, "\" region ", p.region.DebugString(), " has ", p.size_bytes,
          " bytes of data, expected ", bytes, " (", DTypeName(t->second->dtype), ")"));
    }
    if (IsPacked(packed, i)) {  // the frame, as uint8 (storage/piece_codec.h)
      const int64_t stored = static_cast<int64_t>((*packed)[i].frame.size());
      entries.push_back(
          {EncodeEntryName(p.key, p.region), DType::kU8, {stored}, pos, pos + stored});
      pos += stored;
      continue;
    }
    entries.push_back({EncodeEntryName(p.key, p.region), t->second->dtype, EntryShape(p.region),
                       pos, pos + bytes});
    pos += bytes;
  }
  *data_bytes = pos;
  return entries;
}

// Appends the manifest records of one data file and its pieces (checksums come after the
// write).
void RecordFile(const std::string& name, const DataFilePlan& plan, int64_t header_bytes,
                int64_t data_bytes, const std::vector<SafetensorsEntry>& entries,
                const PackedPieces* packed, WrittenData* out) {
  pb::DataFile df;
  df.set_name(name);
  df.set_writer_rank(plan.writer_rank);
  df.set_data_start(header_bytes);
  df.set_size_bytes(header_bytes + data_bytes);
  out->files.push_back(df);
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    const PieceData& p = plan.pieces[i];
    pb::StoredPiece sp;
    sp.set_key(p.key);
    *sp.mutable_region() = RegionToProto(p.region);
    sp.set_file(name);
    sp.set_entry_name(entries[i].name);
    sp.set_byte_offset(df.data_start() + entries[i].begin);
    sp.set_byte_length(p.size_bytes);
    if (IsPacked(packed, i)) SetPackedFields((*packed)[i], &sp);
    sp.set_writer_rank(plan.writer_rank);
    out->pieces.push_back(std::move(sp));
  }
}

// Checks each written file's size and stores the pieces' checksums (block checksums only for
// pieces larger than a block).
absl::Status RecordChecksums(const std::vector<DataFilePlan>& files,
                             const std::vector<FileWrite>& writes,
                             const std::vector<FileWriteResult>& results,
                             int64_t checksum_block_bytes, WrittenData* out) {
  size_t piece = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    if (results[f].size != out->files[f].size_bytes()) {
      return absl::InternalError(absl::StrCat("wrote ", results[f].size, " bytes to ",
                                              writes[f].path, ", expected ",
                                              out->files[f].size_bytes()));
    }
    for (size_t i = 0; i < files[f].pieces.size(); ++i, ++piece) {
      const SegmentChecksum& cs = results[f].checksums[i + 1];
      SetStoredChecksums(cs.xxh3, cs.blocks, checksum_block_bytes, &out->pieces[piece]);
    }
  }
  return absl::OkStatus();
}

TensorsByKey IndexByKey(const std::vector<TensorMeta>& tensors) {
  TensorsByKey by_key;
  by_key.reserve(tensors.size());
  for (const TensorMeta& t : tensors) by_key.emplace(t.key, &t);
  return by_key;
}

// LayOutDataFile with the tensors indexed by key.
absl::StatusOr<DataFileLayout> LayOutIndexed(const TensorsByKey& by_key, const DataFilePlan& plan,
                                             int index, bool require_data,
                                             const PackedPieces* packed = nullptr) {
  if (plan.writer_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative writer rank ", plan.writer_rank));
  }
  DataFileLayout layout;
  layout.name = DataFileName(plan.writer_rank, index);
  int64_t data_bytes = 0;
  CKPT_ASSIGN_OR_RETURN(std::vector<SafetensorsEntry> entries,
                        LayOutEntries(plan, by_key, require_data, &data_bytes, packed));
  std::map<std::string, std::string> metadata = {{"format", "ckpt"},
                                                 {"writer_rank", absl::StrCat(plan.writer_rank)},
                                                 {"ckpt_writer", kWriterVersion}};
  for (size_t i = 0; i < plan.pieces.size(); ++i) {
    if (IsPacked(packed, i)) metadata["ckpt_compression"] = kPackedEntriesNote;
  }
  CKPT_ASSIGN_OR_RETURN(layout.header,
                        EncodeSafetensorsHeader(entries, metadata, kDirectIoAlignment));
  RecordFile(layout.name, plan, static_cast<int64_t>(layout.header.size()), data_bytes, entries,
             packed, &layout.records);
  return layout;
}

}  // namespace

absl::StatusOr<WrittenData> WriteDataFiles(const std::string& staging_dir,
                                           const std::vector<TensorMeta>& tensors,
                                           const std::vector<DataFilePlan>& files, int first_index,
                                           const WriteOptions& options) {
  std::vector<PackedPieces> packed;
  if (options.compression.enabled) {
    CKPT_ASSIGN_OR_RETURN(packed, CompressPieces(tensors, files, options.compression));
  }
  const TensorsByKey by_key = IndexByKey(tensors);
  std::map<int, int> next_index;
  std::vector<std::string> headers(files.size());
  std::vector<FileWrite> writes(files.size());
  WrittenData out;
  for (size_t f = 0; f < files.size(); ++f) {
    const DataFilePlan& plan = files[f];
    const int index = first_index + next_index[plan.writer_rank]++;
    CKPT_ASSIGN_OR_RETURN(DataFileLayout layout,
                          LayOutIndexed(by_key, plan, index, /*require_data=*/true,
                                        packed.empty() ? nullptr : &packed[f]));
    headers[f] = std::move(layout.header);
    writes[f].path = JoinPath(staging_dir, layout.name);
    writes[f].segments.push_back(
        {headers[f].data(), static_cast<int64_t>(headers[f].size()), false, 0});
    for (size_t i = 0; i < plan.pieces.size(); ++i) {
      const PieceData& p = plan.pieces[i];
      if (!packed.empty() && IsPacked(&packed[f], i)) {
        const std::string& frame = packed[f][i].frame;
        writes[f].segments.push_back(
            {frame.data(), static_cast<int64_t>(frame.size()), true, options.checksum_block_bytes});
        continue;
      }
      writes[f].segments.push_back({p.data, p.size_bytes, true, options.checksum_block_bytes});
    }
    for (pb::DataFile& df : layout.records.files) out.files.push_back(std::move(df));
    for (pb::StoredPiece& sp : layout.records.pieces) out.pieces.push_back(std::move(sp));
  }
  IoOptions io = options.io;
  io.fsync = true;
  CKPT_ASSIGN_OR_RETURN(std::vector<FileWriteResult> results, WriteFiles(writes, io));
  CKPT_RETURN_IF_ERROR(RecordChecksums(files, writes, results, options.checksum_block_bytes, &out));
  return out;
}

absl::StatusOr<DataFileLayout> LayOutDataFile(const std::vector<TensorMeta>& tensors,
                                              const DataFilePlan& plan, int index,
                                              bool require_data) {
  return LayOutIndexed(IndexByKey(tensors), plan, index, require_data);
}

void SetStoredChecksums(uint64_t xxh3, const std::vector<uint64_t>& blocks,
                        int64_t checksum_block_bytes, pb::StoredPiece* piece) {
  piece->set_xxh3_64(xxh3);
  if (StoredBytes(*piece) > checksum_block_bytes) {
    for (uint64_t b : blocks) piece->add_block_xxh3(b);
  }
}

pb::Manifest BuildManifest(const std::vector<TensorMeta>& tensors, const WrittenData& data,
                           const CheckpointContents& info, int64_t checksum_block_bytes) {
  return BuildManifest(tensors, WrittenData(data), info, checksum_block_bytes);
}

pb::Manifest BuildManifest(const std::vector<TensorMeta>& tensors, WrittenData&& data,
                           const CheckpointContents& info, int64_t checksum_block_bytes) {
  pb::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  for (const TensorMeta& t : tensors) {
    pb::TensorMeta* meta = m.add_tensors();
    meta->set_key(t.key);
    meta->set_dtype(DTypeToProto(t.dtype));
    for (int64_t d : t.global_shape) meta->add_global_shape(d);
  }
  m.mutable_pieces()->Reserve(static_cast<int>(data.pieces.size()));
  for (pb::StoredPiece& p : data.pieces) m.mutable_pieces()->Add(std::move(p));
  m.mutable_files()->Reserve(static_cast<int>(data.files.size()));
  for (pb::DataFile& f : data.files) m.mutable_files()->Add(std::move(f));
  *m.mutable_saved_layout() = info.saved_layout;
  m.set_step(info.step);
  for (const auto& [k, v] : info.user_metadata) (*m.mutable_user_metadata())[k] = v;
  m.set_created_unix_micros(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  m.set_writer_version(kWriterVersion);
  m.set_checksum_block_bytes(checksum_block_bytes);
  return m;
}

absl::Status CommitCheckpoint(const std::string& staging_dir, const std::string& path,
                              const pb::Manifest& manifest, const WriteOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckCheckpointName(WithoutTrailingSlashes(path)));
  if (!options.manifest_validated) CKPT_RETURN_IF_ERROR(ValidateManifest(manifest));
  int64_t pieces_bytes = 0;
  for (const pb::StoredPiece& p : manifest.pieces()) pieces_bytes += PieceRecordBytes(p);
  return CommitStreamedCheckpoint(
      staging_dir, path, manifest, pieces_bytes,
      [&](ManifestPieceSink sink) {
        for (const pb::StoredPiece& p : manifest.pieces()) CKPT_RETURN_IF_ERROR(sink(p));
        return absl::OkStatus();
      },
      options);
}

absl::Status CommitStreamedCheckpoint(const std::string& staging_dir, const std::string& path,
                                      const pb::Manifest& head, int64_t pieces_bytes,
                                      ManifestPieceSource source, const WriteOptions& options) {
  const std::string final_path = WithoutTrailingSlashes(path);
  CKPT_RETURN_IF_ERROR(CheckCheckpointName(final_path));
  CKPT_RETURN_IF_ERROR(FsyncDir(JoinPath(staging_dir, "data")));
  CKPT_RETURN_IF_ERROR(FsyncDir(staging_dir));
  Step(options, CommitStep::kStagingDirSynced);

  const std::string tmp = JoinPath(staging_dir, kManifestTempName);
  // Streamed into the file(s): a manifest of millions of pieces is never one string in memory.
  // Piece files, when it needs them, are written and synced before manifest.pb.tmp.
  if (absl::Status written = WriteManifestFiles(staging_dir, kManifestTempName, head, pieces_bytes,
                                                source, options.manifest_files);
      !written.ok()) {
    ::unlink(tmp.c_str());
    return written;
  }
  Step(options, CommitStep::kManifestTempWritten);
  const std::string final_manifest = JoinPath(staging_dir, kManifestName);
  if (::rename(tmp.c_str(), final_manifest.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", final_manifest));
  }
  Step(options, CommitStep::kManifestRenamed);
  CKPT_RETURN_IF_ERROR(FsyncDir(staging_dir));
  Step(options, CommitStep::kManifestDirSynced);

  const std::string parent = ParentDir(final_path);
  ReplaceTarget target;
  if (PathExists(final_path) && !IsEmptyDirectory(final_path)) {
    if (!options.overwrite) return OccupiedPathError(final_path);
    // Checked again right before the swap: what is there now must be a committed checkpoint.
    CKPT_ASSIGN_OR_RETURN(target, CheckReplaceable(final_path));
  }
  if (!target.exists) {
    CKPT_RETURN_IF_ERROR(RenameIntoPlace(staging_dir, final_path));
    CKPT_RETURN_IF_ERROR(FsyncDir(parent));
    Step(options, CommitStep::kCheckpointRenamed);
    Step(options, CommitStep::kOldRemoved);
    return absl::OkStatus();
  }
  // Atomically swap the new checkpoint in; the old one ends up under the staging name.
  CKPT_ASSIGN_OR_RETURN(const std::string old_path, SwapIn(staging_dir, final_path, target));
  CKPT_RETURN_IF_ERROR(FsyncDir(parent));
  Step(options, CommitStep::kCheckpointRenamed);
  CKPT_RETURN_IF_ERROR(RemoveTree(old_path));
  CKPT_RETURN_IF_ERROR(FsyncDir(parent));
  Step(options, CommitStep::kOldRemoved);
  return absl::OkStatus();
}

absl::StatusOr<pb::Manifest> WriteCheckpoint(const std::string& path,
                                             const CheckpointContents& contents,
                                             const WriteOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckContentsCoverage(contents));
  CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(path, options.overwrite));
  Step(options, CommitStep::kStagingCreated);
  auto written = WriteDataFiles(staging, contents.tensors, contents.files, 0, options);
  absl::StatusOr<pb::Manifest> manifest;
  absl::Status s = written.status();
  if (s.ok()) {
    Step(options, CommitStep::kDataFilesSynced);
    manifest = BuildManifest(contents.tensors, *written, contents, options.checksum_block_bytes);
    s = CommitCheckpoint(staging, path, *manifest, options);
  }
  if (!s.ok()) {
    // Nothing under the final name changed; drop the partial staging directory.
    RemoveTree(staging).IgnoreError();
    return s;
  }
  return manifest;
}

std::vector<DataFilePlan> BalanceIntoFiles(std::vector<PieceData> pieces, int num_files,
                                           int writer_rank) {
  num_files = std::max(1, num_files);
  std::stable_sort(pieces.begin(), pieces.end(), [](const PieceData& a, const PieceData& b) {
    return a.size_bytes > b.size_bytes;
  });
  std::vector<DataFilePlan> files(num_files);
  std::vector<int64_t> load(num_files, 0);
  for (PieceData& p : pieces) {
    const int f = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[f] += p.size_bytes;
    files[f].pieces.push_back(std::move(p));
  }
  std::vector<DataFilePlan> out;
  for (DataFilePlan& f : files) {
    if (f.pieces.empty()) continue;
    f.writer_rank = writer_rank;
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace ckpt
