#include "storage/interop.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_reader.h"
#include "storage/data_file_stream.h"
#include "storage/export_transform.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

using Json = nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
// Most pieces an imported data file holds (a source file with more is split).
constexpr size_t kMaxEntriesPerDataFile = 65536;

absl::StatusOr<SafetensorsHeader> ReadHeader(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(int64_t size, FileSize(path));
  CKPT_ASSIGN_OR_RETURN(std::string prefix, ReadFileRange(path, 0, std::min<int64_t>(8, size)));
  CKPT_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsPrefix(prefix, size, path));
  CKPT_ASSIGN_OR_RETURN(std::string json, ReadFileRange(path, 8, static_cast<int64_t>(n)));
  return ParseSafetensorsHeader(json, size, path);
}

absl::StatusOr<std::vector<std::string>> FilesFromIndex(const std::string& index_path) {
  CKPT_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(index_path, int64_t{1} << 30));
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, " is not a safetensors index (no \"weight_map\" object)"));
  }
  const std::string dir = ParentDir(index_path);
  std::map<std::string, std::set<std::string>> keys_by_file;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry \"", it.key(), "\" is not a file name"));
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file[0] == '.' || absl::StrContains(file, "/") ||
        !absl::EndsWith(file, ".safetensors")) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map names \"", file,
                       "\"; only plain .safetensors file names next to the index are accepted"));
    }
    keys_by_file[file].insert(it.key());
  }
  std::vector<std::string> files;
  for (const auto& [file, keys] : keys_by_file) {
    const std::string path = JoinPath(dir, file);
    CKPT_ASSIGN_OR_RETURN(SafetensorsHeader h, ReadHeader(path));
    std::set<std::string> present;
    for (const auto& e : h.entries) present.insert(e.name);
    if (present != keys) {
      for (const std::string& k : keys) {
        if (!present.count(k)) {
          return absl::DataLossError(absl::StrCat(index_path, " maps tensor \"", k, "\" to ", file,
                                                  ", which does not contain it"));
        }
      }
      for (const std::string& k : present) {
        if (!keys.count(k)) {
          return absl::DataLossError(absl::StrCat(path, " holds tensor \"", k, "\", which ",
                                                  index_path, " does not map to it"));
        }
      }
    }
    files.push_back(path);
  }
  return files;
}

std::string HumanSizeFileName(int i, int n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", i, n);
}

absl::Status PwriteAll(int fd, const char* data, int64_t n, int64_t offset,
                       const std::string& path) {
  int64_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd, data + done, static_cast<size_t>(std::min<int64_t>(n - done, 1 << 30)),
                         offset + done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    done += w;
  }
  return absl::OkStatus();
}

// A fresh temporary name next to `path` (".<name>.tmp-<pid>-<n>"): hidden, so it never looks
// like an export's output, and created with O_EXCL | O_NOFOLLOW so it never opens something
// already there (a file or a planted link).
absl::StatusOr<std::pair<std::string, int>> CreateTempSibling(const std::string& path) {
  static std::atomic<int> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string tmp = JoinPath(
        ParentDir(path), absl::StrCat(".", BaseName(path), ".tmp-", ::getpid(), "-", counter++));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return std::make_pair(tmp, fd);
    if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
  }
  return absl::AlreadyExistsError(absl::StrCat("no free temporary name next to ", path));
}

// Writes a file atomically: a fresh temporary sibling filled by `write(fd, tmp)`, fsynced and
// renamed over `path` (which the caller checked is absent or a regular file export may
// replace), then the directory is fsynced.
absl::Status WriteAtomically(const std::string& path,
                             const std::function<absl::Status(int, const std::string&)>& write) {
  CKPT_ASSIGN_OR_RETURN(auto created, CreateTempSibling(path));
  const auto& [tmp, fd] = created;
  absl::Status s = write(fd, tmp);
  if (s.ok()) s = FsyncFd(fd, tmp);
  ::close(fd);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  return FsyncDir(ParentDir(path));
}

