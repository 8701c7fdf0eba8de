#include "reshard/wave_writer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/piece_id.h"
#include "storage/file_util.h"
#include "storage/stage_pipeline.h"

namespace ckpt {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A file of the save plan and where it goes.
struct FileRef {
  int64_t writer = 0;  // rank
  int64_t index = 0;   // position among the writer's files (its name's index)
  const PlannedFile* file = nullptr;
};

}  // namespace

absl::StatusOr<int64_t> RepackForWaves(SavePlan* plan, int64_t wave_bytes) {
  struct Item {
    PlannedPiece piece;
    size_t writer = 0;  // index into plan->writers
  };
  std::vector<Item> items;
  for (size_t w = 0; w < plan->writers.size(); ++w) {
    for (PlannedFile& f : plan->writers[w].files) {
      for (PlannedPiece& p : f.pieces) {
        if (p.size_bytes > wave_bytes) {
          return absl::ResourceExhaustedError(
              absl::StrCat("tensor \"", p.key, "\" piece ", p.region.DebugString(), " (rank ",
                           plan->writers[w].rank, ") has ", p.size_bytes,
                           " bytes, more than a wave of ", wave_bytes));
        }
        items.push_back({std::move(p), w});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return PieceIdLess()(PieceId{a.piece.key, a.piece.region.offsets, a.piece.region.flat},
                         PieceId{b.piece.key, b.piece.region.offsets, b.piece.region.flat});
  });
  for (WriterPlan& w : plan->writers) w.files.clear();
  int64_t waves = 0, in_wave = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i == 0 || in_wave + items[i].piece.size_bytes > wave_bytes) {
      ++waves;
      in_wave = 0;
      for (WriterPlan& w : plan->writers) {
        PlannedFile f;
        f.path = absl::StrCat("data/r", w.rank, "_", waves - 1, ".safetensors");
        w.files.push_back(std::move(f));
      }
    }
    in_wave += items[i].piece.size_bytes;
    PlannedFile& f = plan->writers[items[i].writer].files.back();
    f.total_bytes += items[i].piece.size_bytes;
    f.pieces.push_back(std::move(items[i].piece));
  }
  return waves;
}

