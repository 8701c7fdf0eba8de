#include "worker/memory_persist.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/durable_file.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "storage/checkpoint_store.h"
#include "storage/checksum.h"
#include "storage/file_util.h"

namespace ckpt::worker {
namespace {

// How long one worker's puts of a persistence to a store may take.
constexpr absl::Duration kPutTimeout = absl::Minutes(30);

// The manifest's record of `file`, or InvalidArgument naming it.
absl::StatusOr<const pb::DataFile*> FileRecord(const pb::Manifest& manifest,
                                               const std::string& name, const std::string& file) {
  for (const pb::DataFile& f : manifest.files()) {
    if (f.name() == file) return &f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("mem://", name, " has no data file ", file, " to persist"));
}

// Checks `bytes` (held as `file`) against its size and its pieces' checksums in `manifest`.
absl::Status CheckHeldFile(const pb::Manifest& manifest, const std::string& name,
                           const pb::DataFile& record, const std::string& bytes) {
  if (static_cast<int64_t>(bytes.size()) != record.size_bytes()) {
    return absl::DataLossError(absl::StrCat(record.name(), " of mem://", name, " holds ",
                                            bytes.size(), " bytes, the manifest says ",
                                            record.size_bytes()));
  }
  for (const pb::StoredPiece& p : manifest.pieces()) {
    if (p.file() != record.name()) continue;
    if (p.byte_offset() < 0 || p.byte_length() < 0 ||
        p.byte_offset() + p.byte_length() > static_cast<int64_t>(bytes.size())) {
      return absl::DataLossError(absl::StrCat("tensor \"", p.key(), "\" lies beyond the ",
                                              bytes.size(), " bytes of ", p.file(), " of mem://",
                                              name));
    }
    StreamingChecksum checksum(manifest.checksum_block_bytes());
    checksum.Update(bytes.data() + p.byte_offset(), static_cast<size_t>(p.byte_length()));
    if (checksum.Whole() != p.xxh3_64()) {
      return absl::DataLossError(absl::StrCat("checksum mismatch in tensor \"", p.key(), "\" of ",
                                              p.file(), " of mem://", name,
                                              " (memory corrupted); not persisted"));
    }
  }
  return absl::OkStatus();
}

// PersistHeldFiles into a store write (staging URL `staging_url`, coordinator/memory_persist.h):
// joins it and puts each checked file there from memory.
absl::StatusOr<int64_t> PutHeldFiles(const std::string& name, const std::vector<std::string>& files,
                                     const std::vector<std::shared_ptr<const std::string>>& held,
                                     const std::string& staging_url) {
  const absl::Time deadline = absl::Now() + kPutTimeout;
  auto failed = [&](const std::string& what, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("persisting ", what, " of mem://", name, " to ",
                                               staging_url, ": ", s.message()));
  };
  absl::StatusOr<CheckpointStore*> store = StoreForUrl(staging_url);
  if (!store.ok()) return failed("its data files", store.status());
  absl::StatusOr<std::unique_ptr<CheckpointWrite>> write =
      (*store)->JoinWrite(staging_url, deadline);
  if (!write.ok()) return failed("its data files", write.status());
  int64_t written = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    absl::StatusOr<std::unique_ptr<ObjectWriter>> object = (*write)->Create(files[i]);
    if (!object.ok()) return failed(files[i], object.status());
    absl::Status put = (*object)->Append(*held[i]);
    if (put.ok()) put = (*object)->Close(deadline);
    if (!put.ok()) return failed(files[i], put);
    written += static_cast<int64_t>(held[i]->size());
  }
  return written;
}

}  // namespace

absl::StatusOr<int64_t> PersistHeldFiles(const MemoryTier& tier, const std::string& name,
                                         const pb::Manifest& manifest,
                                         const std::vector<std::string>& files,
                                         const std::string& staging_dir) {
  std::vector<std::shared_ptr<const std::string>> held;
  for (const std::string& file : files) {
    CKPT_ASSIGN_OR_RETURN(const pb::DataFile* record, FileRecord(manifest, name, file));
    CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const std::string> bytes, tier.Find(name, file));
    CKPT_RETURN_IF_ERROR(CheckHeldFile(manifest, name, *record, *bytes));
    held.push_back(std::move(bytes));
  }
  if (IsObjectStoreLocation(staging_dir)) return PutHeldFiles(name, files, held, staging_dir);
  int64_t written = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    CKPT_RETURN_IF_ERROR(WriteFileDurably(JoinPath(staging_dir, files[i]), *held[i]));
    written += static_cast<int64_t>(held[i]->size());
  }
  CKPT_RETURN_IF_ERROR(FsyncDir(JoinPath(staging_dir, "data")));
  return written;
}

}  // namespace ckpt::worker