// Consecutive entries [first, last) of a file that an export fills at once: up to
// `batch_bytes` (or one larger entry), so many small tensors cost one batch of reads rather
// than one each.
std::vector<std::pair<size_t, size_t>> CutBatches(const std::vector<SafetensorsEntry>& entries,
                                                  int64_t batch_bytes) {
  std::vector<std::pair<size_t, size_t>> batches;
  for (size_t first = 0; first < entries.size();) {
    size_t last = first + 1;
    while (last < entries.size() && entries[last].end - entries[first].begin <= batch_bytes) {
      ++last;
    }
    batches.emplace_back(first, last);
    first = last;
  }
  return batches;
}

// Writes one safetensors file atomically, holding at most two batches of entries in memory:
// `fill(first, last, buf)` produces entries [first, last) back to back (they are
// contiguous in the file) into one of the two `buffers` (grown to the largest batch, reused
// by the caller's next file), while the previous batch is written from the other
// (RunStagePipeline).
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<SafetensorsEntry>& entries,
                                  const std::map<std::string, std::string>& metadata,
                                  int64_t batch_bytes, bool overlap, ReusedBuffer buffers[2],
                                  const std::function<absl::Status(size_t, size_t, char*)>& fill,
                                  PipelineStats* stats) {
  CKPT_ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(entries, metadata));
  const std::vector<std::pair<size_t, size_t>> batches = CutBatches(entries, batch_bytes);
  if (stats != nullptr) stats->steps += static_cast<int64_t>(batches.size());
  auto batch_size = [&](size_t b) {
    return entries[batches[b].second - 1].end - entries[batches[b].first].begin;
  };
  int64_t largest = 1;
  for (size_t b = 0; b < batches.size(); ++b) largest = std::max(largest, batch_size(b));
  ReusedBuffer* slots = buffers;
  return WriteAtomically(path, [&](int fd, const std::string& tmp) -> absl::Status {
    CKPT_RETURN_IF_ERROR(PwriteAll(fd, header.data(), static_cast<int64_t>(header.size()), 0, tmp));
    const int64_t data_start = static_cast<int64_t>(header.size());
    auto produce = [&](int64_t b, int slot) -> absl::Status {
      return fill(batches[b].first, batches[b].second, slots[slot].Get(largest));
    };
    auto consume = [&](int64_t b, int slot) -> absl::Status {
      return PwriteAll(fd, slots[slot].data(), batch_size(b),
                       data_start + entries[batches[b].first].begin, tmp);
    };
    return RunStagePipeline(static_cast<int64_t>(batches.size()), produce, consume, overlap);
  });
}

// True for the names an export writes into a directory: model.safetensors,
// model-<i>-of-<n>.safetensors (5 or more digits each) and model.safetensors.index.json.
bool IsExportFileName(absl::string_view name) {
  if (name == "model.safetensors" || name == kIndexName) return true;
  auto digits = [&name]() {
    size_t n = 0;
    while (n < name.size() && absl::ascii_isdigit(static_cast<unsigned char>(name[n]))) ++n;
    name.remove_prefix(n);
    return n >= 5;
  };
  return absl::ConsumePrefix(&name, "model-") && digits() && absl::ConsumePrefix(&name, "-of-") &&
         digits() && name == ".safetensors";
}

// Refuses to replace `path` unless it is absent or a regular file (never a directory, a link
// or a device), and refuses any existing file without `overwrite`.
absl::Status CheckExportTarget(const std::string& path, bool overwrite, absl::string_view why) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to overwrite ", path, ": it is ",
        S_ISDIR(st.st_mode) ? "a directory"
                            : (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file"),
        "; export replaces only regular files it writes"));
  }
  if (!overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(path, " already exists", why, "; pass --overwrite to replace it"));
  }
  return absl::OkStatus();
}

