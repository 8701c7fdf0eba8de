#include "tools/offline_reshard.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/reshard_plan.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"

namespace ckpt {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string PieceName(const PlannedPiece& p) {
  return absl::StrCat("tensor \"", p.key, "\" piece ", p.region.DebugString());
}

// One byte run to copy out of a source piece: source bytes [src, src + bytes) -> dst.
struct ByteJob {
  int64_t src = 0;
  int64_t bytes = 0;
  char* dst = nullptr;
};

// A block-aligned span of a source piece to read.
struct SpanRead {
  int piece = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// State of one reshard, shared by the waves.
class ReshardFiller {
 public:
  ReshardFiller(const CheckpointReader& reader, const std::vector<TensorPiece>& src,
                const std::vector<TensorPiece>& dst, const ReshardPlan& plan,
                std::map<const PlannedPiece*, int64_t> dst_index, int64_t staging_cap,
                OfflineReshardStats* stats)
      : reader_(reader),
        src_(src),
        dst_(dst),
        plan_(plan),
        dst_index_(std::move(dst_index)),
        staging_cap_(staging_cap),
        stats_(stats) {
    // Transfers are sorted by destination piece: index their ranges.
    for (size_t t = 0; t < plan_.transfers.size(); ++t) {
      auto& range = transfers_of_[plan_.transfers[t].dst_piece];
      if (range.second == 0) range.first = static_cast<int64_t>(t);
      range.second = static_cast<int64_t>(t) + 1;
    }
  }

  absl::Status Fill(absl::Span<const PlannedPiece* const> pieces, absl::Span<char* const> buffers) {
    // Byte jobs per source piece.
    std::map<int, std::vector<ByteJob>> jobs;
    for (size_t i = 0; i < pieces.size(); ++i) {
      auto it = dst_index_.find(pieces[i]);
      if (it == dst_index_.end()) {
        return absl::InternalError(absl::StrCat(PieceName(*pieces[i]), " is not in the plan"));
      }
      const int64_t j = it->second;
      const int64_t es = DTypeSize(dst_[j].dtype);
      int64_t covered = 0;
      auto range = transfers_of_.find(j);
      if (range != transfers_of_.end()) {
        for (int64_t t = range->second.first; t < range->second.second; ++t) {
          const ReshardTransfer& tr = plan_.transfers[t];
          CKPT_ASSIGN_OR_RETURN(std::vector<CopyRun> runs,
                                OverlapRunsOf(plan_, tr.overlap, src_, dst_));
          auto& list = jobs[static_cast<int>(tr.src_piece)];
          for (const CopyRun& r : runs) {
            list.push_back({r.src_offset * es, r.length * es, buffers[i] + r.dst_offset * es});
            covered += r.length;
          }
        }
      }
      if (covered != dst_[j].region.NumElements()) {
        return absl::InternalError(absl::StrCat(PieceName(*pieces[i]), ": the plan provides ",
                                                covered, " of ", dst_[j].region.NumElements(),
                                                " elements from the source checkpoint"));
      }
    }
    // Block-aligned spans of each source piece, split into chunks the I/O threads can share,
    // read in batches of at most staging_cap_ bytes.
    const int64_t block = reader_.manifest().checksum_block_bytes();
    std::vector<SpanRead> spans;
    for (auto& [piece, list] : jobs) {
      std::sort(list.begin(), list.end(),
                [](const ByteJob& a, const ByteJob& b) { return a.src < b.src; });
      const pb::StoredPiece& sp = reader_.manifest().pieces(piece);
      const int64_t len = sp.byte_length();
      const bool blocked = sp.block_xxh3_size() > 0 && block > 0;
      const int64_t chunk =
          blocked ? std::max(block, (std::min(kChunkBytes, staging_cap_) / block) * block) : len;
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
    size_t s = 0;
    while (s < spans.size()) {
      size_t e = s;
      int64_t bytes = 0;
      while (e < spans.size() &&
             (e == s || bytes + (spans[e].end - spans[e].begin) <= staging_cap_)) {
        bytes += spans[e].end - spans[e].begin;
        ++e;
      }
      CKPT_RETURN_IF_ERROR(ReadBatch(absl::MakeSpan(spans).subspan(s, e - s), bytes, jobs));
      s = e;
    }
    return absl::OkStatus();
  }

 private:
  static constexpr int64_t kChunkBytes = int64_t{16} << 20;

  absl::Status ReadBatch(absl::Span<const SpanRead> spans, int64_t bytes,
                         const std::map<int, std::vector<ByteJob>>& jobs) {
    if (staging_size_ < bytes) {
      staging_.reset();
      staging_.reset(new char[bytes]);
      staging_size_ = bytes;
    }
    std::vector<PieceRead> reads;
    int64_t pos = 0;
    for (const SpanRead& s : spans) {
      reads.push_back({s.piece, s.begin, s.end, staging_.get() + pos});
      pos += s.end - s.begin;
    }
    stats_->peak_staging_bytes = staging_size_;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status read = reader_.ReadPieces(reads);
    stats_->read_seconds += SecondsSince(t0);
    if (!read.ok()) {
      return absl::Status(read.code(),
                          absl::StrCat("reading ", reader_.path(), ": ", read.message()));
    }
    stats_->bytes_read += bytes;
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
    return absl::OkStatus();
  }

  const CheckpointReader& reader_;
  const std::vector<TensorPiece>& src_;
  const std::vector<TensorPiece>& dst_;
  const ReshardPlan& plan_;
  std::map<const PlannedPiece*, int64_t> dst_index_;
  std::map<int64_t, std::pair<int64_t, int64_t>> transfers_of_;
  int64_t staging_cap_;
  OfflineReshardStats* stats_;
  std::unique_ptr<char[]> staging_;  // reused by every batch
  int64_t staging_size_ = 0;
};

}  // namespace

absl::StatusOr<OfflineReshardStats> OfflineReshard(const std::string& src, const std::string& dst,
                                                   const LayoutSpec& layout,
                                                   const OfflineReshardOptions& options) {
  const auto t_start = std::chrono::steady_clock::now();
  if (options.memory_budget_bytes < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("memory budget of ", options.memory_budget_bytes,
                                                   " bytes is too small (at least 1 MiB)"));
  }
  if (!options.overwrite && PathExists(dst)) {
    return absl::AlreadyExistsError(
        absl::StrCat(dst, " already exists; pass the overwrite flag to replace it"));
  }
  ReaderOptions ropts;
  ropts.io = options.io;
  ropts.verify_checksums = options.verify_checksums;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(src, ropts));
  const pb::Manifest& manifest = reader->manifest();

