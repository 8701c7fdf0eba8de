#include "storage/verify.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "sharding/coverage.h"
#include "sharding/dtype.h"
#include "sharding/overlap.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/safetensors.h"

namespace ckpt {

absl::StatusOr<std::vector<std::string>> CheckCoverage(const pb::Manifest& manifest) {
  std::vector<std::string> problems;
  std::map<std::string, std::vector<int>> by_key;
  for (int i = 0; i < manifest.pieces_size(); ++i) by_key[manifest.pieces(i).key()].push_back(i);
  for (const pb::TensorMeta& t : manifest.tensors()) {
    const std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
    CKPT_RETURN_IF_ERROR(CheckedNumElements(shape).status());
    const std::vector<int>& indices = by_key[t.key()];
    std::vector<Region> regions;
    for (int i : indices) {
      absl::StatusOr<Region> r = RegionFromProto(manifest.pieces(i).region());
      absl::Status valid = r.ok() ? ValidateRegion(*r, shape) : r.status();
      if (!valid.ok()) {
        return absl::DataLossError(
            absl::StrCat(DescribePiece(manifest.pieces(i)), ": ", valid.message()));
      }
      regions.push_back(*std::move(r));
    }
    absl::StatusOr<std::optional<CoverageFault>> fault =
        FindCoverageFault(shape, regions, CoverageTermBudget(static_cast<int64_t>(regions.size())));
    if (!fault.ok()) {
      problems.push_back(absl::StrCat("tensor \"", t.key(), "\": ", fault.status().message()));
    } else if (fault->has_value()) {
      problems.push_back(DescribeCoverageFault(t.key(), shape, **fault, [&](int p) {
        return DescribePiece(manifest.pieces(indices[p]));
      }));
    }
  }
  return problems;
}

namespace {

// Most pieces verified in one batch.
constexpr int kMaxBatchPieces = 1 << 16;

// The pieces of a checkpoint's manifest as they stream, verified a bounded batch at a time:
// each piece's entry checked in its data file's header (parsed once for consecutive batches),
// then every stored byte read verifying checksums (ReadStoredPieces). The batch's piece objects
// are reused from batch to batch (millions of pieces allocated and freed in batches fragment the
// heap badly). Counts the pieces of each data file, so that Finish can tell a header that holds
// entries no piece names.
class BatchVerifier {
 public:
  // `head` (copied) is the manifest's head as the stream hands it, checked.
  BatchVerifier(const std::string& path, const pb::Manifest& head, const IoOptions& io,
                int64_t max_batch_bytes, VerifyReport* report)
      : path_(path), head_(head), io_(io), max_batch_bytes_(max_batch_bytes), report_(report) {
    for (const pb::TensorMeta& t : head_.tensors()) {
      absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
      dtypes_.emplace(t.key(), dtype.ok() ? *dtype : DType::kU8);  // validated by the stream
    }
    for (int i = 0; i < head_.files_size(); ++i) files_.emplace(head_.files(i).name(), i);
    pieces_in_file_.assign(head_.files_size(), 0);
    entries_in_file_.assign(head_.files_size(), -1);
  }

  // Copies `piece` (validated on its own by the stream) into the batch.
  absl::Status Add(const pb::StoredPiece& piece) {
    ++report_->pieces;
    auto file = files_.find(piece.file());
    if (file != files_.end()) ++pieces_in_file_[file->second];
    batch_bytes_ += piece.byte_length();
    *batch_.Add() = piece;  // into a cleared piece of an earlier batch: no allocation
    if (batch_bytes_ < max_batch_bytes_ && batch_.size() < kMaxBatchPieces) {
      return absl::OkStatus();
    }
    return Flush();
  }

  // Verifies the batch.
  absl::Status Flush();
  // Once every piece is in and flushed: each data file's entry count (and the size and data
  // start of a file no piece is in).
  absl::Status Finish();

 private:
  absl::Status CheckHeaders();
  void ReadBytes();

  const std::string& path_;
  const pb::Manifest head_;
  const IoOptions io_;
  const int64_t max_batch_bytes_;
  VerifyReport* const report_;
  absl::flat_hash_map<absl::string_view, DType> dtypes_;  // by tensor key
  absl::flat_hash_map<absl::string_view, int> files_;     // name -> index in head_
  std::vector<int64_t> pieces_in_file_;
  std::vector<int64_t> entries_in_file_;  // in each header checked so far, -1 for the others
  // The parsed headers of the data files of the last batch (by index in head_): the next
  // batch's pieces are mostly in the same files, which are parsed once.
  absl::flat_hash_map<int, SafetensorsHeader> headers_;
  google::protobuf::RepeatedPtrField<pb::StoredPiece> batch_;
  int64_t batch_bytes_ = 0;
  std::unique_ptr<char[]> buffer_;  // the bytes read, kept for the next batch
  int64_t buffer_bytes_ = 0;
};

absl::Status BatchVerifier::Flush() {
  if (batch_.empty()) return absl::OkStatus();
  CKPT_RETURN_IF_ERROR(CheckHeaders());
  ReadBytes();
  batch_.Clear();  // keeps the pieces for the next batch
  batch_bytes_ = 0;
  return absl::OkStatus();
}

// Each piece of the batch an entry of its data file's header at its offsets.
absl::Status BatchVerifier::CheckHeaders() {
  std::map<int, std::pair<std::vector<const pb::StoredPiece*>, std::vector<DType>>> by_file;
  for (const pb::StoredPiece& p : batch_) {
    auto file = files_.find(p.file());
    auto dtype = dtypes_.find(p.key());
    if (file == files_.end() || dtype == dtypes_.end()) {  // the stream validated the piece
      return absl::InternalError(absl::StrCat("a piece of ", path_, " names ", p.key(), " in ",
                                              p.file(), ", which its manifest's head lacks"));
    }
    auto& [pieces, dtypes] = by_file[file->second];
    pieces.push_back(&p);
    dtypes.push_back(dtype->second);
  }
  absl::flat_hash_map<int, SafetensorsHeader> headers;
  for (const auto& [f, in_file] : by_file) {
    auto cached = headers_.find(f);
    if (cached != headers_.end()) {
      headers.emplace(f, std::move(cached->second));
    } else {
      CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadDataFileHeader(path_, head_.files(f)));
      entries_in_file_[f] = static_cast<int64_t>(header.entries.size());
      headers.emplace(f, std::move(header));
    }
    CKPT_RETURN_IF_ERROR(CheckHeaderAgainstPieces(head_.files(f), headers.at(f), in_file.first,
                                                  in_file.second, /*all_entries_known=*/false));
  }
  headers_ = std::move(headers);
  return absl::OkStatus();
}

// Reads every stored byte of the batch's pieces, verifying checksums, holding at most about
// max_batch_bytes_ at once (in one buffer kept for the next batch); a chunk that fails is a
// problem in the report.
void BatchVerifier::ReadBytes() {
  // Chunks of pieces aligned to checksum blocks, so every chunk is verifiable on its own.
  const int64_t block_bytes = head_.checksum_block_bytes();
  const int64_t block = std::max<int64_t>(1, block_bytes);
  const int64_t chunk = std::max(block, (int64_t{64} << 20) / block * block);
  std::vector<StoredPieceRead> reads;
  int64_t bytes = 0;
  auto flush = [&]() {
    if (reads.empty()) return;
    if (bytes > buffer_bytes_) {
      buffer_.reset(new char[bytes]);
      buffer_bytes_ = bytes;
    }
    char* at = buffer_.get();
    for (StoredPieceRead& r : reads) {
      r.dest = at;
      at += r.end - r.begin;
    }
    absl::Status s = ReadStoredPieces(path_, block_bytes, reads, /*verify=*/true, io_);
    for (const StoredPieceRead& r : reads) {
      // Find every bad chunk, not just the first (and count the good ones).
      absl::Status one = s.ok() ? s : ReadStoredPieces(path_, block_bytes, {r}, true, io_);
      if (one.ok()) report_->bytes_checked += r.end - r.begin;
      if (!one.ok()) report_->problems.push_back(std::string(one.message()));
    }
    reads.clear();
    bytes = 0;
  };
  for (const pb::StoredPiece& p : batch_) {
    const int64_t len = p.byte_length();
    const int64_t step = p.block_xxh3_size() > 0 ? chunk : std::max<int64_t>(len, 1);
    for (int64_t b = 0; b < len || (len == 0 && b == 0); b += step) {
      const int64_t e = std::min(len, b + step);
      if (bytes + (e - b) > max_batch_bytes_) flush();
      reads.push_back({&p, b, e, nullptr});
      bytes += e - b;
      if (len == 0) break;
    }
  }
  flush();
}

absl::Status BatchVerifier::Finish() {
  for (int i = 0; i < head_.files_size(); ++i) {
    const pb::DataFile& file = head_.files(i);
    if (entries_in_file_[i] < 0) {  // no piece in it: its header's data start and size
      CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header, ReadDataFileHeader(path_, file));
      CKPT_RETURN_IF_ERROR(CheckHeaderAgainstPieces(file, header, {}, {}, false));
      entries_in_file_[i] = static_cast<int64_t>(header.entries.size());
    }
    if (entries_in_file_[i] != pieces_in_file_[i]) {
      return absl::DataLossError(
          absl::StrCat("data file ", file.name(), ": its header has ", entries_in_file_[i],
                       " entries; the manifest lists ", pieces_in_file_[i],
                       " pieces in it (entries not listed in the manifest)"));
    }
  }
  return absl::OkStatus();
}