// The export-named files already in the output directory `dir` (see IsExportFileName), each
// checked with CheckExportTarget: without `overwrite` any of them is AlreadyExists, so an
// export never mixes with an earlier one.
absl::StatusOr<std::vector<std::string>> ExistingExportFiles(const std::string& dir,
                                                             bool overwrite) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir));
  std::vector<std::string> found;
  for (const std::string& n : names) {
    if (!IsExportFileName(n)) continue;
    const std::string path = JoinPath(dir, n);
    CKPT_RETURN_IF_ERROR(CheckExportTarget(path, overwrite, " (from an earlier export)"));
    found.push_back(path);
  }
  return found;
}

// Removes the files of an earlier export that this one did not rewrite (e.g. shards
// model-00003-of-00003 when there are now two), so the directory holds one consistent export.
// Only regular files with export names are touched.
absl::Status RemoveStaleExportFiles(const std::vector<std::string>& earlier,
                                    const std::vector<std::string>& written) {
  const std::set<std::string> now(written.begin(), written.end());
  for (const std::string& path : earlier) {
    struct stat st;
    if (now.count(path) || ::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("unlink ", path));
  }
  return earlier.empty() ? absl::OkStatus() : FsyncDir(ParentDir(earlier.front()));
}

// Adds what `buffers` did to *stats (when not null).
void RecordBuffers(std::initializer_list<const ReusedBuffer*> buffers, int64_t steps,
                   PipelineStats* stats) {
  if (stats == nullptr) return;
  stats->steps += steps;
  for (const ReusedBuffer* b : buffers) {
    stats->buffer_allocations += b->allocations();
    stats->peak_buffer_bytes += b->size();
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveImportSource(const std::string& source) {
  if (IsDirectory(source)) {
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(source));
    std::vector<std::string> files;
    for (const std::string& n : names) {
      if (absl::EndsWith(n, ".safetensors") && n[0] != '.') files.push_back(JoinPath(source, n));
    }
    if (files.empty()) {
      return absl::NotFoundError(absl::StrCat("no .safetensors files in ", source));
    }
    return files;
  }
  if (!PathExists(source)) return absl::NotFoundError(absl::StrCat(source, " does not exist"));
  if (absl::EndsWith(source, ".json")) return FilesFromIndex(source);
  return std::vector<std::string>{source};
}

namespace {

// One source file's entries as data-file plans (pieces' data streamed in later): at most
// kMaxEntriesPerDataFile pieces each, so every header stays small; an empty source file gives
// one empty data file.
std::vector<DataFilePlan> ImportPlans(const SafetensorsHeader& h) {
  std::vector<DataFilePlan> plans;
  for (const SafetensorsEntry& e : h.entries) {
    if (plans.empty() || plans.back().pieces.size() == kMaxEntriesPerDataFile) {
      plans.emplace_back();
    }
    PieceData piece;  // its bytes are streamed in (ImportFile)
    piece.key = e.name;
    piece.region = WholeRegion(e.shape);
    piece.size_bytes = e.end - e.begin;
    plans.back().pieces.push_back(std::move(piece));
  }
  if (plans.empty()) plans.emplace_back();
  return plans;
}

// Copies one source file's data section into data files first_index.. of `staging` as a
// pipeline: chunk k + 1 of the section is read into one of two reused buffers (at most
// options.memory_budget_bytes / 2 each) while chunk k is appended to the data files'
// streams, which hash it and write it at its place. The files' bytes and records are those
// WriteDataFiles would give for the whole file in memory.
absl::Status ImportFile(const std::string& file, const SafetensorsHeader& h,
                        const std::vector<TensorMeta>& tensors, const std::string& staging,
                        int first_index, const ImportOptions& options, ReusedBuffer slots[2],
                        WrittenData* all) {
  const std::vector<DataFilePlan> plans = ImportPlans(h);
  std::vector<std::unique_ptr<DataFileStream>> streams;
  for (size_t p = 0; p < plans.size(); ++p) {
    CKPT_ASSIGN_OR_RETURN(
        std::unique_ptr<DataFileStream> stream,
        DataFileStream::Create(staging, tensors, plans[p], first_index + static_cast<int>(p),
                               options.write.checksum_block_bytes));
    streams.push_back(std::move(stream));
  }
  const int64_t chunk = std::max<int64_t>(4096, options.memory_budget_bytes / 2 / 4096 * 4096);
  const int64_t chunks = (h.data_bytes + chunk - 1) / chunk;
  size_t next_entry = 0;  // first entry not wholly appended yet (entries sorted by begin)
  auto produce = [&](int64_t k, int slot) -> absl::Status {
    const int64_t n = std::min(chunk, h.data_bytes - k * chunk);
    return ReadRanges({{file, h.data_start + k * chunk, n, slots[slot].Get(n), false, 0, {}, file}},
                      options.write.io);
  };
  auto consume = [&](int64_t k, int slot) -> absl::Status {
    const int64_t begin = k * chunk, end = std::min(begin + chunk, h.data_bytes);
    for (size_t e = next_entry; e < h.entries.size() && h.entries[e].begin < end; ++e) {
      const SafetensorsEntry& entry = h.entries[e];
      const int64_t b = std::max(entry.begin, begin), stop = std::min(entry.end, end);
      if (stop > b) {
        CKPT_RETURN_IF_ERROR(streams[e / kMaxEntriesPerDataFile]->Append(
            static_cast<int>(e % kMaxEntriesPerDataFile), slots[slot].data() + (b - begin),
            stop - b));
      }
      if (entry.end <= end) next_entry = e + 1;
    }
    return absl::OkStatus();
  };
  CKPT_RETURN_IF_ERROR(RunStagePipeline(chunks, produce, consume, options.overlap));
  if (options.stats != nullptr) options.stats->steps += chunks;
  for (std::unique_ptr<DataFileStream>& stream : streams) {
    CKPT_ASSIGN_OR_RETURN(WrittenData written, stream->Finish());
    for (auto& p : written.pieces) all->pieces.push_back(std::move(p));
    for (auto& f : written.files) all->files.push_back(std::move(f));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<pb::Manifest> ImportSafetensors(const std::string& source, const std::string& ckpt,
                                               const WriteOptions& options) {
  ImportOptions io;
  io.write = options;
  return ImportSafetensors(source, ckpt, io);
}

absl::StatusOr<pb::Manifest> ImportSafetensors(const std::string& source, const std::string& ckpt,
                                               const ImportOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> files, ResolveImportSource(source));
  // Headers first: all tensors must be known (and unique) before anything is written.
  std::vector<SafetensorsHeader> headers(files.size());
  std::vector<TensorMeta> tensors;
  absl::flat_hash_map<absl::string_view, size_t> owner;  // key (viewing headers) -> file index
  CheckpointContents info;
  for (size_t f = 0; f < files.size(); ++f) {
    CKPT_ASSIGN_OR_RETURN(headers[f], ReadHeader(files[f]));
    for (const SafetensorsEntry& e : headers[f].entries) {
      auto [it, fresh] = owner.emplace(e.name, f);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", e.name, "\" is in both ",
                                                       files[it->second], " and ", files[f]));
      }
      tensors.push_back({e.name, e.dtype, e.shape});
    }
    for (const auto& [k, v] : headers[f].metadata) info.user_metadata.emplace(k, v);
  }
  info.user_metadata["imported_from"] = source;
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorMeta& a, const TensorMeta& b) { return a.key < b.key; });

  CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(ckpt, options.write.overwrite));
  WrittenData all;
  absl::Status s;
  int next_file = 0;
  ReusedBuffer slots[2];  // reused by every chunk of every file
  // One source file at a time, streamed through two bounded buffers.
  for (size_t i = 0; i < files.size() && s.ok(); ++i) {
    s = ImportFile(files[i], headers[i], tensors, staging, next_file, options, slots, &all);
    next_file += static_cast<int>(ImportPlans(headers[i]).size());
  }
  RecordBuffers({&slots[0], &slots[1]}, 0, options.stats);
  pb::Manifest manifest;
  if (s.ok()) {
    manifest = BuildManifest(tensors, all, info, options.write.checksum_block_bytes);
    s = CommitCheckpoint(staging, ckpt, manifest, options.write);
  }
  if (!s.ok()) {
    RemoveTree(staging).IgnoreError();
    return s;
  }
  return manifest;
}