  OfflineReshardStats stats;
  std::vector<TensorMeta> tensors;
  std::vector<TensorSpec> specs;
  for (const pb::TensorMeta& t : manifest.tensors()) {
    TensorMeta meta;
    meta.key = t.key();
    CKPT_ASSIGN_OR_RETURN(meta.dtype, DTypeFromProto(t.dtype()));
    meta.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
    specs.push_back({meta.key, meta.dtype, meta.global_shape});
    tensors.push_back(std::move(meta));
  }
  stats.tensors = static_cast<int64_t>(tensors.size());
  std::map<std::string, const TensorMeta*> by_key;
  for (const TensorMeta& t : tensors) by_key[t.key] = &t;

  // Source pieces: the stored pieces, each a main replica of its writer.
  std::vector<TensorPiece> src_pieces;
  for (const pb::StoredPiece& p : manifest.pieces()) {
    const TensorMeta* t = by_key.at(p.key());  // Open validated the manifest
    Region region;                             // the manifest was validated by Open
    region.offsets.assign(p.region().offsets().begin(), p.region().offsets().end());
    region.lengths.assign(p.region().lengths().begin(), p.region().lengths().end());
    if (p.region().has_flat())
      region.flat = FlatRange{p.region().flat().start(), p.region().flat().stop()};
    src_pieces.push_back(
        TensorPiece{p.key(), p.writer_rank(), t->dtype, t->global_shape, region, {}});
  }
  stats.src_pieces = static_cast<int64_t>(src_pieces.size());

  // Destination: the layout's pieces, one writer per distinct piece (save plan).
  absl::StatusOr<std::vector<TensorPiece>> layout_pieces =
      layout.AllPieces(tensors, /*drop_empty=*/true);
  if (!layout_pieces.ok()) {
    return absl::Status(layout_pieces.status().code(),
                        absl::StrCat("target layout: ", layout_pieces.status().message()));
  }
  // Budget: one share per destination wave in memory (two when overlapped) plus one for
  // source staging.
  const int64_t share = options.memory_budget_bytes / (options.overlap ? 3 : 2);
  SavePlanOptions sp_options;  // its file packing is replaced by RepackForWaves below
  absl::StatusOr<SavePlan> save_plan =
      BuildSavePlan(*layout_pieces, layout.world_size(), sp_options);
  if (!save_plan.ok()) {
    return absl::Status(save_plan.status().code(),
                        absl::StrCat("target layout: ", save_plan.status().message()));
  }
  absl::StatusOr<int64_t> waves = RepackForWaves(&*save_plan, share);
  if (!waves.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory budget of ", options.memory_budget_bytes,
        " bytes is too small: ", waves.status().message(), "; use a budget of at least ",
        options.memory_budget_bytes / share, " times that piece"));
  }
  std::vector<TensorPiece> dst_pieces;
  std::map<const PlannedPiece*, int64_t> dst_index;
  for (const WriterPlan& w : save_plan->writers) {
    for (const PlannedFile& f : w.files) {
      for (const PlannedPiece& p : f.pieces) {
        dst_index[&p] = static_cast<int64_t>(dst_pieces.size());
        dst_pieces.push_back(TensorPiece{p.key, w.rank, p.dtype, p.global_shape, p.region, {}});
      }
    }
  }
  stats.dst_pieces = static_cast<int64_t>(dst_pieces.size());
  ReshardPlanOptions rp_options;
  rp_options.prefer_local = false;
  absl::StatusOr<ReshardPlan> plan = PlanReshard(src_pieces, dst_pieces, rp_options);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("planning the reshard of ", src, ": ",
                                                           plan.status().message()));
  }
  stats.plan_seconds = SecondsSince(t_start);

  CheckpointContents info;
  CKPT_ASSIGN_OR_RETURN(info.saved_layout, layout.ToSavedLayout(tensors));
  info.step = manifest.step();
  info.user_metadata.insert(manifest.user_metadata().begin(), manifest.user_metadata().end());

  ReshardFiller filler(*reader, src_pieces, dst_pieces, *plan, std::move(dst_index), share, &stats);
  WriteOptions wopts;
  wopts.io = options.io;
  wopts.overwrite = options.overwrite;
  wopts.checksum_block_bytes = manifest.checksum_block_bytes() > 0 ? manifest.checksum_block_bytes()
                                                                   : kDefaultChecksumBlockBytes;
  WaveOptions wave;
  wave.wave_bytes = share;
  wave.overlap = options.overlap;
  wave.progress = options.progress;
  CKPT_ASSIGN_OR_RETURN(stats.write, WriteCheckpointInWaves(
                                         dst, specs, *save_plan, info,
                                         [&](absl::Span<const PlannedPiece* const> pieces,
                                             absl::Span<char* const> buffers) {
                                           return filler.Fill(pieces, buffers);
                                         },
                                         wave, wopts));
  return stats;
}

}  // namespace ckpt
