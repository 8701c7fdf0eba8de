#include "storage/verify.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
    CKPT_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(shape));
    std::vector<Region> regions;
    for (int i : by_key[t.key()]) regions.push_back(PieceRegion(manifest.pieces(i)));
    // Sweep along dim 0 (0-d tensors: all pairs).
    std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) {
      return a.offsets.empty() ? false : a.offsets[0] < b.offsets[0];
    });
    int64_t stored = 0;
    bool overlap = false;
    for (size_t i = 0; i < regions.size() && !overlap; ++i) {
      const int64_t n = regions[i].NumElements();
      stored = n > std::numeric_limits<int64_t>::max() - stored
                   ? std::numeric_limits<int64_t>::max()
                   : stored + n;
      for (size_t j = i + 1; j < regions.size(); ++j) {
        if (!shape.empty() &&
            regions[j].offsets[0] >= regions[i].offsets[0] + regions[i].lengths[0]) {
          break;
        }
        CKPT_ASSIGN_OR_RETURN(int64_t both, OverlapElements(regions[i], regions[j], shape));
        if (both > 0) {
          problems.push_back(
              absl::StrCat("tensor \"", t.key(), "\": pieces ", regions[i].DebugString(), " and ",
                           regions[j].DebugString(), " both store ", both, " elements"));
          overlap = true;
          break;
        }
      }
    }
    if (!overlap && stored != numel) {
      problems.push_back(absl::StrCat("tensor \"", t.key(), "\" ", ShapeString(shape), ": ", stored,
                                      " of ", numel, " elements are stored (", numel - stored,
                                      " missing)"));
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
  CKPT_ASSIGN_OR_RETURN(report.problems, CheckCoverage(m));
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