namespace {

// The plan's non-empty files in the order of their first piece's shard id, so that a wave
// covers neighbouring tensors (and a reshard reads each source piece in as few waves as
// possible). Adds their bytes to *total.
std::vector<FileRef> OrderFiles(const SavePlan& plan, int64_t* total) {
  std::vector<FileRef> files;
  for (const WriterPlan& w : plan.writers) {
    for (size_t i = 0; i < w.files.size(); ++i) {
      if (w.files[i].pieces.empty()) continue;
      files.push_back({w.rank, static_cast<int64_t>(i), &w.files[i]});
      *total += w.files[i].total_bytes;
    }
  }
  auto first_id = [](const FileRef& f) {
    const PlannedPiece& p = f.file->pieces.front();
    return PieceId{p.key, p.region.offsets, p.region.flat};
  };
  std::stable_sort(files.begin(), files.end(), [&](const FileRef& a, const FileRef& b) {
    return PieceIdLess()(first_id(a), first_id(b));
  });
  return files;
}

// Cuts the ordered files into waves [begin, end): consecutive files up to wave_bytes (a larger
// file forms a wave of its own).
std::vector<std::pair<size_t, size_t>> CutWaves(const std::vector<FileRef>& files,
                                                int64_t wave_bytes) {
  std::vector<std::pair<size_t, size_t>> waves;
  for (size_t begin = 0; begin < files.size();) {
    size_t end = begin;
    int64_t bytes = 0;
    while (end < files.size() &&
           (end == begin || bytes + files[end].file->total_bytes <= wave_bytes)) {
      bytes += files[end++].file->total_bytes;
    }
    waves.emplace_back(begin, end);
    begin = end;
  }
  return waves;
}

// One wave's files, each with where its piece bytes start in the arena.
using FilledWave = std::vector<std::pair<const FileRef*, char*>>;

// Writes one filled wave: one WriteDataFiles call per file index (distinct writers, so the
// plan's names r<writer>_<index> are kept), files of a call written in parallel. Appends the
// records to *written and the piece bytes to *written_bytes.
absl::Status WriteWave(const std::string& staging, const std::vector<TensorMeta>& tensors,
                       const WriteOptions& options, FilledWave wave, WrittenData* written,
                       int64_t* written_bytes) {
  std::stable_sort(wave.begin(), wave.end(), [](const auto& a, const auto& b) {
    return a.first->index != b.first->index ? a.first->index < b.first->index
                                            : a.first->writer < b.first->writer;
  });
  for (size_t f = 0; f < wave.size();) {
    const int64_t index = wave[f].first->index;
    std::vector<DataFilePlan> group;
    for (; f < wave.size() && wave[f].first->index == index; ++f) {
      DataFilePlan dfp;
      dfp.writer_rank = static_cast<int>(wave[f].first->writer);
      char* data = wave[f].second;
      for (const PlannedPiece& p : wave[f].first->file->pieces) {
        PieceData piece;
        piece.key = p.key;
        piece.region = p.region;
        piece.data = data;
        piece.size_bytes = p.size_bytes;
        dfp.pieces.push_back(std::move(piece));
        data += p.size_bytes;
        *written_bytes += p.size_bytes;
      }
      group.push_back(std::move(dfp));
    }
    CKPT_ASSIGN_OR_RETURN(WrittenData data, WriteDataFiles(staging, tensors, group,
                                                           static_cast<int>(index), options));
    for (auto& p : data.pieces) written->pieces.push_back(std::move(p));
    for (auto& df : data.files) written->files.push_back(std::move(df));
  }
  return absl::OkStatus();
}

// Lays the files [begin, end) out back to back in `arena`: each piece's buffer (for the fill)
// and each file's start (for the write). Internal when a file's pieces disagree with its size.
absl::Status LayOutWave(const std::vector<FileRef>& files, size_t begin, size_t end, char* arena,
                        std::vector<const PlannedPiece*>* pieces, std::vector<char*>* buffers,
                        FilledWave* wave) {
  int64_t pos = 0;
  for (size_t f = begin; f < end; ++f) {
    wave->emplace_back(&files[f], arena + pos);
    const int64_t file_start = pos;
    for (const PlannedPiece& p : files[f].file->pieces) {
      pieces->push_back(&p);
      buffers->push_back(arena + pos);
      pos += p.size_bytes;
    }
    if (pos - file_start != files[f].file->total_bytes) {
      return absl::InternalError(absl::StrCat("save plan file ", files[f].file->path, " declares ",
                                              files[f].file->total_bytes,
                                              " bytes but its pieces hold ", pos - file_start));
    }
  }
  return absl::OkStatus();
}

// Bytes of the largest wave: each arena is allocated once at this size and reused, so only
// the first two waves fault fresh memory in.
int64_t LargestWave(const std::vector<FileRef>& files,
                    const std::vector<std::pair<size_t, size_t>>& waves) {
  int64_t largest = 1;
  for (const auto& [begin, end] : waves) {
    int64_t bytes = 0;
    for (size_t f = begin; f < end; ++f) bytes += files[f].file->total_bytes;
    largest = std::max(largest, bytes);
  }
  return largest;
}

}  // namespace

