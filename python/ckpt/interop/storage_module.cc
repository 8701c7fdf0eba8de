// _storage: ckpt's own checkpoint writer and reader for the Python interop converters
// (python/ckpt/interop/dcp.py), so the format code exists once, in storage/. An internal
// module: buffers are passed as (address, byte count) pairs of memory the caller keeps alive
// for the call (torch tensors' data_ptr(), whatever their dtype), and every call that does I/O
// releases the GIL. Errors raise RuntimeError with the absl::Status message (it names the
// tensor and file); nothing here throws across the module boundary otherwise.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "planner/layout_spec.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "sharding/flat_sharding.h"
#include "sharding/region.h"
#include "sharding/tensor_meta.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/manifest_codec.h"

namespace nb = nanobind;

namespace ckpt::interop {
namespace {

using Shape = std::vector<int64_t>;
// (key, dtype name, global shape)
using TensorTuple = std::tuple<std::string, std::string, Shape>;
// (key, offsets, lengths, flat (start, stop) or None)
using RegionTuple =
    std::tuple<std::string, Shape, Shape, std::optional<std::tuple<int64_t, int64_t>>>;

void Check(const absl::Status& s) {
  if (!s.ok()) throw std::runtime_error(std::string(s.message()));
}

template <typename T>
T Take(absl::StatusOr<T> v) {
  Check(v.status());
  return *std::move(v);
}

std::vector<TensorMeta> ToSpecs(const std::vector<TensorTuple>& tensors) {
  std::vector<TensorMeta> specs;
  specs.reserve(tensors.size());
  for (const auto& [key, dtype, shape] : tensors) {
    specs.push_back({key, Take(ParseDType(dtype)), shape});
  }
  return specs;
}

Region ToRegion(const Shape& offsets, const Shape& lengths,
                const std::optional<std::tuple<int64_t, int64_t>>& flat) {
  Region r{offsets, lengths, std::nullopt};
  if (flat) r.flat = FlatRange{std::get<0>(*flat), std::get<1>(*flat)};
  return r;
}

RegionTuple FromRegion(const std::string& key, const pb::Region& r) {
  std::optional<std::tuple<int64_t, int64_t>> flat;
  if (r.has_flat()) flat = std::make_tuple(r.flat().start(), r.flat().stop());
  return {key, Shape(r.offsets().begin(), r.offsets().end()),
          Shape(r.lengths().begin(), r.lengths().end()), flat};
}

// Writes one data file per call into the staging directory: r<writer_rank>_<index>.
// pieces: (key, offsets, lengths, flat, address, nbytes). Returns the manifest records of
// what was written (a serialized pb::Manifest holding only pieces and files), for commit().
nb::bytes WriteDataFile(
    const std::string& staging, const std::vector<TensorTuple>& tensors,
    const std::vector<std::tuple<std::string, Shape, Shape,
                                 std::optional<std::tuple<int64_t, int64_t>>, uintptr_t, int64_t>>&
        pieces,
    int writer_rank, int index) {
  const std::vector<TensorMeta> specs = ToSpecs(tensors);
  DataFilePlan plan;
  plan.writer_rank = writer_rank;
  for (const auto& [key, offsets, lengths, flat, address, nbytes] : pieces) {
    plan.pieces.push_back(
        {key, ToRegion(offsets, lengths, flat), reinterpret_cast<const void*>(address), nbytes});
  }
  absl::StatusOr<WrittenData> written;
  {
    nb::gil_scoped_release release;
    WriteOptions options;
    written = WriteDataFiles(staging, specs, {plan}, index, options);
  }
  Check(written.status());
  pb::Manifest records;
  for (auto& p : written->pieces) *records.add_pieces() = std::move(p);
  for (auto& f : written->files) *records.add_files() = std::move(f);
  const std::string bytes = records.SerializeAsString();
  return nb::bytes(bytes.data(), bytes.size());
}

// Builds the manifest from every write's records and commits the staging directory at
// `final_path` with the commit protocol.
void Commit(const std::string& staging, const std::string& final_path,
            const std::vector<TensorTuple>& tensors, const std::vector<nb::bytes>& records,
            const std::map<std::string, std::string>& user_metadata, int64_t step, bool overwrite) {
  const std::vector<TensorMeta> specs = ToSpecs(tensors);
  WrittenData all;
  for (const nb::bytes& blob : records) {
    pb::Manifest part;
    if (!part.ParseFromArray(blob.c_str(), static_cast<int>(blob.size()))) {
      throw std::runtime_error("commit: a write record does not parse");
    }
    for (auto& p : *part.mutable_pieces()) all.pieces.push_back(std::move(p));
    for (auto& f : *part.mutable_files()) all.files.push_back(std::move(f));
  }
  CheckpointContents info;
  info.step = step;
  info.user_metadata = user_metadata;
  WriteOptions options;
  options.overwrite = overwrite;
  const pb::Manifest manifest = BuildManifest(specs, all, info, options.checksum_block_bytes);
  nb::gil_scoped_release release;
  Check(CommitCheckpoint(staging, final_path, manifest, options));
}

std::string CreateStaging(const std::string& final_path, bool overwrite) {
  return Take(CreateStagingDir(final_path, overwrite));
}

void DiscardStaging(const std::string& staging) {
  nb::gil_scoped_release release;
  Check(DiscardStagingDir(staging));
}

// An opened, validated ckpt checkpoint.
class Reader {
 public:
  explicit Reader(const std::string& path) {
    nb::gil_scoped_release release;
    reader_ = Take(CheckpointReader::Open(path));
  }

  std::vector<TensorTuple> Tensors() const {
    std::vector<TensorTuple> out;
    for (const pb::TensorMeta& t : reader_->manifest().tensors()) {
      out.emplace_back(t.key(), std::string(DTypeName(Take(DTypeFromProto(t.dtype())))),
                       Shape(t.global_shape().begin(), t.global_shape().end()));
    }
    return out;
  }

  std::vector<RegionTuple> Pieces() const {
    std::vector<RegionTuple> out;
    for (const pb::StoredPiece& p : reader_->manifest().pieces()) {
      out.push_back(FromRegion(p.key(), p.region()));
    }
    return out;
  }

  std::map<std::string, std::string> UserMetadata() const {
    const auto& m = reader_->manifest().user_metadata();
    return std::map<std::string, std::string>(m.begin(), m.end());
  }

  int64_t Step() const { return reader_->manifest().step(); }

  // Reads regions (key, offsets, lengths, flat, address, nbytes) in one parallel batch, each
  // into the caller's memory (exactly the region's bytes), checksums verified.
  void ReadRegions(const std::vector<std::tuple<std::string, Shape, Shape,
                                                std::optional<std::tuple<int64_t, int64_t>>,
                                                uintptr_t, int64_t>>& regions) const {
    std::vector<CheckpointReader::RegionRead> batch;
    for (const auto& [key, offsets, lengths, flat, address, nbytes] : regions) {
      const pb::TensorMeta* t = reader_->FindTensor(key);
      if (t == nullptr) throw std::runtime_error(absl::StrCat("no tensor \"", key, "\""));
      Region region = ToRegion(offsets, lengths, flat);
      const int64_t need = region.NumElements() * DTypeSize(Take(DTypeFromProto(t->dtype())));
      if (need != nbytes) {
        throw std::runtime_error(absl::StrCat("tensor \"", key, "\" region ", region.DebugString(),
                                              " has ", need, " bytes, the buffer ", nbytes));
      }
      batch.push_back({key, std::move(region), reinterpret_cast<void*>(address)});
    }
    nb::gil_scoped_release release;
    Check(reader_->ReadRegions(batch));
  }

 private:
  std::unique_ptr<CheckpointReader> reader_;
};

// Every rank's piece of every tensor under the layout file (docs/layout.md): (key, rank,
// offsets, lengths, flat, is_main_replica), empty pieces left out.
std::vector<std::tuple<std::string, int64_t, Shape, Shape,
                       std::optional<std::tuple<int64_t, int64_t>>, bool>>
LayoutPieces(const std::string& layout_path, const std::vector<TensorTuple>& tensors) {
  const LayoutSpec layout = Take(LayoutSpec::FromFile(layout_path));
  std::vector<TensorMeta> metas;
  for (const auto& [key, dtype, shape] : tensors) {
    metas.push_back({key, Take(ParseDType(dtype)), shape});
  }
  std::vector<std::tuple<std::string, int64_t, Shape, Shape,
                         std::optional<std::tuple<int64_t, int64_t>>, bool>>
      out;
  for (const TensorPiece& p : Take(layout.AllPieces(metas, /*drop_empty=*/true))) {
    std::optional<std::tuple<int64_t, int64_t>> flat;
    if (p.region.flat) flat = std::make_tuple(p.region.flat->start, p.region.flat->stop);
    out.emplace_back(p.key, p.rank, p.region.offsets, p.region.lengths, flat, p.is_main_replica());
  }
  return out;
}

// A flat range [start, stop) of the box (offsets, lengths) as disjoint boxes in flat order
// (sharding/flat_sharding.h), for formats whose chunks are boxes only.
std::vector<std::tuple<Shape, Shape>> FlatRangeBoxes(const Shape& offsets, const Shape& lengths,
                                                     int64_t start, int64_t stop) {
  const Region box{offsets, lengths, std::nullopt};
  std::vector<std::tuple<Shape, Shape>> out;
  for (const FlatSubBox& sub : FlatRangeToBoxes(box, FlatRange{start, stop})) {
    out.emplace_back(sub.box.offsets, sub.box.lengths);
  }
  return out;
}

// The element size of a dtype name ("BF16" -> 2).
int64_t ElementSize(const std::string& dtype) { return DTypeSize(Take(ParseDType(dtype))); }

}  // namespace

NB_MODULE(_storage, m) {
  m.doc() = "ckpt's checkpoint writer and reader for the interop converters (internal)";
  m.def("create_staging", &CreateStaging, nb::arg("final_path"), nb::arg("overwrite"),
        "Creates <parent>/.<name>.tmp-... with data/ for a checkpoint at final_path.");
  m.def("discard_staging", &DiscardStaging, nb::arg("staging"));
  m.def("write_data_file", &WriteDataFile, nb::arg("staging"), nb::arg("tensors"),
        nb::arg("pieces"), nb::arg("writer_rank"), nb::arg("index"),
        "Writes data/r<writer_rank>_<index>.safetensors; returns its manifest records.");
  m.def("commit", &Commit, nb::arg("staging"), nb::arg("final_path"), nb::arg("tensors"),
        nb::arg("records"), nb::arg("user_metadata"), nb::arg("step"), nb::arg("overwrite"));
  m.def("layout_pieces", &LayoutPieces, nb::arg("layout_path"), nb::arg("tensors"));
  m.def("element_size", &ElementSize, nb::arg("dtype"));
  m.def("flat_range_boxes", &FlatRangeBoxes, nb::arg("offsets"), nb::arg("lengths"),
        nb::arg("start"), nb::arg("stop"));
  nb::class_<Reader>(m, "Reader")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def("tensors", &Reader::Tensors)
      .def("pieces", &Reader::Pieces)
      .def("user_metadata", &Reader::UserMetadata)
      .def("step", &Reader::Step)
      .def("read_regions", &Reader::ReadRegions, nb::arg("regions"));
}

}  // namespace ckpt::interop
