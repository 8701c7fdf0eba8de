#include "storage/verify.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/coverage.h"
#include "sharding/overlap.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"

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

absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& path, const IoOptions& io,
                                              int64_t max_batch_bytes) {
  ReaderOptions ro;
  ro.io = io;
  ro.verify_checksums = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path, ro));
  const pb::Manifest& m = reader->manifest();
  VerifyReport report;
  report.tensors = m.tensors_size();
  report.pieces = m.pieces_size();
  report.files = m.files_size();
  report.manifest_piece_files = m.piece_files_size();
  // Files in data/ that the manifest does not know (e.g. from another writer) are reported.
  std::set<std::string> listed;
  for (const pb::DataFile& f : m.files()) listed.insert(f.name());
  auto present = ListDir(JoinPath(path, "data"));
  if (present.ok()) {
    for (const std::string& name : *present) {
      if (!listed.count("data/" + name)) {
        report.problems.push_back(
            absl::StrCat(JoinPath(path, "data/" + name), " is not listed in the manifest"));
      }
    }
  }

  // Chunks of pieces aligned to checksum blocks, so every chunk is verifiable on its own.
  const int64_t block = std::max<int64_t>(1, m.checksum_block_bytes());
  const int64_t chunk = std::max(block, (int64_t{64} << 20) / block * block);
  std::vector<PieceRead> batch;
  std::vector<std::unique_ptr<char[]>> buffers;
  int64_t batch_bytes = 0;
  auto flush = [&]() {
    if (batch.empty()) return;
    absl::Status s = reader->ReadPieces(batch);
    if (!s.ok()) {
      // Find every bad chunk, not just the first.
      for (const PieceRead& r : batch) {
        absl::Status one = reader->ReadPieces({r});
        if (!one.ok()) report.problems.push_back(std::string(one.message()));
      }
    } else {
      for (const PieceRead& r : batch) report.bytes_checked += r.end - r.begin;
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
  return report;
}

}  // namespace ckpt
