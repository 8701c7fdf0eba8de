#include "storage/checkpoint_copy.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
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
#include "storage/safetensors.h"

namespace ckpt {
namespace {

// A piece of one data file, hashed as its bytes stream past.
struct PieceCheck {
  const pb::StoredPiece* piece = nullptr;
  std::unique_ptr<StreamingChecksum> sum;
};

// What to do with a piece whose stored bytes do not match their checksum.
using BadPiece = std::function<absl::Status(const pb::StoredPiece& piece)>;
// Where each chunk of a file goes once its pieces were fed.
using ChunkSink = std::function<absl::Status(absl::string_view chunk)>;

// Feeds the bytes [at, at + chunk.size()) of a file to the checks of the pieces they overlap;
// `bad` is told of each piece whose last byte went by and whose checksum differs.
absl::Status CheckChunk(std::vector<PieceCheck>& checks, int64_t at, absl::string_view chunk,
                        const BadPiece& bad, int64_t* verified) {
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
      CKPT_RETURN_IF_ERROR(bad(*check.piece));
    } else {
      ++*verified;
    }
  }
  return absl::OkStatus();
}

// Reads one data file of `source` in chunks, checking its pieces, handing each chunk to `sink`.
absl::Status StreamFile(const StoredCheckpoint& source, const pb::DataFile& file,
                        const std::vector<const pb::StoredPiece*>& pieces, int64_t chunk_bytes,
                        absl::Time deadline, const ChunkSink& sink, const BadPiece& bad,
                        int64_t* verified) {
  std::vector<PieceCheck> checks;
  const int64_t block = source.manifest().checksum_block_bytes();
  for (const pb::StoredPiece* piece : pieces) {
    const int64_t stored = StoredBytes(*piece);
    checks.push_back({piece, std::make_unique<StreamingChecksum>(stored > block ? block : 0)});
  }
  std::string chunk;
  for (int64_t at = 0; at < file.size_bytes(); at += chunk_bytes) {
    chunk.resize(static_cast<size_t>(std::min(chunk_bytes, file.size_bytes() - at)));
    CKPT_RETURN_IF_ERROR(source.Read(file.name(), at, absl::MakeSpan(chunk), deadline));
    CKPT_RETURN_IF_ERROR(CheckChunk(checks, at, chunk, bad, verified));
    if (sink) CKPT_RETURN_IF_ERROR(sink(chunk));
  }
  return absl::OkStatus();
}

// Copies one data file in chunks; a piece that fails its checksum ends the copy (DataLoss).
absl::Status CopyFile(const StoredCheckpoint& source, CheckpointWrite& write,
                      const pb::DataFile& file, const std::vector<const pb::StoredPiece*>& pieces,
                      const CopyOptions& options, absl::Time deadline, int64_t* verified) {
  const std::string where =
      absl::StrCat("copying ", source.url(), " to ", write.url(), ": ", file.name());
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer, write.Create(file.name()));
  CKPT_RETURN_IF_ERROR(StreamFile(
      source, file, pieces, options.chunk_bytes, deadline,
      [&](absl::string_view chunk) { return writer->Append(chunk); },
      [&](const pb::StoredPiece& piece) {
        return absl::DataLossError(absl::StrCat(where, ": stored bytes of ", DescribePiece(piece),
                                                " do not match their XXH3-64 checksum"));
      },
      verified));
  return writer->Close(deadline);
}

std::map<std::string, std::vector<const pb::StoredPiece*>> PiecesByFile(
    const pb::Manifest& manifest) {
  std::map<std::string, std::vector<const pb::StoredPiece*>> by_file;
  for (const pb::StoredPiece& piece : manifest.pieces()) by_file[piece.file()].push_back(&piece);
  return by_file;
}

