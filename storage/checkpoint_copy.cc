#include "storage/checkpoint_copy.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "storage/checkpoint_store.h"
#include "storage/checksum.h"
#include "storage/manifest_codec.h"

namespace ckpt {
namespace {

// A piece of one data file, hashed as its bytes stream past.
struct PieceCheck {
  const pb::StoredPiece* piece = nullptr;
  std::unique_ptr<StreamingChecksum> sum;
};

// Feeds the bytes [at, at + chunk.size()) of a file to the checks of the pieces they overlap;
// DataLoss for a piece whose last byte went by and whose checksum differs.
absl::Status CheckChunk(std::vector<PieceCheck>& checks, int64_t at, absl::string_view chunk,
                        const std::string& where, int64_t* verified) {
  const int64_t end = at + static_cast<int64_t>(chunk.size());
  for (PieceCheck& check : checks) {
    const int64_t begin = check.piece->byte_offset();
    const int64_t stop = begin + StoredBytes(*check.piece);
    const int64_t lo = std::max(begin, at);
    const int64_t hi = std::min(stop, end);
    if (lo >= hi) continue;
    check.sum->Update(chunk.data() + (lo - at), static_cast<size_t>(hi - lo));
    if (hi != stop) continue;
    if (check.sum->Whole() != check.piece->xxh3_64()) {
      return absl::DataLossError(absl::StrCat(where, ": stored bytes of ",
                                              DescribePiece(*check.piece),
                                              " do not match their XXH3-64 checksum"));
    }
    ++*verified;
  }
  return absl::OkStatus();
}

// Copies one data file in chunks, checking its pieces.
absl::Status CopyFile(const StoredCheckpoint& source, CheckpointWrite& write,
                      const pb::DataFile& file, const std::vector<const pb::StoredPiece*>& pieces,
                      const CopyOptions& options, absl::Time deadline, int64_t* verified) {
  const std::string where =
      absl::StrCat("copying ", source.url(), " to ", write.url(), ": ", file.name());
  std::vector<PieceCheck> checks;
  const int64_t block = source.manifest().checksum_block_bytes();
  for (const pb::StoredPiece* piece : pieces) {
    const int64_t stored = StoredBytes(*piece);
    checks.push_back({piece, std::make_unique<StreamingChecksum>(stored > block ? block : 0)});
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, write.Create(file.name()));
  std::string chunk;
  for (int64_t at = 0; at < file.size_bytes(); at += options.chunk_bytes) {
    chunk.resize(static_cast<size_t>(std::min(options.chunk_bytes, file.size_bytes() - at)));
    CKPT_RETURN_IF_ERROR(source.Read(file.name(), at, absl::MakeSpan(chunk), deadline));
    CKPT_RETURN_IF_ERROR(CheckChunk(checks, at, chunk, where, verified));
    CKPT_RETURN_IF_ERROR(writer->Append(chunk));
  }
  return writer->Close(deadline);
}

// Runs CopyFile over every data file, `parallelism` at a time; the first error wins.
absl::Status CopyFiles(const StoredCheckpoint& source, CheckpointWrite& write,
                       const CopyOptions& options, absl::Time deadline, CopyReport* report) {
  const pb::Manifest& manifest = source.manifest();
  std::map<std::string, std::vector<const pb::StoredPiece*>> by_file;
  for (const pb::StoredPiece& piece : manifest.pieces()) by_file[piece.file()].push_back(&piece);
  std::atomic<int> next{0};
  std::atomic<int64_t> verified{0};
  std::mutex mu;
  absl::Status first;
  auto worker = [&] {
    int64_t mine = 0;
    for (int i = next++; i < manifest.files_size(); i = next++) {
      const pb::DataFile& file = manifest.files(i);
      absl::Status s =
          CopyFile(source, write, file, by_file[file.name()], options, deadline, &mine);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        next = manifest.files_size();  // the others stop after their current file
      }
    }
    verified += mine;
  };
  const int threads = std::max(1, std::min(options.parallelism, manifest.files_size()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  report->pieces_verified = verified;
  return first;
}

}  // namespace

absl::StatusOr<CopyReport> CopyCheckpoint(const std::string& from, const std::string& to,
                                          const CopyOptions& options) {
  if (options.chunk_bytes <= 0 || options.parallelism <= 0) {
    return absl::InvalidArgumentError("copy: chunk_bytes and parallelism must be positive");
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.timeout;
  CKPT_ASSIGN_OR_RETURN(CheckpointStore * source_store, StoreForUrl(from));
  CKPT_ASSIGN_OR_RETURN(CheckpointStore * target_store, StoreForUrl(to));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StoredCheckpoint> source,
                        source_store->Open(from, deadline));
  StoreWriteOptions write_options;
  write_options.overwrite = options.overwrite;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWrite> write,
                        target_store->BeginWrite(to, write_options, deadline));
  CopyReport report;
  absl::Status copied = CopyFiles(*source, *write, options, deadline, &report);
  if (copied.ok()) copied = write->Commit(source->manifest(), deadline);
  if (!copied.ok()) {
    (void)write->Abort(deadline);
    return copied;
  }
  report.files = source->manifest().files_size();
  for (const pb::DataFile& file : source->manifest().files()) report.bytes += file.size_bytes();
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace ckpt
