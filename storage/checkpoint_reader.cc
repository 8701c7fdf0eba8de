#include "storage/checkpoint_reader.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/coverage.h"
#include "sharding/dtype.h"
#include "sharding/overlap.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/manifest_file.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

constexpr char kManifestName[] = "manifest.pb";

// Checks data file `file` of the checkpoint in `dir` against the manifest `index` covers (a
// share's when `share`: only its pieces' entries).
absl::Status CheckDataFile(const std::string& dir, const ManifestIndex& index,
                           const pb::DataFile& file, bool share) {
  CKPT_ASSIGN_OR_RETURN(const SafetensorsHeader header, ReadDataFileHeader(dir, file));
  return share ? CheckHeaderAgainstShare(index, file, header)
               : CheckHeaderAgainstManifest(index, file, header);
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ReadDataFileHeader(const std::string& dir,
                                                     const pb::DataFile& file) {
  const std::string path = JoinPath(dir, file.name());
  CKPT_ASSIGN_OR_RETURN(int64_t size, FileSize(path));
  if (size != file.size_bytes()) {
    return absl::DataLossError(absl::StrCat("data file ", path, " is ", size,
                                            " bytes; the manifest says ", file.size_bytes(),
                                            size < file.size_bytes() ? " (truncated)" : ""));
  }
  CKPT_ASSIGN_OR_RETURN(std::string prefix, ReadFileRange(path, 0, 8));
  CKPT_ASSIGN_OR_RETURN(uint64_t header_len, ParseSafetensorsPrefix(prefix, size, path));
  CKPT_ASSIGN_OR_RETURN(std::string json, ReadFileRange(path, 8, static_cast<int64_t>(header_len)));
  return ParseSafetensorsHeader(json, size, path);
}

absl::Status CheckCheckpointComplete(const std::string& path) {
  switch (ProbeCheckpoint(path).state) {
    case CheckpointState::kMissing:
      return absl::NotFoundError(absl::StrCat("no checkpoint at ", path));
    case CheckpointState::kNotADirectory:
      return absl::FailedPreconditionError(absl::StrCat(path, " is not a checkpoint directory"));
    case CheckpointState::kIncomplete:
      return absl::FailedPreconditionError(absl::StrCat(
          "incomplete checkpoint at ", path, " (no manifest.pb: its write never committed)"));
    case CheckpointState::kComplete:
      break;
  }
  return absl::OkStatus();
}

const char* CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kMissing:
      return "missing";
    case CheckpointState::kIncomplete:
      return "incomplete";
    case CheckpointState::kComplete:
      return "complete";
    case CheckpointState::kNotADirectory:
      return "not a directory";
  }
  return "?";
}

CheckpointProbe ProbeCheckpoint(const std::string& path) {
  CheckpointProbe probe;
  if (!PathExists(path)) {
    probe.state = CheckpointState::kMissing;
  } else if (!IsDirectory(path)) {
    probe.state = CheckpointState::kNotADirectory;
  } else {
    probe.state = PathExists(JoinPath(path, kManifestName)) ? CheckpointState::kComplete
                                                            : CheckpointState::kIncomplete;
  }
  const std::string parent = ParentDir(path);
  auto names = ListDir(parent);
  if (names.ok()) {
    const std::string prefix = absl::StrCat(".", BaseName(path), ".");
    for (const std::string& n : *names) {
      if (!absl::StartsWith(n, prefix)) continue;
      absl::string_view rest = absl::string_view(n).substr(prefix.size());
      if (!absl::StartsWith(rest, "tmp-") && !absl::StartsWith(rest, "old-")) continue;
      const std::string full = JoinPath(parent, n);
      const bool has_manifest = PathExists(JoinPath(full, kManifestName));
      probe.leftovers.push_back(absl::StrCat(
          full, absl::StartsWith(rest, "old-")
                    ? " (previous checkpoint moved aside by an interrupted overwrite)"
                    : (has_manifest ? " (complete but not under the final name: an interrupted "
                                      "commit, or the checkpoint an interrupted overwrite replaced)"
                                    : " (interrupted write, incomplete)")));
    }
  }
  return probe;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& path, const ReaderOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
  CKPT_ASSIGN_OR_RETURN(pb::Manifest manifest, ReadManifestFile(path));
  return FromManifest(path, std::move(manifest), options, /*share=*/false);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::OpenShare(
    const std::string& path, pb::Manifest share, const ReaderOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckCheckpointComplete(path));
  if (absl::Status s = ValidateManifestShare(share); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("manifest share of ", path, ": ", s.message()));
  }
  return FromManifest(path, std::move(share), options, /*share=*/true);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::FromManifest(
    const std::string& path, pb::Manifest manifest, const ReaderOptions& options, bool share) {
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->path_ = path;
  r->options_ = options;
  r->manifest_ = std::move(manifest);
  const ManifestIndex index(r->manifest_);
  for (const pb::DataFile& f : r->manifest_.files()) {
    CKPT_RETURN_IF_ERROR(CheckDataFile(path, index, f, share));
  }
  r->IndexPieces(index);
  return r;
}

