#include "reshard/piece_assembler.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "sharding/coverage.h"
#include "storage/stage_pipeline.h"

namespace ckpt {
namespace {

// Source bytes are read in spans of at most this much, so the I/O threads can share a piece.
constexpr int64_t kChunkBytes = int64_t{16} << 20;

std::string PieceName(const TensorPiece& p) {
  return absl::StrCat("tensor \"", p.key, "\" piece ", p.region.DebugString());
}

}  // namespace

absl::StatusOr<SourcePieces> PiecesOfManifest(const pb::Manifest& manifest) {
  SourcePieces out;
  std::map<std::string, size_t> by_key;
  for (const pb::TensorMeta& t : manifest.tensors()) {
    TensorMeta meta;
    meta.key = t.key();
    absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.key(), "\": ", dtype.status().message()));
    }
    meta.dtype = *dtype;
    meta.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
    by_key[meta.key] = out.tensors.size();
    out.tensors.push_back(std::move(meta));
  }
  for (const pb::StoredPiece& p : manifest.pieces()) {
    auto it = by_key.find(p.key());
    if (it == by_key.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stored piece of unknown tensor \"", p.key(), "\" in ", p.file()));
    }
    const TensorMeta& t = out.tensors[it->second];
    Region region;
    region.offsets.assign(p.region().offsets().begin(), p.region().offsets().end());
    region.lengths.assign(p.region().lengths().begin(), p.region().lengths().end());
    if (p.region().has_flat()) {
      region.flat = FlatRange{p.region().flat().start(), p.region().flat().stop()};
    }
    out.pieces.push_back(
        TensorPiece{p.key(), p.writer_rank(), t.dtype, t.global_shape, region, {}});
  }
  return out;
}

PieceAssembler::PieceAssembler(const CheckpointReader& reader, const std::vector<TensorPiece>& src,
                               const std::vector<TensorPiece>& dst, const ReshardPlan& plan,
                               int64_t staging_cap, bool overlap)
    : reader_(reader),
      src_(src),
      dst_(dst),
      plan_(plan),
      staging_cap_(staging_cap),
      overlap_(overlap) {
  // Transfers are sorted by destination piece: index their ranges.
  for (size_t t = 0; t < plan_.transfers.size(); ++t) {
    auto& range = transfers_of_[plan_.transfers[t].dst_piece];
    if (range.second == 0) range.first = static_cast<int64_t>(t);
    range.second = static_cast<int64_t>(t) + 1;
  }
}

absl::Status PieceAssembler::Fill(absl::Span<const int64_t> pieces,
                                  absl::Span<char* const> buffers) {
  if (pieces.size() != buffers.size()) {
    return absl::InternalError(
        absl::StrCat("assembling ", pieces.size(), " pieces into ", buffers.size(), " buffers"));
  }
  // Byte jobs per source piece.
  std::map<int, std::vector<ByteJob>> jobs;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t j = pieces[i];
    if (j < 0 || j >= static_cast<int64_t>(dst_.size())) {
      return absl::InternalError(absl::StrCat("destination piece ", j, " is not in the plan"));
    }
    const int64_t es = DTypeSize(dst_[j].dtype);
    std::vector<std::pair<int64_t, int64_t>> written;  // (dst offset, length) in elements
    auto range = transfers_of_.find(j);
    if (range != transfers_of_.end()) {
      for (int64_t t = range->second.first; t < range->second.second; ++t) {
        const ReshardTransfer& tr = plan_.transfers[t];
        CKPT_ASSIGN_OR_RETURN(std::vector<CopyRun> runs,
                              OverlapRunsOf(plan_, tr.overlap, src_, dst_));
        auto& list = jobs[static_cast<int>(tr.src_piece)];
        for (const CopyRun& r : runs) {
          list.push_back({r.src_offset * es, r.length * es, buffers[i] + r.dst_offset * es});
          written.emplace_back(r.dst_offset, r.length);
        }
      }
    }
    // Each element of the buffer from exactly one source run: never a hole of stale bytes.
    CKPT_RETURN_IF_ERROR(
        RunTilingStatus(FindRunTilingFault(std::move(written), dst_[j].region.NumElements()),
                        absl::StrCat(PieceName(dst_[j]), " (from ", reader_.path(), ")")));
  }
  const int64_t slot_cap = std::max<int64_t>(1, staging_cap_ / 2);
  const std::vector<SpanRead> spans = SpansOf(&jobs, slot_cap);
  // Batches of at most a slot's share: batch k + 1 is read into one staging slot while batch
  // k is copied out of the other.
  std::vector<std::pair<size_t, size_t>> batches;
  for (size_t s = 0; s < spans.size();) {
    size_t e = s;
    int64_t bytes = 0;
    while (e < spans.size() && (e == s || bytes + (spans[e].end - spans[e].begin) <= slot_cap)) {
      bytes += spans[e].end - spans[e].begin;
      ++e;
    }
    batches.emplace_back(s, e);
    s = e;
  }
  std::vector<PieceRead> reads[2];
  auto produce = [&](int64_t b, int slot) {
    return ReadBatch(
        absl::MakeSpan(spans).subspan(batches[b].first, batches[b].second - batches[b].first), slot,
        &reads[slot]);
  };
  auto consume = [&](int64_t b, int slot) {
    CopyOut(absl::MakeSpan(spans).subspan(batches[b].first, batches[b].second - batches[b].first),
            reads[slot], jobs);
    return absl::OkStatus();
  };
  stats_.batches += static_cast<int64_t>(batches.size());
  return RunStagePipeline(static_cast<int64_t>(batches.size()), produce, consume, overlap_);
}