absl::StatusOr<WrittenData> WriteFilesInWaves(const std::string& staging,
                                              const std::vector<TensorMeta>& tensors,
                                              const SavePlan& plan, const WaveFill& fill,
                                              const WaveOptions& wave_options,
                                              const WriteOptions& options,
                                              WaveWriteStats* stats_out) {
  int64_t total = 0;
  const std::vector<FileRef> files = OrderFiles(plan, &total);
  const std::vector<std::pair<size_t, size_t>> waves = CutWaves(files, wave_options.wave_bytes);

  WaveWriteStats& stats = *stats_out;
  stats = WaveWriteStats();
  stats.waves = static_cast<int64_t>(waves.size());
  WrittenData written;
  int64_t written_bytes = 0;  // touched by the writing task only, read after it is joined
  auto write_wave = [&](FilledWave wave) -> absl::Status {
    const auto t0 = std::chrono::steady_clock::now();
    CKPT_RETURN_IF_ERROR(
        WriteWave(staging, tensors, options, std::move(wave), &written, &written_bytes));
    stats.write_seconds += SecondsSince(t0);
    return absl::OkStatus();
  };

  // Two arenas, reused: wave k is filled into one while wave k - 1 is written from the other.
  ReusedBuffer arenas[2];
  const int64_t largest = LargestWave(files, waves);
  std::future<absl::Status> writing;
  int64_t done = 0, pending = 0;
  auto join = [&]() -> absl::Status {
    if (!writing.valid()) return absl::OkStatus();
    absl::Status s = writing.get();
    done += pending;
    pending = 0;
    return s;
  };
  auto fail = [&](absl::Status s) {
    (void)join();
    return s;
  };
  for (size_t w = 0; w < waves.size(); ++w) {
    const auto [begin, end] = waves[w];
    int64_t wave_total = 0;
    for (size_t f = begin; f < end; ++f) wave_total += files[f].file->total_bytes;
    const int a = wave_options.overlap ? static_cast<int>(w % 2) : 0;
    std::vector<const PlannedPiece*> pieces;
    std::vector<char*> buffers;
    FilledWave wave;
    absl::Status laid_out =
        LayOutWave(files, begin, end, arenas[a].Get(largest), &pieces, &buffers, &wave);
    if (!laid_out.ok()) return fail(laid_out);
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status filled = fill(pieces, buffers);
    stats.fill_seconds += SecondsSince(t0);
    if (!filled.ok()) return fail(filled);
    absl::Status previous = join();
    if (!previous.ok()) return fail(previous);
    if (wave_options.progress && w > 0) {
      wave_options.progress({static_cast<int64_t>(w), stats.waves, done, total});
    }
    pending = wave_total;
    writing = std::async(std::launch::async, write_wave, std::move(wave));
    if (!wave_options.overlap) {
      absl::Status s = join();
      if (!s.ok()) return fail(s);
    }
  }
  absl::Status last = join();
  if (!last.ok()) return fail(last);
  if (wave_options.progress && !waves.empty()) {
    wave_options.progress({stats.waves, stats.waves, done, total});
  }
  stats.files = static_cast<int64_t>(written.files.size());
  stats.pieces = static_cast<int64_t>(written.pieces.size());
  stats.bytes_written = written_bytes;
  stats.peak_wave_bytes = arenas[0].size() + arenas[1].size();
  stats.arena_allocations = arenas[0].allocations() + arenas[1].allocations();
  return written;
}

absl::StatusOr<WaveWriteStats> WriteCheckpointInWaves(
    const std::string& path, const std::vector<TensorMeta>& tensors, const SavePlan& plan,
    const CheckpointContents& info, const WaveFill& fill, const WaveOptions& wave_options,
    const WriteOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(path, options.overwrite));
  WaveWriteStats stats;
  absl::StatusOr<WrittenData> written =
      WriteFilesInWaves(staging, tensors, plan, fill, wave_options, options, &stats);
  if (!written.ok()) {
    (void)RemoveTree(staging);
    return written.status();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const pb::Manifest manifest =
      BuildManifest(tensors, *written, info, options.checksum_block_bytes);
  absl::Status committed = CommitCheckpoint(staging, path, manifest, options);
  if (!committed.ok()) {
    (void)RemoveTree(staging);
    return committed;
  }
  stats.commit_seconds = SecondsSince(t0);
  return stats;
}

}  // namespace ckpt