void CheckpointReader::IndexPieces(const ManifestIndex& index) {
  const int num_tensors = manifest_.tensors_size();
  tensor_index_.reserve(num_tensors);
  for (int i = 0; i < num_tensors; ++i) tensor_index_[manifest_.tensors(i).key()] = i;
  // A counting sort of the pieces by tensor, keeping manifest order within each tensor.
  piece_start_.assign(num_tensors + 1, 0);
  for (int i = 0; i < manifest_.pieces_size(); ++i) ++piece_start_[index.TensorOfPiece(i) + 1];
  for (int t = 0; t < num_tensors; ++t) piece_start_[t + 1] += piece_start_[t];
  pieces_by_tensor_.resize(manifest_.pieces_size());
  std::vector<int> next(piece_start_.begin(), piece_start_.end() - 1);
  for (int i = 0; i < manifest_.pieces_size(); ++i) {
    pieces_by_tensor_[next[index.TensorOfPiece(i)]++] = i;
  }
}

const pb::TensorMeta* CheckpointReader::FindTensor(const std::string& key) const {
  auto it = tensor_index_.find(key);
  return it == tensor_index_.end() ? nullptr : &manifest_.tensors(it->second);
}

std::vector<int> CheckpointReader::PiecesOf(const std::string& key) const {
  auto it = tensor_index_.find(key);
  if (it == tensor_index_.end()) return {};
  return std::vector<int>(pieces_by_tensor_.begin() + piece_start_[it->second],
                          pieces_by_tensor_.begin() + piece_start_[it->second + 1]);
}

absl::Status CheckpointReader::ReadPieces(const std::vector<PieceRead>& reads) const {
  return ReadPieces(reads, options_.verify_checksums);
}

