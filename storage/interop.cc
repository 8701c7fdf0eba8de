#include "storage/interop.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

using Json = nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";

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

// Writes one safetensors file atomically (temporary name, fsync, rename), holding one entry in
// memory at a time: `fill(i, buf)` produces entry i's bytes.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<SafetensorsEntry>& entries,
                                  const std::map<std::string, std::string>& metadata,
                                  const std::function<absl::Status(size_t, char*)>& fill) {
  CKPT_ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(entries, metadata));
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
  auto write_all = [&]() -> absl::Status {
    CKPT_RETURN_IF_ERROR(PwriteAll(fd, header.data(), static_cast<int64_t>(header.size()), 0, tmp));
    const int64_t data_start = static_cast<int64_t>(header.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const int64_t n = entries[i].end - entries[i].begin;
      std::unique_ptr<char[]> buf(new char[std::max<int64_t>(1, n)]);
      CKPT_RETURN_IF_ERROR(fill(i, buf.get()));
      CKPT_RETURN_IF_ERROR(PwriteAll(fd, buf.get(), n, data_start + entries[i].begin, tmp));
    }
    return FsyncFd(fd, tmp);
  };
  absl::Status s = write_all();
  ::close(fd);
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  return FsyncDir(ParentDir(path));
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

absl::StatusOr<pb::Manifest> ImportSafetensors(const std::string& source, const std::string& ckpt,
                                               const WriteOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> files, ResolveImportSource(source));
  // Headers first: all tensors must be known (and unique) before anything is written.
  std::vector<SafetensorsHeader> headers;
  std::vector<TensorSpec> tensors;
  std::map<std::string, std::string> owner;
  CheckpointContents info;
  for (const std::string& f : files) {
    CKPT_ASSIGN_OR_RETURN(SafetensorsHeader h, ReadHeader(f));
    for (const SafetensorsEntry& e : h.entries) {
      auto [it, fresh] = owner.emplace(e.name, f);
      if (!fresh) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", e.name, "\" is in both ", it->second, " and ", f));
      }
      tensors.push_back({e.name, e.dtype, e.shape});
    }
    for (const auto& [k, v] : h.metadata) info.user_metadata.emplace(k, v);
    headers.push_back(std::move(h));
  }
  info.user_metadata["imported_from"] = source;
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.key < b.key; });

  CKPT_ASSIGN_OR_RETURN(std::string staging, CreateStagingDir(ckpt, options.overwrite));
  WrittenData all;
  absl::Status s;
  // One source file at a time, so memory holds one file's data.
  for (size_t i = 0; i < files.size() && s.ok(); ++i) {
    const SafetensorsHeader& h = headers[i];
    std::unique_ptr<char[]> data(new char[std::max<int64_t>(1, h.data_bytes)]);
    IoOptions io = options.io;
    s = ReadRanges({{files[i], h.data_start, h.data_bytes, data.get(), false, 0, {}, files[i]}},
                   io);
    if (!s.ok()) break;
    DataFilePlan plan;
    for (const SafetensorsEntry& e : h.entries) {
      plan.pieces.push_back({e.name, WholeRegion(e.shape), data.get() + e.begin, e.end - e.begin});
    }
    auto written = WriteDataFiles(staging, tensors, {plan}, static_cast<int>(i), options);
    if (!written.ok()) {
      s = written.status();
      break;
    }
    for (auto& p : written->pieces) all.pieces.push_back(std::move(p));
    for (auto& f : written->files) all.files.push_back(std::move(f));
  }
  pb::Manifest manifest;
  if (s.ok()) {
    manifest = BuildManifest(tensors, all, info, options.checksum_block_bytes);
    s = CommitCheckpoint(staging, ckpt, manifest, options);
  }
  if (!s.ok()) {
    RemoveTree(staging).IgnoreError();
    return s;
  }
  return manifest;
}

absl::StatusOr<std::vector<std::string>> ExportCheckpoint(const std::string& ckpt,
                                                          const std::string& out,
                                                          const ExportOptions& options) {
  ReaderOptions ro;
  ro.io = options.io;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(ckpt, ro));
  const pb::Manifest& m = reader->manifest();
  struct Item {
    std::string key;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t bytes;
  };
  std::vector<Item> items;
  for (const pb::TensorMeta& t : m.tensors()) {
    CKPT_ASSIGN_OR_RETURN(DType d, DTypeFromProto(t.dtype()));
    std::vector<int64_t> shape(t.global_shape().begin(), t.global_shape().end());
    CKPT_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(shape));
    if (!IsValidUtf8(t.key())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor key \"", t.key(), "\" is not valid UTF-8 and cannot be a safetensors name"));
    }
    items.push_back({t.key(), d, shape, n * DTypeSize(d)});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.key < b.key; });
  // Group into files in key order.
  std::vector<std::vector<size_t>> groups(1);
  int64_t in_group = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (options.max_file_bytes > 0 && !groups.back().empty() &&
        in_group + items[i].bytes > options.max_file_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += items[i].bytes;
  }
  const bool single_file = absl::EndsWith(out, ".safetensors");
  if (single_file && groups.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("the tensors need ", groups.size(),
                                                   " files of at most ", options.max_file_bytes,
                                                   " bytes; give a directory instead of ", out));
  }
  std::vector<std::string> paths;
  if (single_file) {
    paths.push_back(out);
  } else {
    CKPT_RETURN_IF_ERROR(MakeDir(out, /*exist_ok=*/true));
    if (groups.size() == 1) {
      paths.push_back(JoinPath(out, "model.safetensors"));
    } else {
      for (size_t g = 0; g < groups.size(); ++g) {
        paths.push_back(JoinPath(
            out, HumanSizeFileName(static_cast<int>(g + 1), static_cast<int>(groups.size()))));
      }
    }
  }
  if (!options.overwrite) {
    for (const std::string& p : paths) {
      if (PathExists(p)) {
        return absl::AlreadyExistsError(
            absl::StrCat(p, " already exists; pass --overwrite to replace it"));
      }
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"ckpt_step", absl::StrCat(m.step())}};
  Json weight_map = Json::object();
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    // One tensor in memory at a time, assembled from its pieces with checksums verified.
    std::vector<SafetensorsEntry> entries;
    int64_t pos = 0;
    for (size_t i : groups[g]) {
      const Item& it = items[i];
      entries.push_back({it.key, it.dtype, it.shape, pos, pos + it.bytes});
      pos += it.bytes;
      weight_map[it.key] = BaseName(paths[g]);
    }
    total += pos;
    CKPT_RETURN_IF_ERROR(
        WriteSafetensorsFile(paths[g], entries, metadata, [&](size_t e, char* buf) {
          const Item& it = items[groups[g][e]];
          return reader->ReadRegion(it.key, WholeRegion(it.shape), buf);
        }));
  }
  if (groups.size() > 1) {
    Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string index_path = JoinPath(out, kIndexName);
    CKPT_RETURN_IF_ERROR(WriteFileDurably(
        index_path, index.dump(2, ' ', false, Json::error_handler_t::replace) + "\n"));
    paths.push_back(index_path);
  }
  return paths;
}

}  // namespace ckpt