namespace {

// One tensor of an export and how it is grouped into files.
struct ExportItem {
  std::string key;  // the exported name
  DType dtype;      // the exported dtype
  std::vector<int64_t> shape;
  int64_t bytes;           // exported bytes
  std::string source_key;  // the checkpoint's key
  DType source_dtype;      // the checkpoint's dtype
};

absl::StatusOr<std::vector<ExportItem>> ExportItems(const pb::Manifest& m,
                                                    const ExportOptions& options) {
  std::vector<std::string> keys;
  for (const pb::TensorMeta& t : m.tensors()) keys.push_back(t.key());
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, RenameKeys(keys, options.rename));
  std::vector<ExportItem> items;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const pb::TensorMeta& t = m.tensors(i);
    CKPT_ASSIGN_OR_RETURN(DType d, DTypeFromProto(t.dtype()));
    std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
    CKPT_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(shape));
    if (!IsValidUtf8(names[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor key \"", names[i], "\" is not valid UTF-8 and cannot be a safetensors name"));
    }
    const DType out = ExportedDType(d, options.float_dtype);
    items.push_back({names[i], out, shape, n * DTypeSize(out), t.key(), d});
  }
  std::sort(items.begin(), items.end(),
            [](const ExportItem& a, const ExportItem& b) { return a.key < b.key; });
  return items;
}

