#include "storage/manifest_codec.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "storage/checksum.h"
#include "storage/coverage.h"

namespace ckpt {
namespace {

absl::Status ManifestError(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("invalid manifest: ", what));
}

std::vector<int64_t> ToVector(const google::protobuf::RepeatedField<int64_t>& f) {
  return std::vector<int64_t>(f.begin(), f.end());
}

}  // namespace

Region PieceRegion(const pb::StoredPiece& piece) {
  absl::StatusOr<Region> r = RegionFromProto(piece.region());
  return r.ok() ? *std::move(r) : Region{};
}

std::string DataFileName(int writer_rank, int index) {
  return absl::StrCat("data/r", writer_rank, "_", index, ".safetensors");
}

absl::Status ValidateDataFileName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "data/", kSuffix = ".safetensors";
  auto bad = [&](absl::string_view why) {
    return ManifestError(absl::StrCat("data file name \"", name, "\" ", why));
  };
  if (!absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, kSuffix) ||
      name.size() <= kPrefix.size() + kSuffix.size()) {
    return bad("is not of the form data/<name>.safetensors");
  }
  absl::string_view base = name.substr(kPrefix.size());
  if (base[0] == '.') return bad("starts with '.'");
  if (base.size() > 200) return bad("is too long");
  for (char c : base) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return bad("contains a character outside [A-Za-z0-9._-]");
    }
  }
  return absl::OkStatus();
}

std::string DescribePiece(const pb::StoredPiece& piece) {
  absl::StatusOr<Region> r = RegionFromProto(piece.region());
  return absl::StrCat("tensor \"", piece.key(), "\" region ",
                      r.ok() ? r->DebugString() : "(malformed)", " in ", piece.file());
}

absl::Status ValidateManifest(const pb::Manifest& m) {
  if (m.format_version() != kManifestFormatVersion) {
    return absl::UnimplementedError(
        absl::StrCat("unknown manifest format version ", m.format_version(),
                     " (this reader supports version ", kManifestFormatVersion, ")"));
  }
  struct TensorInfo {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<int> pieces;      // indices into m.pieces()
    std::vector<Region> regions;  // their regions
  };
  std::map<std::string, TensorInfo> tensors;
  for (const pb::TensorMeta& t : m.tensors()) {
    if (t.key().empty()) return ManifestError("a tensor has an empty key");
    auto dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok()) {
      return ManifestError(absl::StrCat("tensor \"", t.key(), "\": ", dtype.status().message()));
    }
    std::vector<int64_t> shape = ToVector(t.global_shape());
    auto n = CheckedNumElements(shape);
    if (!n.ok()) {
      return ManifestError(absl::StrCat("tensor \"", t.key(), "\": ", n.status().message()));
    }
    if (!tensors.emplace(t.key(), TensorInfo{*dtype, std::move(shape), {}, {}}).second) {
      return ManifestError(absl::StrCat("tensor \"", t.key(), "\" is listed twice"));
    }
  }
  std::map<std::string, const pb::DataFile*> files;
  for (const pb::DataFile& f : m.files()) {
    CKPT_RETURN_IF_ERROR(ValidateDataFileName(f.name()));
    if (f.data_start() < 8 || f.data_start() % kSafetensorsDataAlignment != 0 ||
        f.size_bytes() < f.data_start()) {
      return ManifestError(absl::StrCat("data file ", f.name(), " has data start ", f.data_start(),
                                        " and size ", f.size_bytes()));
    }
    if (!files.emplace(f.name(), &f).second) {
      return ManifestError(absl::StrCat("data file ", f.name(), " is listed twice"));
    }
  }
  const int64_t block = m.checksum_block_bytes();
  if (block < 0 || (block > 0 && block < 4096)) {
    return ManifestError(absl::StrCat("checksum block size ", block, " is below 4096"));
  }
  // (file, begin, end, piece index) for the overlap check; (key, region) for duplicates.
  std::vector<std::tuple<std::string, int64_t, int64_t, int>> ranges;
  std::set<std::string> piece_ids;
  for (int i = 0; i < m.pieces_size(); ++i) {
    const pb::StoredPiece& p = m.pieces(i);
    auto err = [&](absl::string_view what) {
      return ManifestError(absl::StrCat("piece ", i, " (", DescribePiece(p), "): ", what));
    };
    auto t = tensors.find(p.key());
    if (t == tensors.end()) return err("its tensor is not listed");
    absl::StatusOr<Region> converted = RegionFromProto(p.region());
    if (!converted.ok()) return err(converted.status().message());
    const Region region = *std::move(converted);
    absl::Status valid = ValidateRegion(region, t->second.shape);
    if (!valid.ok()) return err(valid.message());
    const int64_t elem = DTypeSize(t->second.dtype);
    const int64_t n = region.NumElements();
    if (n > std::numeric_limits<int64_t>::max() / elem || p.byte_length() != n * elem) {
      return err(absl::StrCat("byte length ", p.byte_length(), " is not ", n, " elements of ",
                              DTypeName(t->second.dtype)));
    }
    auto f = files.find(p.file());
    if (f == files.end()) return err("its data file is not listed");
    const pb::DataFile& file = *f->second;
    if (p.byte_offset() < file.data_start() || p.byte_offset() > file.size_bytes() ||
        p.byte_length() > file.size_bytes() - p.byte_offset()) {
      return err(absl::StrCat("bytes [", p.byte_offset(), ", +", p.byte_length(),
                              ") lie outside the data section [", file.data_start(), ", ",
                              file.size_bytes(), ")"));
    }
    if (p.entry_name() != EncodeEntryName(p.key(), region)) {
      return err(absl::StrCat("entry name \"", p.entry_name(), "\" should be \"",
                              EncodeEntryName(p.key(), region), "\""));
    }
    const int64_t want_blocks =
        (block > 0 && p.byte_length() > block) ? (p.byte_length() + block - 1) / block : 0;
    if (p.block_xxh3_size() > 0 &&
        p.xxh3_64() != CombineBlockHashes({p.block_xxh3().begin(), p.block_xxh3().end()})) {
      return err("its checksum does not match its block checksums");
    }
    if (p.block_xxh3_size() != want_blocks) {
      return err(
          absl::StrCat("has ", p.block_xxh3_size(), " block checksums, expected ", want_blocks));
    }
    if (!piece_ids.insert(p.entry_name()).second) return err("is stored twice");
    ranges.emplace_back(p.file(), p.byte_offset(), p.byte_offset() + p.byte_length(), i);
    t->second.pieces.push_back(i);
    t->second.regions.push_back(region);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [file, begin, end, index] = ranges[i];
    const auto& [pfile, pbegin, pend, pindex] = ranges[i - 1];
    if (file == pfile && begin < pend) {
      return ManifestError(absl::StrCat("pieces ", pindex, " (", DescribePiece(m.pieces(pindex)),
                                        ") and ", index, " (", DescribePiece(m.pieces(index)),
                                        ") overlap in bytes"));
    }
  }
  // Every tensor's pieces tile it exactly: each element stored once, none missing.
  for (const auto& [key, info] : tensors) {
    absl::StatusOr<std::optional<CoverageFault>> fault = FindCoverageFault(
        info.shape, info.regions, CoverageTermBudget(static_cast<int64_t>(info.regions.size())));
    if (!fault.ok()) {
      return ManifestError(absl::StrCat("tensor \"", key, "\": ", fault.status().message()));
    }
    if (fault->has_value()) {
      return ManifestError(DescribeCoverageFault(key, info.shape, **fault, [&](int p) {
        return DescribePiece(m.pieces(info.pieces[p]));
      }));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::Manifest> ParseManifest(absl::string_view bytes, absl::string_view path) {
  if (static_cast<int64_t>(bytes.size()) > kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is larger than 2 GiB"));
  }
  pb::Manifest m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is not a valid protobuf"));
  }
  absl::Status s = ValidateManifest(m);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return m;
}

std::string SerializeManifest(const pb::Manifest& manifest) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    manifest.SerializeToCodedStream(&coded);
  }
  return out;
}