std::vector<PieceAssembler::SpanRead> PieceAssembler::SpansOf(
    std::map<int, std::vector<ByteJob>>* jobs, int64_t slot_cap) const {
  // Block-aligned spans of each source piece, split into chunks the I/O threads can share,
  // read in batches of at most half of staging_cap_ bytes (two slots).
  const int64_t block = reader_.manifest().checksum_block_bytes();
  std::vector<SpanRead> spans;
  for (auto& [piece, list] : *jobs) {
    std::sort(list.begin(), list.end(),
              [](const ByteJob& a, const ByteJob& b) { return a.src < b.src; });
    const pb::StoredPiece& sp = reader_.manifest().pieces(piece);
    const int64_t len = sp.byte_length();
    const bool blocked = sp.block_xxh3_size() > 0 && block > 0;
    const int64_t chunk =
        blocked ? std::max(block, (std::min(kChunkBytes, slot_cap) / block) * block) : len;
    int64_t cur_b = -1, cur_e = -1;
    auto flush = [&]() {
      for (int64_t b = cur_b; b < cur_e; b += chunk) {
        spans.push_back({piece, b, std::min(cur_e, b + chunk)});
      }
    };
    for (const ByteJob& j : list) {
      int64_t b = blocked ? j.src / block * block : 0;
      int64_t e = blocked ? std::min(len, (j.src + j.bytes + block - 1) / block * block) : len;
      if (cur_e >= b) {
        cur_e = std::max(cur_e, e);
      } else {
        if (cur_b >= 0) flush();
        cur_b = b;
        cur_e = e;
      }
    }
    if (cur_b >= 0) flush();
  }
  return spans;
}

absl::Status PieceAssembler::ReadBatch(absl::Span<const SpanRead> spans, int slot,
                                       std::vector<PieceRead>* reads) {
  int64_t bytes = 0;
  for (const SpanRead& s : spans) bytes += s.end - s.begin;
  char* const staging = staging_[slot].Get(bytes);
  stats_.peak_staging_bytes = staging_[0].size() + staging_[1].size();
  stats_.staging_allocations = staging_[0].allocations() + staging_[1].allocations();
  reads->clear();
  int64_t pos = 0;
  for (const SpanRead& s : spans) {
    reads->push_back({s.piece, s.begin, s.end, staging + pos});
    pos += s.end - s.begin;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status read = reader_.ReadPieces(*reads);
  stats_.read_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!read.ok()) {
    return absl::Status(read.code(),
                        absl::StrCat("reading ", reader_.path(), ": ", read.message()));
  }
  stats_.bytes_read += bytes;
  return absl::OkStatus();
}

void PieceAssembler::CopyOut(absl::Span<const SpanRead> spans, const std::vector<PieceRead>& reads,
                             const std::map<int, std::vector<ByteJob>>& jobs) {
  for (size_t r = 0; r < spans.size(); ++r) {
    const SpanRead& s = spans[r];
    const char* base = static_cast<const char*>(reads[r].dest);
    const std::vector<ByteJob>& list = jobs.at(s.piece);
    // First job ending after s.begin (jobs are sorted by src and do not overlap).
    auto it = std::partition_point(list.begin(), list.end(),
                                   [&](const ByteJob& j) { return j.src + j.bytes <= s.begin; });
    for (; it != list.end() && it->src < s.end; ++it) {
      const int64_t b = std::max(it->src, s.begin);
      const int64_t e = std::min(it->src + it->bytes, s.end);
      std::memcpy(it->dst + (b - it->src), base + (b - s.begin), e - b);
    }
  }
}

}  // namespace ckpt