// Runs fn(0) ... fn(n - 1) on up to `parallelism` threads; the first error wins and stops the
// threads after their current call.
absl::Status ForEachFile(int n, int parallelism, const std::function<absl::Status(int)>& fn) {
  std::atomic<int> next{0};
  std::mutex mu;
  absl::Status first;
  auto worker = [&] {
    for (int i = next++; i < n; i = next++) {
      absl::Status s = fn(i);
      if (s.ok()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = s;
      next = n;
    }
  };
  const int threads = std::max(1, std::min(parallelism, n));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  return first;
}

// Copies every data file, `parallelism` at a time.
absl::Status CopyFiles(const StoredCheckpoint& source, CheckpointWrite& write,
                       const CopyOptions& options, absl::Time deadline, CopyReport* report) {
  const pb::Manifest& manifest = source.manifest();
  const std::map<std::string, std::vector<const pb::StoredPiece*>> by_file = PiecesByFile(manifest);
  std::atomic<int64_t> verified{0};
  absl::Status copied = ForEachFile(manifest.files_size(), options.parallelism, [&](int i) {
    const pb::DataFile& file = manifest.files(i);
    auto pieces = by_file.find(file.name());
    int64_t mine = 0;
    absl::Status s =
        CopyFile(source, write, file,
                 pieces != by_file.end() ? pieces->second : std::vector<const pb::StoredPiece*>(),
                 options, deadline, &mine);
    verified += mine;
    return s;
  });
  report->pieces_verified = verified;
  return copied;
}

// Reads data file `file`'s safetensors header through `source` and checks it against the
// manifest (names, dtypes, shapes, offsets; no unknown entries).
absl::Status CheckStoredHeader(const StoredCheckpoint& source, const ManifestIndex& index,
                               const pb::DataFile& file, absl::Time deadline) {
  const std::string where = absl::StrCat(source.url(), "/", file.name());
  if (file.data_start() < 8 || file.data_start() > file.size_bytes()) {
    return absl::DataLossError(
        absl::StrCat(where, ": data start ", file.data_start(), " is outside the file"));
  }
  std::string head(static_cast<size_t>(file.data_start()), '\0');
  CKPT_RETURN_IF_ERROR(source.Read(file.name(), 0, absl::MakeSpan(head), deadline));
  CKPT_ASSIGN_OR_RETURN(uint64_t json_bytes,
                        ParseSafetensorsPrefix(head.substr(0, 8), file.size_bytes(), where));
  if (8 + json_bytes != static_cast<uint64_t>(file.data_start())) {
    return absl::DataLossError(absl::StrCat(where, ": its header ends at ", 8 + json_bytes,
                                            ", the manifest says data starts at ",
                                            file.data_start()));
  }
  CKPT_ASSIGN_OR_RETURN(
      SafetensorsHeader header,
      ParseSafetensorsHeader(absl::string_view(head).substr(8), file.size_bytes(), where));
  return CheckHeaderAgainstManifest(index, file, header);
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

namespace ckpt {

absl::StatusOr<VerifyReport> VerifyStoredCheckpoint(const std::string& url,
                                                    const CopyOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  CKPT_ASSIGN_OR_RETURN(CheckpointStore * store, StoreForUrl(url));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StoredCheckpoint> source, store->Open(url, deadline));
  const pb::Manifest& manifest = source->manifest();
  const ManifestIndex index(manifest);
  const std::map<std::string, std::vector<const pb::StoredPiece*>> by_file = PiecesByFile(manifest);
  VerifyReport report;
  report.tensors = manifest.tensors_size();
  report.pieces = manifest.pieces_size();
  report.files = manifest.files_size();
  std::mutex mu;
  std::atomic<int64_t> verified{0};
  CKPT_RETURN_IF_ERROR(ForEachFile(manifest.files_size(), options.parallelism, [&](int i) {
    const pb::DataFile& file = manifest.files(i);
    CKPT_RETURN_IF_ERROR(CheckStoredHeader(*source, index, file, deadline));
    auto pieces = by_file.find(file.name());
    int64_t mine = 0;
    absl::Status s = StreamFile(
        *source, file,
        pieces != by_file.end() ? pieces->second : std::vector<const pb::StoredPiece*>(),
        options.chunk_bytes, deadline, nullptr,
        [&](const pb::StoredPiece& piece) {
          std::lock_guard<std::mutex> lock(mu);
          report.problems.push_back(absl::StrCat("checksum mismatch: ", DescribePiece(piece)));
          return absl::OkStatus();
        },
        &mine);
    verified += mine;
    return s;
  }));
  for (const pb::DataFile& file : manifest.files()) report.bytes_checked += file.size_bytes();
  std::sort(report.problems.begin(), report.problems.end());
  return report;
}

}  // namespace ckpt