// Fills entries [first, last) of one file's group (back to back in `buf`): one batch of
// region reads, into `buf` directly or, for converted tensors, into `scratch` then converted.
absl::Status FillExportBatch(const CheckpointReader& reader, const std::vector<ExportItem>& items,
                             const std::vector<size_t>& group,
                             const std::vector<SafetensorsEntry>& entries, size_t first,
                             size_t last, char* buf, ReusedBuffer* scratch) {
  int64_t scratch_bytes = 0;
  for (size_t e = first; e < last; ++e) {
    const ExportItem& it = items[group[e]];
    if (it.dtype != it.source_dtype) {
      scratch_bytes += it.bytes / DTypeSize(it.dtype) * DTypeSize(it.source_dtype);
    }
  }
  char* const scratch_base = scratch->Get(std::max<int64_t>(1, scratch_bytes));
  std::vector<CheckpointReader::RegionRead> batch;
  std::vector<std::pair<size_t, char*>> converted;  // entry, its source bytes in scratch
  int64_t used = 0;
  for (size_t e = first; e < last; ++e) {
    const ExportItem& it = items[group[e]];
    char* out = buf + (entries[e].begin - entries[first].begin);
    if (it.dtype != it.source_dtype) {
      char* source = scratch_base + used;
      used += it.bytes / DTypeSize(it.dtype) * DTypeSize(it.source_dtype);
      converted.emplace_back(e, source);
      out = source;
    }
    batch.push_back({it.source_key, WholeRegion(it.shape), out});
  }
  CKPT_RETURN_IF_ERROR(reader.ReadRegions(batch));
  for (const auto& [e, source] : converted) {
    const ExportItem& it = items[group[e]];
    ConvertFloats(it.source_dtype, it.dtype, source,
                  buf + (entries[e].begin - entries[first].begin), it.bytes / DTypeSize(it.dtype));
  }
  return absl::OkStatus();
}

// Groups items (in key order) into files of at most max_file_bytes (0: one file).
std::vector<std::vector<size_t>> GroupIntoFiles(const std::vector<ExportItem>& items,
                                                int64_t max_file_bytes) {
  std::vector<std::vector<size_t>> groups(1);
  int64_t in_group = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (max_file_bytes > 0 && !groups.back().empty() &&
        in_group + items[i].bytes > max_file_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += items[i].bytes;
  }
  return groups;
}