absl::Status CheckHeaderAgainstManifest(const pb::Manifest& manifest, const pb::DataFile& file,
                                        const SafetensorsHeader& header) {
  auto err = [&](absl::string_view entry, absl::string_view what) {
    return absl::DataLossError(absl::StrCat("data file ", file.name(),
                                            entry.empty() ? "" : ", entry \"", entry,
                                            entry.empty() ? "" : "\"", ": ", what));
  };
  if (header.data_start != file.data_start() ||
      header.data_start + header.data_bytes != file.size_bytes()) {
    return err("", absl::StrCat("header says data starts at ", header.data_start, " with ",
                                header.data_bytes, " bytes; the manifest says ", file.data_start(),
                                " and a ", file.size_bytes(), "-byte file"));
  }
  std::map<absl::string_view, const SafetensorsEntry*> entries;
  for (const SafetensorsEntry& e : header.entries) entries.emplace(e.name, &e);
  std::map<absl::string_view, DType> dtypes;
  for (const pb::TensorMeta& t : manifest.tensors()) {
    auto d = DTypeFromProto(t.dtype());
    if (d.ok()) dtypes.emplace(t.key(), *d);
  }
  size_t matched = 0;
  for (const pb::StoredPiece& p : manifest.pieces()) {
    if (p.file() != file.name()) continue;
    auto it = entries.find(p.entry_name());
    if (it == entries.end()) return err(p.entry_name(), "listed in the manifest but missing");
    const SafetensorsEntry& e = *it->second;
    const Region region = PieceRegion(p);
    if (e.dtype != dtypes[p.key()] || e.shape != EntryShape(region) ||
        header.data_start + e.begin != p.byte_offset() || e.end - e.begin != p.byte_length()) {
      return err(
          p.entry_name(),
          absl::StrCat("header has dtype ", DTypeName(e.dtype), " shape ", ShapeString(e.shape),
                       " at [", header.data_start + e.begin, ", ", header.data_start + e.end,
                       "); the manifest has tensor \"", p.key(), "\" dtype ",
                       DTypeName(dtypes[p.key()]), " shape ", ShapeString(EntryShape(region)),
                       " at [", p.byte_offset(), ", ", p.byte_offset() + p.byte_length(), ")"));
    }
    ++matched;
  }
  if (matched != header.entries.size()) {
    for (const SafetensorsEntry& e : header.entries) {
      bool known = false;
      for (const pb::StoredPiece& p : manifest.pieces()) {
        if (p.file() == file.name() && p.entry_name() == e.name) known = true;
      }
      if (!known) return err(e.name, "not listed in the manifest");
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt
