#include "storage/verify.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/coverage.h"
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

// Most pieces verified in one batch (the batch's manifest share is held in memory).
constexpr int kMaxBatchPieces = 1 << 16;

// Reads every stored byte of the pieces `reader` holds, verifying checksums, holding at most
// about `max_batch_bytes` at once; a chunk that fails is a problem in `report`.
void VerifyPieceBytes(const CheckpointReader& reader, int64_t max_batch_bytes,
                      VerifyReport* report) {
  const pb::Manifest& m = reader.manifest();
  // Chunks of pieces aligned to checksum blocks, so every chunk is verifiable on its own.
  const int64_t block = std::max<int64_t>(1, m.checksum_block_bytes());
  const int64_t chunk = std::max(block, (int64_t{64} << 20) / block * block);
  std::vector<PieceRead> batch;
  std::vector<std::unique_ptr<char[]>> buffers;
  int64_t batch_bytes = 0;
  auto flush = [&]() {
    if (batch.empty()) return;
    absl::Status s = reader.ReadPieces(batch);
    if (!s.ok()) {
      // Find every bad chunk, not just the first (and count the good ones).
      for (const PieceRead& r : batch) {
        absl::Status one = reader.ReadPieces({r});
        if (!one.ok()) {
          report->problems.push_back(std::string(one.message()));
        } else {
          report->bytes_checked += r.end - r.begin;
        }
      }
    } else {
      for (const PieceRead& r : batch) report->bytes_checked += r.end - r.begin;
    }
    batch.clear();
    buffers.clear();
    batch_bytes = 0;
  };
  for (int i = 0; i < m.pieces_size(); ++i) {
    const int64_t len = m.pieces(i).byte_length();
    const int64_t step = m.pieces(i).block_xxh3_size() > 0 ? chunk : std::max<int64_t>(len, 1);
    for (int64_t b = 0; b < len || (len == 0 && b == 0); b += step) {
      const int64_t e = std::min(len, b + step);
      if (batch_bytes + (e - b) > max_batch_bytes) flush();
      buffers.emplace_back(new char[std::max<int64_t>(1, e - b)]);
      batch.push_back({i, b, e, buffers.back().get()});
      batch_bytes += e - b;
      if (len == 0) break;
    }
  }
  flush();
}

// The pieces of a checkpoint's manifest as they stream, verified a bounded batch at a time:
// each batch is opened as a share (CheckpointReader::OpenShare: its pieces' entries checked in
// their data files' headers) and its bytes read. Counts the pieces of each data file, so that
// Finish can tell a header that holds entries no piece names.
class BatchVerifier {
 public:
  BatchVerifier(const std::string& path, const pb::Manifest& head, const IoOptions& io,
                int64_t max_batch_bytes, VerifyReport* report)
      : path_(path), head_(head), max_batch_bytes_(max_batch_bytes), report_(report) {
    options_.io = io;
    options_.verify_checksums = true;
    options_.share_checked_by_caller = true;  // validated by the stream, headers checked here
    for (int i = 0; i < head.tensors_size(); ++i) tensors_.emplace(head.tensors(i).key(), i);
    for (int i = 0; i < head.files_size(); ++i) files_.emplace(head.files(i).name(), i);
    pieces_in_file_.assign(head.files_size(), 0);
  }

  // Takes `piece` (validated on its own by the stream) into the batch.
  absl::Status Add(pb::StoredPiece& piece) {
    ++report_->pieces;
    auto file = files_.find(piece.file());
    if (file != files_.end()) ++pieces_in_file_[file->second];
    batch_bytes_ += piece.byte_length();
    *batch_.add_pieces() = std::move(piece);
    if (batch_bytes_ < max_batch_bytes_ && batch_.pieces_size() < kMaxBatchPieces) {
      return absl::OkStatus();
    }
    return Flush();
  }

  // Verifies the batch.
  absl::Status Flush();
  // Once every piece is in and flushed: each data file's size, data start and entry count.
  absl::Status Finish();

 private:
  const std::string& path_;
  const pb::Manifest& head_;
  const int64_t max_batch_bytes_;
  VerifyReport* const report_;
  ReaderOptions options_;
  absl::flat_hash_map<absl::string_view, int> tensors_;  // key -> index in head_
  absl::flat_hash_map<absl::string_view, int> files_;    // name -> index in head_
  std::vector<int64_t> pieces_in_file_;
  // The parsed headers of the data files of the last batch (by index in head_): the next
  // batch's pieces are mostly in the same files, which are parsed once.
  absl::flat_hash_map<int, SafetensorsHeader> headers_;
  pb::Manifest batch_;
  int64_t batch_bytes_ = 0;
};

absl::Status BatchVerifier::Flush() {
  if (batch_.pieces_size() == 0) return absl::OkStatus();
  pb::Manifest share;
  share.set_format_version(head_.format_version());
  share.set_checksum_block_bytes(head_.checksum_block_bytes());
  std::set<int> tensors, files;
  for (const pb::StoredPiece& p : batch_.pieces()) {
    if (auto t = tensors_.find(p.key()); t != tensors_.end()) tensors.insert(t->second);
    if (auto f = files_.find(p.file()); f != files_.end()) files.insert(f->second);
  }
  for (int t : tensors) *share.add_tensors() = head_.tensors(t);
  for (int f : files) *share.add_files() = head_.files(f);
  share.mutable_pieces()->Swap(batch_.mutable_pieces());
  batch_.Clear();
  batch_bytes_ = 0;
  absl::flat_hash_map<int, SafetensorsHeader> headers;
  const ManifestIndex index(share);
  for (int f : files) {
    auto cached = headers_.find(f);
    if (cached != headers_.end()) {
      headers.emplace(f, std::move(cached->second));
    } else {
      CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadDataFileHeader(path_, head_.files(f)));
      headers.emplace(f, std::move(header));
    }
    CKPT_RETURN_IF_ERROR(CheckHeaderAgainstShare(index, head_.files(f), headers.at(f)));
  }
  headers_ = std::move(headers);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::OpenShare(path_, std::move(share), options_));
  VerifyPieceBytes(*reader, max_batch_bytes_, report_);
  return absl::OkStatus();
}

absl::Status BatchVerifier::Finish() {
  const pb::Manifest no_pieces;
  const ManifestIndex none(no_pieces);
  for (int i = 0; i < head_.files_size(); ++i) {
    const pb::DataFile& file = head_.files(i);
    auto cached = headers_.find(i);
    SafetensorsHeader read;
    if (cached == headers_.end()) {
      CKPT_ASSIGN_OR_RETURN(read, ReadDataFileHeader(path_, file));
    }
    const SafetensorsHeader& header = cached == headers_.end() ? read : cached->second;
    CKPT_RETURN_IF_ERROR(CheckHeaderAgainstShare(none, file, header));  // data start and size
    const int64_t entries = static_cast<int64_t>(header.entries.size());
    if (entries != pieces_in_file_[i]) {
      return absl::DataLossError(absl::StrCat(
          "data file ", file.name(), ": its header has ", entries, " entries; the manifest lists ",
          pieces_in_file_[i], " pieces in it (entries not listed in the manifest)"));
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
  CKPT_ASSIGN_OR_RETURN(const pb::Manifest head, ReadManifestHead(path));
  VerifyReport report;
  BatchVerifier verifier(path, head, io, max_batch_bytes, &report);
  // The stream validates the whole manifest (coverage included) as its pieces pass.
  CKPT_ASSIGN_OR_RETURN(const pb::Manifest validated,
                        StreamManifestFile(path, [&](int64_t, pb::StoredPiece& piece) {
                          return verifier.Add(piece);
                        }));
  if (SerializeManifest(validated) != SerializeManifest(head)) {
    return absl::AbortedError(absl::StrCat("the manifest of ", path, " changed while verified"));
  }
  CKPT_RETURN_IF_ERROR(verifier.Flush());
  CKPT_RETURN_IF_ERROR(verifier.Finish());
  report.tensors = validated.tensors_size();
  report.files = validated.files_size();
  report.manifest_piece_files = validated.piece_files_size();
  ReportForeignFiles(path, validated, &report);
  return report;
}

}  // namespace ckpt