// Where an export goes: its data file paths, and the export files already in the output
// directory (checked replaceable), which the export removes once its own are written.
struct ExportTargets {
  std::vector<std::string> paths;
  std::vector<std::string> earlier;
};

absl::StatusOr<ExportTargets> PrepareExportTargets(const std::string& out, size_t num_files,
                                                   const ExportOptions& options) {
  ExportTargets t;
  if (absl::EndsWith(out, ".safetensors")) {
    if (num_files > 1) {
      return absl::InvalidArgumentError(absl::StrCat("the tensors need ", num_files,
                                                     " files of at most ", options.max_file_bytes,
                                                     " bytes; give a directory instead of ", out));
    }
    CKPT_RETURN_IF_ERROR(CheckExportTarget(out, options.overwrite, ""));
    t.paths.push_back(out);
    return t;
  }
  if (PathExists(out) && !IsDirectory(out)) {
    return absl::FailedPreconditionError(
        absl::StrCat(out,
                     " exists and is not a directory; export writes a directory there "
                     "(or give a path ending in .safetensors for one file)"));
  }
  CKPT_RETURN_IF_ERROR(MakeDir(out, /*exist_ok=*/true));
  CKPT_ASSIGN_OR_RETURN(t.earlier, ExistingExportFiles(out, options.overwrite));
  if (num_files == 1) {
    t.paths.push_back(JoinPath(out, "model.safetensors"));
  } else {
    for (size_t g = 0; g < num_files; ++g) {
      t.paths.push_back(
          JoinPath(out, HumanSizeFileName(static_cast<int>(g + 1), static_cast<int>(num_files))));
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExportCheckpoint(const std::string& ckpt,
                                                          const std::string& out,
                                                          const ExportOptions& options) {
  ReaderOptions ro;
  ro.io = options.io;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(ckpt, ro));
  const pb::Manifest& m = reader->manifest();
  CKPT_ASSIGN_OR_RETURN(std::vector<ExportItem> items, ExportItems(m, options));
  const std::vector<std::vector<size_t>> groups = GroupIntoFiles(items, options.max_file_bytes);
  CKPT_ASSIGN_OR_RETURN(ExportTargets targets, PrepareExportTargets(out, groups.size(), options));
  std::vector<std::string> paths = targets.paths;
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"ckpt_step", absl::StrCat(m.step())}};
  Json weight_map = Json::object();
  int64_t total = 0;
  const int64_t batch_bytes = std::max<int64_t>(1, options.memory_budget_bytes / 2);
  ReusedBuffer scratch;   // reused by every batch of every file
  ReusedBuffer slots[2];  // likewise
  for (size_t g = 0; g < groups.size(); ++g) {
    // Batches of tensors, each assembled from its pieces with checksums verified.
    std::vector<SafetensorsEntry> entries;
    int64_t pos = 0;
    for (size_t i : groups[g]) {
      const ExportItem& it = items[i];
      entries.push_back({it.key, it.dtype, it.shape, pos, pos + it.bytes});
      pos += it.bytes;
      weight_map[it.key] = BaseName(paths[g]);
    }
    total += pos;
    CKPT_RETURN_IF_ERROR(WriteSafetensorsFile(
        paths[g], entries, metadata, batch_bytes, options.overlap, slots,
        [&](size_t first, size_t last, char* buf) {
          return FillExportBatch(*reader, items, groups[g], entries, first, last, buf, &scratch);
        },
        options.stats));
  }
  if (groups.size() > 1) {
    Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string index_path = JoinPath(out, kIndexName);
    const std::string text = index.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
    CKPT_RETURN_IF_ERROR(WriteAtomically(index_path, [&](int fd, const std::string& tmp) {
      return PwriteAll(fd, text.data(), static_cast<int64_t>(text.size()), 0, tmp);
    }));
    paths.push_back(index_path);
  }
  CKPT_RETURN_IF_ERROR(RemoveStaleExportFiles(targets.earlier, paths));
  RecordBuffers({&slots[0], &slots[1], &scratch}, 0, options.stats);
  return paths;
}

}  // namespace ckpt
