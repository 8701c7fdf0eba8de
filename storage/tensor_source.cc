#include "storage/tensor_source.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/store_url.h"
#include "proto/manifest.pb.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "storage/interop.h"
#include "storage/manifest_codec.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

class CkptSource : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<TensorSource>> Open(const std::string& path,
                                                            const IoOptions& io) {
    ReaderOptions options;
    options.io = io;
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                          CheckpointReader::Open(path, options));
    auto source = std::unique_ptr<CkptSource>(new CkptSource(path, std::move(reader)));
    for (const pb::TensorMeta& t : source->reader_->manifest().tensors()) {
      CKPT_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(t.dtype()));
      source->tensors_.push_back(
          {t.key(), dtype, std::vector<int64_t>(t.global_shape().begin(), t.global_shape().end())});
    }
    std::sort(source->tensors_.begin(), source->tensors_.end(),
              [](const auto& a, const auto& b) { return a.key < b.key; });
    return source;
  }

  std::string Describe() const override { return absl::StrCat("ckpt checkpoint ", path_); }
  const std::vector<TensorDescription>& tensors() const override { return tensors_; }

  absl::Status ReadElements(const std::string& key, int64_t start, int64_t stop,
                            char* dest) const override {
    const pb::TensorMeta* t = reader_->FindTensor(key);
    if (t == nullptr)
      return absl::NotFoundError(absl::StrCat(path_, " has no tensor \"", key, "\""));
    Region region =
        WholeRegion(std::vector<int64_t>(t->global_shape().begin(), t->global_shape().end()));
    region.flat = FlatRange{start, stop};
    return reader_->ReadRegion(key, region, dest);
  }

 private:
  CkptSource(std::string path, std::unique_ptr<CheckpointReader> reader)
      : path_(std::move(path)), reader_(std::move(reader)) {}
  std::string path_;
  std::unique_ptr<CheckpointReader> reader_;
  std::vector<TensorDescription> tensors_;
};

// Where one tensor's bytes are in a safetensors file.
struct SafetensorsLocation {
  std::string file;
  int64_t offset = 0;  // absolute offset of element 0
  int64_t element_size = 0;
};

class SafetensorsSource : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<TensorSource>> Open(const std::string& path,
                                                            const IoOptions& io) {
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> files, ResolveImportSource(path));
    auto source = std::unique_ptr<SafetensorsSource>(new SafetensorsSource(path, io));
    source->num_files_ = files.size();
    for (const std::string& file : files) {
      CKPT_ASSIGN_OR_RETURN(int64_t size, FileSize(file));
      CKPT_ASSIGN_OR_RETURN(std::string prefix, ReadFileRange(file, 0, std::min<int64_t>(8, size)));
      CKPT_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsPrefix(prefix, size, file));
      CKPT_ASSIGN_OR_RETURN(std::string json, ReadFileRange(file, 8, static_cast<int64_t>(n)));
      CKPT_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(json, size, file));
      for (const SafetensorsEntry& e : header.entries) {
        auto [it, fresh] = source->where_.emplace(
            e.name, SafetensorsLocation{file, header.data_start + e.begin, DTypeSize(e.dtype)});
        if (!fresh) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor \"", e.name, "\" is in both ", it->second.file, " and ", file));
        }
        source->tensors_.push_back({e.name, e.dtype, e.shape});
      }
    }
    std::sort(source->tensors_.begin(), source->tensors_.end(),
              [](const auto& a, const auto& b) { return a.key < b.key; });
    return source;
  }

  std::string Describe() const override {
    return absl::StrCat("safetensors (", num_files_, num_files_ == 1 ? " file) " : " files) ",
                        path_);
  }
  const std::vector<TensorDescription>& tensors() const override { return tensors_; }

  absl::Status ReadElements(const std::string& key, int64_t start, int64_t stop,
                            char* dest) const override {
    auto it = where_.find(key);
    if (it == where_.end())
      return absl::NotFoundError(absl::StrCat(path_, " has no tensor \"", key, "\""));
    const SafetensorsLocation& at = it->second;
    RangeRead read;
    read.path = at.file;
    read.offset = at.offset + start * at.element_size;
    read.length = (stop - start) * at.element_size;
    read.dest = dest;
    read.label = absl::StrCat("tensor \"", key, "\"");
    return ReadRanges({read}, io_);
  }

 private:
  SafetensorsSource(std::string path, const IoOptions& io) : path_(std::move(path)), io_(io) {}
  std::string path_;
  IoOptions io_;
  size_t num_files_ = 0;
  std::map<std::string, SafetensorsLocation> where_;
  std::vector<TensorDescription> tensors_;
};

}  // namespace

bool IsCkptCheckpointDir(const std::string& path) {
  return IsDirectory(path) && PathExists(JoinPath(path, "manifest.pb"));
}

bool IsDcpCheckpointDir(const std::string& path) {
  return IsDirectory(path) && PathExists(JoinPath(path, ".metadata"));
}

absl::StatusOr<std::unique_ptr<TensorSource>> OpenTensorSource(const std::string& path,
                                                               const IoOptions& io) {
  // A checkpoint in an object store is read in place (ranged GETs: CheckpointReader).
  if (IsObjectStoreLocation(path)) return CkptSource::Open(path, io);
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  if (IsCkptCheckpointDir(path)) return CkptSource::Open(path, io);
  if (IsDcpCheckpointDir(path)) {
    return absl::UnimplementedError(absl::StrCat(
        path, " is a PyTorch DCP checkpoint (.metadata), which this reader does not open"));
  }
  if (IsDirectory(path)) {
    absl::StatusOr<std::unique_ptr<TensorSource>> st = SafetensorsSource::Open(path, io);
    if (st.ok() || st.status().code() != absl::StatusCode::kNotFound) return st;
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a checkpoint: no manifest.pb (ckpt), no .metadata (DCP) and ",
                     st.status().message()));
  }
  return SafetensorsSource::Open(path, io);
}

}  // namespace ckpt