// Files at the top of checkpoint directory `path` that are not manifest.pb, data/ or a piece
// file its manifest (`head`) lists, and files in data/ the manifest does not list.
void ReportForeignFiles(const std::string& path, const pb::Manifest& head, VerifyReport* report) {
  std::set<std::string> top = {"manifest.pb", "data"};
  for (const pb::ManifestPieceFile& f : head.piece_files()) top.insert(f.name());
  if (auto present = ListDir(path); present.ok()) {
    for (const std::string& name : *present) {
      if (top.count(name) == 0) {
        report->problems.push_back(absl::StrCat(
            JoinPath(path, name),
            " is not part of the checkpoint (not manifest.pb, data/ or a listed manifest piece "
            "file)"));
      }
    }
  }
  // Files in data/ that the manifest does not know (e.g. from another writer).
  std::set<std::string> listed;
  for (const pb::DataFile& f : head.files()) listed.insert(f.name());
  if (auto present = ListDir(JoinPath(path, "data")); present.ok()) {
    for (const std::string& name : *present) {
      if (!listed.count("data/" + name)) {
        report->problems.push_back(
            absl::StrCat(JoinPath(path, "data/" + name), " is not listed in the manifest"));
      }
    }
  }
}

}  // namespace

absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& path, const IoOptions& io,
                                              int64_t max_batch_bytes) {
  CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
  VerifyReport report;
  std::optional<BatchVerifier> verifier;
  // One read of the manifest: its head first, then its pieces, the whole validated (coverage
  // included) as they pass.
  CKPT_ASSIGN_OR_RETURN(const pb::Manifest validated,
                        StreamManifestFile(
                            path,
                            [&](const pb::Manifest& head) {
                              verifier.emplace(path, head, io, max_batch_bytes, &report);
                              return absl::OkStatus();
                            },
                            [&](int64_t, pb::StoredPiece& piece) { return verifier->Add(piece); }));
  CKPT_RETURN_IF_ERROR(verifier->Flush());
  CKPT_RETURN_IF_ERROR(verifier->Finish());
  report.tensors = validated.tensors_size();
  report.files = validated.files_size();
  report.manifest_piece_files = validated.piece_files_size();
  ReportForeignFiles(path, validated, &report);
  return report;
}

}  // namespace ckpt