absl::Status ReadStoredPieces(const std::string& dir, int64_t checksum_block_bytes,
                              absl::Span<const StoredPieceRead> reads, bool verify,
                              const IoOptions& io) {
  // Partial reads that do not line up with checksum blocks go through a staging buffer that
  // covers whole blocks, then the requested bytes are copied out.
  struct Staged {
    std::unique_ptr<char[]> buf;
    int64_t skip = 0;
    int64_t n = 0;
    void* dest = nullptr;
  };
  std::vector<Staged> staged;
  std::vector<RangeRead> ranges;
  const int64_t block = checksum_block_bytes;
  for (const StoredPieceRead& pr : reads) {
    const pb::StoredPiece& p = *pr.piece;
    const int64_t len = p.byte_length();
    if (pr.begin < 0 || pr.begin > pr.end || pr.end > len) {
      return absl::InvalidArgumentError(absl::StrCat("byte range [", pr.begin, ", ", pr.end,
                                                     ") is outside ", DescribePiece(p), " of ", len,
                                                     " bytes"));
    }
    RangeRead rr;
    rr.path = JoinPath(dir, p.file());
    // The entry name says the key and region (formatting DescribePiece per read would cost
    // more than a small read).
    rr.label = absl::StrCat("tensor \"", p.key(), "\", entry \"", p.entry_name(), "\"");
    int64_t b = pr.begin, e = pr.end;
    if (!verify) {
      if (b == e) continue;
      rr.offset = p.byte_offset() + b;
      rr.length = e - b;
      rr.dest = pr.dest;
      ranges.push_back(std::move(rr));
      continue;
    }
    rr.verify = true;
    if (p.block_xxh3_size() > 0) {
      if (b == e) continue;
      b = b / block * block;
      e = std::min((e + block - 1) / block * block, len);
      rr.block_bytes = block;
      rr.expected.assign(p.block_xxh3().begin() + b / block,
                         p.block_xxh3().begin() + (e + block - 1) / block);
    } else {
      b = 0;
      e = len;
      rr.expected = {p.xxh3_64()};
    }
    rr.offset = p.byte_offset() + b;
    rr.length = e - b;
    if (b == pr.begin && e == pr.end) {
      rr.dest = pr.dest;
    } else {
      Staged s;
      s.buf.reset(new char[std::max<int64_t>(1, e - b)]);
      s.skip = pr.begin - b;
      s.n = pr.end - pr.begin;
      s.dest = pr.dest;
      rr.dest = s.buf.get();
      staged.push_back(std::move(s));
    }
    ranges.push_back(std::move(rr));
  }
  CKPT_RETURN_IF_ERROR(ReadRanges(ranges, io));
  for (const Staged& s : staged) {
    if (s.n > 0) std::memcpy(s.dest, s.buf.get() + s.skip, s.n);
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadPieces(const std::vector<PieceRead>& reads, bool verify) const {
  std::vector<StoredPieceRead> stored;
  stored.reserve(reads.size());
  for (const PieceRead& pr : reads) {
    if (pr.piece < 0 || pr.piece >= manifest_.pieces_size()) {
      return absl::InvalidArgumentError(absl::StrCat("no stored piece ", pr.piece));
    }
    stored.push_back({&manifest_.pieces(pr.piece), pr.begin, pr.end, pr.dest});
  }
  return ReadStoredPieces(path_, manifest_.checksum_block_bytes(), stored, verify, options_.io);
}

absl::Status CheckpointReader::ReadRegion(const std::string& key, const Region& region,
                                          void* dest) const {
  return ReadRegions({RegionRead{key, region, dest}});
}

absl::Status CheckpointReader::ReadRegions(absl::Span<const RegionRead> regions) const {
  // A part of a stored piece that lands in its destination in several runs: read into `buf`,
  // then copied out.
  struct Part {
    std::vector<CopyRun> runs;
    std::unique_ptr<char[]> buf;
    int64_t elem_size = 0;
    void* dest = nullptr;
  };
  std::vector<Part> parts;
  std::vector<PieceRead> reads;
  for (const RegionRead& rr : regions) {
    const pb::TensorMeta* t = FindTensor(rr.key);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("no tensor \"", rr.key, "\" in ", path_));
    }
    CKPT_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(t->dtype()));
    const int64_t es = DTypeSize(dtype);
    const std::vector<int64_t> shape(t->global_shape().begin(), t->global_shape().end());
    absl::Status valid = ValidateRegion(rr.region, shape);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", rr.key, "\" region ", rr.region.DebugString(), ": ", valid.message()));
    }
    std::vector<std::pair<int64_t, int64_t>> written;  // (dst offset, length) of every run
    for (int index : PiecesOf(rr.key)) {
      const Region stored = PieceRegion(manifest_.pieces(index));
      CKPT_ASSIGN_OR_RETURN(std::vector<CopyRun> runs, OverlapRuns(stored, rr.region, shape));
      if (runs.empty()) continue;
      int64_t lo = runs.front().src_offset, hi = 0;
      for (const CopyRun& r : runs) {
        lo = std::min(lo, r.src_offset);
        hi = std::max(hi, r.src_offset + r.length);
        written.emplace_back(r.dst_offset, r.length);
      }
      char* dest = static_cast<char*>(rr.dest);
      if (runs.size() == 1) {  // one contiguous run: read straight into place
        reads.push_back({index, lo * es, hi * es, dest + runs[0].dst_offset * es});
        continue;
      }
      Part part;
      for (CopyRun& r : runs) r.src_offset -= lo;
      part.runs = std::move(runs);
      part.buf.reset(new char[std::max<int64_t>(1, (hi - lo) * es)]);
      part.elem_size = es;
      part.dest = dest;
      reads.push_back({index, lo * es, hi * es, part.buf.get()});
      parts.push_back(std::move(part));
    }
    // Every element of the destination is written exactly once (Open validated the coverage
    // of each tensor; this guards the buffer itself): never a hole of stale bytes.
    CKPT_RETURN_IF_ERROR(RunTilingStatus(
        FindRunTilingFault(std::move(written), rr.region.NumElements()),
        absl::StrCat("tensor \"", rr.key, "\" region ", rr.region.DebugString(), " in ", path_)));
  }
  CKPT_RETURN_IF_ERROR(ReadPieces(reads));
  for (const Part& part : parts) CopyRuns(part.runs, part.elem_size, part.buf.get(), part.dest);
  return absl::OkStatus();
}

}  // namespace ckpt
