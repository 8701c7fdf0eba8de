#include "storage/manifest_codec.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "proto/deterministic.h"
#include "sharding/coverage.h"
#include "storage/checksum.h"
#include "storage/piece_codec.h"

namespace ckpt {
namespace {

absl::Status ManifestError(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("invalid manifest: ", what));
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

std::string ManifestPieceFileName(int index) {
  return absl::StrFormat("manifest-pieces-%05d.pb", index);
}

bool IsManifestPieceFileName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "manifest-pieces-", kSuffix = ".pb";
  if (name.size() != kPrefix.size() + 5 + kSuffix.size() || !absl::StartsWith(name, kPrefix) ||
      !absl::EndsWith(name, kSuffix)) {
    return false;
  }
  int index = 0;
  for (char c : name.substr(kPrefix.size(), 5)) {
    if (c < '0' || c > '9') return false;
    index = index * 10 + (c - '0');
  }
  return index < kMaxManifestPieceFiles;
}

namespace {

// The format version and the piece-file records of `m` (see ValidateManifest); its pieces are
// not looked at.
absl::Status CheckFormat(const pb::Manifest& m) {
  const uint32_t version = m.format_version();
  if (version != kManifestFormatVersion && version != kManifestPieceFilesFormatVersion) {
    return absl::UnimplementedError(absl::StrCat(
        "unknown manifest format version ", version, " (this reader supports versions ",
        kManifestFormatVersion, " and ", kManifestPieceFilesFormatVersion, ")"));
  }
  const int n = m.piece_files_size();
  if (version == kManifestFormatVersion) {
    if (n == 0) return absl::OkStatus();
    return ManifestError(absl::StrCat("format version 1 lists ", n, " piece files"));
  }
  if (n == 0 || n > kMaxManifestPieceFiles) {
    return ManifestError(absl::StrCat("format version 2 lists ", n, " piece files (1 to ",
                                      kMaxManifestPieceFiles, " allowed)"));
  }
  for (int i = 0; i < n; ++i) {
    const pb::ManifestPieceFile& f = m.piece_files(i);
    if (f.name() != ManifestPieceFileName(i)) {
      return ManifestError(absl::StrCat("piece file ", i, " is named \"", f.name(), "\", not \"",
                                        ManifestPieceFileName(i), "\""));
    }
    if (f.size_bytes() < 0 || f.piece_count() < 1 || f.piece_count() > f.size_bytes()) {
      return ManifestError(absl::StrCat("piece file ", f.name(), " has ", f.piece_count(),
                                        " pieces in ", f.size_bytes(), " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribePiece(const pb::StoredPiece& piece) {
  absl::StatusOr<Region> r = RegionFromProto(piece.region());
  return absl::StrCat("tensor \"", piece.key(), "\" region ",
                      r.ok() ? r->DebugString() : "(malformed)", " in ", piece.file());
}

namespace {

absl::Span<const int64_t> ShapeOf(const pb::TensorMeta& t) {
  return absl::MakeConstSpan(t.global_shape().data(), t.global_shape_size());
}

// "piece i (tensor ... in file): what".
absl::Status PieceError(int i, const pb::StoredPiece& p, absl::string_view what) {
  return ManifestError(absl::StrCat("piece ", i, " (", DescribePiece(p), "): ", what));
}

}  // namespace

absl::Status CheckStoredPieceChecksums(int i, const pb::StoredPiece& p) {
  if (p.block_xxh3_size() > 0 &&
      p.xxh3_64() != CombineBlockHashes({p.block_xxh3().begin(), p.block_xxh3().end()})) {
    return PieceError(i, p, "its checksum does not match its block checksums");
  }
  return absl::OkStatus();
}

namespace {

// Every tensor's pieces tile it exactly (sharding/coverage.h), in manifest order.
// `tensor_of[i]` and `regions[i]` are piece i's tensor index and region; `describe(i, region)`
// names piece i in errors.
absl::Status CheckCoverageOfEachTensor(
    const pb::Manifest& m, const std::vector<int>& tensor_of, std::vector<Region> regions,
    const std::function<std::string(int, const Region&)>& describe) {
  // Pieces grouped by tensor (a counting sort), each group's regions contiguous.
  const int num_tensors = m.tensors_size();
  std::vector<int> start(num_tensors + 1, 0);
  for (int t : tensor_of) ++start[t + 1];
  for (int t = 0; t < num_tensors; ++t) start[t + 1] += start[t];
  std::vector<int> order(tensor_of.size());
  std::vector<Region> grouped(tensor_of.size());
  std::vector<int> next(start.begin(), start.end() - 1);
  for (size_t i = 0; i < tensor_of.size(); ++i) {
    const int at = next[tensor_of[i]]++;
    order[at] = static_cast<int>(i);
    grouped[at] = std::move(regions[i]);
  }
  for (int t = 0; t < num_tensors; ++t) {
    const pb::TensorMeta& meta = m.tensors(t);
    const absl::Span<const Region> pieces =
        absl::MakeConstSpan(grouped).subspan(start[t], start[t + 1] - start[t]);
    absl::StatusOr<std::optional<CoverageFault>> fault = FindCoverageFault(
        ShapeOf(meta), pieces, CoverageTermBudget(static_cast<int64_t>(pieces.size())));
    if (!fault.ok()) {
      return ManifestError(absl::StrCat("tensor \"", meta.key(), "\": ", fault.status().message()));
    }
    if (fault->has_value()) {
      return ManifestError(DescribeCoverageFault(meta.key(), ShapeOf(meta), **fault, [&](int p) {
        return describe(order[start[t] + p], grouped[start[t] + p]);
      }));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ManifestValidator::Start(const pb::Manifest& head) {
  head_ = &head;
  CKPT_RETURN_IF_ERROR(CheckFormat(head));
  return CollectHead();
}

absl::Status ManifestValidator::StartShare(const pb::Manifest& share) {
  head_ = &share;
  if (share.piece_files_size() > 0) {
    return ManifestError(absl::StrCat("a share lists ", share.piece_files_size(),
                                      " piece files (it holds its pieces itself)"));
  }
  // Format 2 lists piece files in a checkpoint's manifest.pb, never in a share.
  if (share.format_version() != kManifestPieceFilesFormatVersion) {
    CKPT_RETURN_IF_ERROR(CheckFormat(share));
  }
  return CollectHead();
}

// The tensors, the data files and the checksum block size of head_.
absl::Status ManifestValidator::CollectHead() {
  CKPT_RETURN_IF_ERROR(CollectTensors());
  CKPT_RETURN_IF_ERROR(CollectFiles());
  const int64_t block = head_->checksum_block_bytes();
  if (block < 0 || (block > 0 && block < 4096)) {
    return ManifestError(absl::StrCat("checksum block size ", block, " is below 4096"));
  }
  return absl::OkStatus();
}

absl::Status ManifestValidator::CollectTensors() {
  tensor_index_.reserve(head_->tensors_size());
  for (int i = 0; i < head_->tensors_size(); ++i) {
    const pb::TensorMeta& t = head_->tensors(i);
    if (t.key().empty()) return ManifestError("a tensor has an empty key");
    auto dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok()) {
      return ManifestError(absl::StrCat("tensor \"", t.key(), "\": ", dtype.status().message()));
    }
    auto n = CheckedNumElements(ShapeOf(t));
    if (!n.ok()) {
      return ManifestError(absl::StrCat("tensor \"", t.key(), "\": ", n.status().message()));
    }
    if (!tensor_index_.try_emplace(t.key(), i).second) {
      return ManifestError(absl::StrCat("tensor \"", t.key(), "\" is listed twice"));
    }
    dtypes_.push_back(*dtype);
  }
  return absl::OkStatus();
}

absl::Status ManifestValidator::CollectFiles() {
  file_index_.reserve(head_->files_size());
  for (int i = 0; i < head_->files_size(); ++i) {
    const pb::DataFile& f = head_->files(i);
    CKPT_RETURN_IF_ERROR(ValidateDataFileName(f.name()));
    if (f.data_start() < 8 || f.data_start() % kSafetensorsDataAlignment != 0 ||
        f.size_bytes() < f.data_start()) {
      return ManifestError(absl::StrCat("data file ", f.name(), " has data start ", f.data_start(),
                                        " and size ", f.size_bytes()));
    }
    if (!file_index_.try_emplace(f.name(), i).second) {
      return ManifestError(absl::StrCat("data file ", f.name(), " is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ManifestValidator::CheckPiece(int i, const pb::StoredPiece& p, int* tensor,
                                           Region* region, int* file_index) const {
  auto t = tensor_index_.find(p.key());
  if (t == tensor_index_.end()) return PieceError(i, p, "its tensor is not listed");
  *tensor = t->second;
  absl::StatusOr<Region> converted = RegionFromProto(p.region());
  if (!converted.ok()) return PieceError(i, p, converted.status().message());
  *region = *std::move(converted);
  absl::Status valid = ValidateRegion(*region, ShapeOf(head_->tensors(t->second)));
  if (!valid.ok()) return PieceError(i, p, valid.message());
  const DType dtype = dtypes_[t->second];
  const int64_t elem = DTypeSize(dtype);
  const int64_t n = region->NumElements();
  if (n > std::numeric_limits<int64_t>::max() / elem || p.byte_length() != n * elem) {
    return PieceError(i, p,
                      absl::StrCat("byte length ", p.byte_length(), " is not ", n, " elements of ",
                                   DTypeName(dtype)));
  }
  CKPT_RETURN_IF_ERROR(CheckPieceCodec(i, p));
  const int64_t stored = StoredBytes(p);
  auto f = file_index_.find(p.file());
  if (f == file_index_.end()) return PieceError(i, p, "its data file is not listed");
  *file_index = f->second;
  const pb::DataFile& file = head_->files(f->second);
  if (p.byte_offset() < file.data_start() || p.byte_offset() > file.size_bytes() ||
      stored > file.size_bytes() - p.byte_offset()) {
    return PieceError(
        i, p,
        absl::StrCat("bytes [", p.byte_offset(), ", +", stored, ") lie outside the data section [",
                     file.data_start(), ", ", file.size_bytes(), ")"));
  }
  const std::string want_name = EncodeEntryName(p.key(), *region);
  if (p.entry_name() != want_name) {
    return PieceError(
        i, p, absl::StrCat("entry name \"", p.entry_name(), "\" should be \"", want_name, "\""));
  }
  const int64_t block = head_->checksum_block_bytes();
  const int64_t want_blocks = (block > 0 && stored > block) ? (stored + block - 1) / block : 0;
  CKPT_RETURN_IF_ERROR(CheckStoredPieceChecksums(i, p));
  if (p.block_xxh3_size() != want_blocks) {
    return PieceError(
        i, p,
        absl::StrCat("has ", p.block_xxh3_size(), " block checksums, expected ", want_blocks));
  }
  return absl::OkStatus();
}

absl::Status ManifestValidator::AddPiece(const pb::StoredPiece& p) {
  const int i = static_cast<int>(tensor_of_.size());
  int tensor = 0, file = 0;
  Region region;
  CKPT_RETURN_IF_ERROR(CheckPiece(i, p, &tensor, &region, &file));
  // Each (key, region) once: two pieces with elements in common fail the coverage check,
  // which names both; pieces without elements are checked here.
  if (p.byte_length() == 0 && !empty_pieces_.insert(p.entry_name()).second) {
    return PieceError(i, p, "is stored twice");
  }
  tensor_of_.push_back(tensor);
  file_of_.push_back(file);
  regions_.push_back(std::move(region));
  ranges_.emplace_back(file, p.byte_offset(), p.byte_offset() + StoredBytes(p), i);
  return absl::OkStatus();
}

// "tensor "key" region R in file" of piece i, as DescribePiece says it.
std::string ManifestValidator::Describe(int i, const Region& region) const {
  return absl::StrCat("tensor \"", head_->tensors(tensor_of_[i]).key(), "\" region ",
                      region.DebugString(), " in ", head_->files(file_of_[i]).name());
}

absl::Status ManifestValidator::CheckByteRangesDisjoint() {
  std::sort(ranges_.begin(), ranges_.end());
  for (size_t i = 1; i < ranges_.size(); ++i) {
    const auto& [file, begin, end, index] = ranges_[i];
    const auto& [pfile, pbegin, pend, pindex] = ranges_[i - 1];
    if (file == pfile && begin < pend) {
      return ManifestError(absl::StrCat("pieces ", pindex, " (", Describe(pindex, regions_[pindex]),
                                        ") and ", index, " (", Describe(index, regions_[index]),
                                        ") overlap in bytes"));
    }
  }
  return absl::OkStatus();
}

// A format-2 manifest's piece files hold all of its pieces.
absl::Status ManifestValidator::CheckPieceCounts() const {
  if (head_->piece_files_size() == 0) return absl::OkStatus();
  int64_t listed = 0;
  for (const pb::ManifestPieceFile& f : head_->piece_files()) listed += f.piece_count();
  if (listed == static_cast<int64_t>(tensor_of_.size())) return absl::OkStatus();
  return ManifestError(absl::StrCat("its piece files hold ", listed, " pieces, the manifest has ",
                                    tensor_of_.size()));
}

absl::Status ManifestValidator::Finish() {
  CKPT_RETURN_IF_ERROR(CheckPieceCounts());
  CKPT_RETURN_IF_ERROR(CheckByteRangesDisjoint());
  std::vector<std::tuple<int, int64_t, int64_t, int>>().swap(ranges_);
  return CheckCoverageOfEachTensor(
      *head_, tensor_of_, std::move(regions_),
      [&](int i, const Region& region) { return Describe(i, region); });
}

absl::Status ManifestValidator::FinishWithoutCoverage() {
  CKPT_RETURN_IF_ERROR(CheckByteRangesDisjoint());
  std::vector<std::tuple<int, int64_t, int64_t, int>>().swap(ranges_);
  return absl::OkStatus();
}

absl::Status ValidateManifestShare(const pb::Manifest& share) {
  ManifestValidator validator;
  CKPT_RETURN_IF_ERROR(validator.StartShare(share));
  validator.Reserve(share.pieces_size());
  for (const pb::StoredPiece& p : share.pieces()) CKPT_RETURN_IF_ERROR(validator.AddPiece(p));
  return validator.FinishWithoutCoverage();
}

absl::Status ValidateManifest(const pb::Manifest& m) {
  ManifestValidator validator;
  CKPT_RETURN_IF_ERROR(validator.Start(m));
  validator.Reserve(m.pieces_size());
  for (const pb::StoredPiece& p : m.pieces()) CKPT_RETURN_IF_ERROR(validator.AddPiece(p));
  return validator.Finish();
}

void ManifestValidator::Reserve(int num_pieces) {
  tensor_of_.reserve(num_pieces);
  file_of_.reserve(num_pieces);
  regions_.reserve(num_pieces);
  ranges_.reserve(num_pieces);
}

absl::Status CheckPieceCodec(int i, const pb::StoredPiece& p) {
  if (p.codec() == 0) {
    if (p.stored_length() != 0 || p.raw_xxh3_64() != 0 || p.codec_chunk_bytes() != 0) {
      return PieceError(i, p, "is not compressed but has a stored length, raw checksum or chunk");
    }
    return absl::OkStatus();
  }
  if (!PieceCodecFromInt(p.codec()).ok() || p.stored_length() < kFrameHeaderBytes ||
      p.codec_chunk_bytes() < 1 || p.codec_chunk_bytes() > kMaxCodecChunkBytes) {
    return PieceError(
        i, p,
        absl::StrCat("has codec ", p.codec(), ", stored length ", p.stored_length(), " and chunk ",
                     p.codec_chunk_bytes(), " bytes: not a valid compressed piece"));
  }
  // The frame's index alone must fit the stored bytes (checked again, with the frame, on read).
  const int64_t chunks =
      p.byte_length() == 0 ? 0 : (p.byte_length() - 1) / p.codec_chunk_bytes() + 1;
  if (chunks > (p.stored_length() - kFrameHeaderBytes) / kFrameIndexEntryBytes) {
    return PieceError(i, p,
                      absl::StrCat("stored length ", p.stored_length(),
                                   " cannot hold the index of ", chunks, " chunks"));
  }
  return absl::OkStatus();
}

absl::Status CheckPieceChecksums(const pb::Manifest& m, int i) {
  return CheckStoredPieceChecksums(i, m.pieces(i));
}

namespace {

// Feeds values to a streaming XXH3-128, each string length-prefixed so fields cannot run into
// each other.
class ShapeHasher {
 public:
  ShapeHasher() : state_(XXH3_createState()) { XXH3_128bits_reset(state_); }
  ~ShapeHasher() { XXH3_freeState(state_); }
  ShapeHasher(const ShapeHasher&) = delete;
  ShapeHasher& operator=(const ShapeHasher&) = delete;

  void Int(int64_t v) { XXH3_128bits_update(state_, &v, sizeof(v)); }
  void Bytes(absl::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    XXH3_128bits_update(state_, s.data(), s.size());
  }
  // A sub-message, serialized (no maps below it, so the bytes are deterministic).
  void Message(const google::protobuf::MessageLite& message) {
    buffer_.clear();
    message.AppendToString(&buffer_);
    Bytes(buffer_);
  }
  ManifestShape Digest() {
    const XXH128_hash_t h = XXH3_128bits_digest(state_);
    return ManifestShape{h.low64, h.high64};
  }

 private:
  XXH3_state_t* state_;
  std::string buffer_;
};

}  // namespace

struct PieceShapeHasher::State {
  ShapeHasher hasher;
};

PieceShapeHasher::PieceShapeHasher() : state_(std::make_unique<State>()) {}
PieceShapeHasher::~PieceShapeHasher() = default;

void PieceShapeHasher::Add(const pb::StoredPiece& p) {
  ShapeHasher& h = state_->hasher;
  h.Bytes(p.key());
  h.Message(p.region());
  h.Bytes(p.file());
  h.Bytes(p.entry_name());
  h.Int(p.byte_offset());
  h.Int(p.byte_length());
  h.Int(p.writer_rank());
  h.Int(p.block_xxh3_size());
  if (p.codec() != 0) {  // only then: uncompressed manifests keep their shapes
    h.Int(p.codec());
    h.Int(p.stored_length());
    h.Int(p.codec_chunk_bytes());
  }
  ++count_;
}

ManifestShape PieceShapeHasher::Of(const pb::Manifest& head) {
  const ManifestShape pieces = state_->hasher.Digest();
  ShapeHasher h;
  h.Int(head.format_version());
  h.Int(head.checksum_block_bytes());
  h.Int(head.tensors_size());
  for (const pb::TensorMeta& t : head.tensors()) h.Message(t);
  h.Int(head.files_size());
  for (const pb::DataFile& f : head.files()) h.Message(f);
  h.Int(head.piece_files_size());  // names and counts (sizes and checksums: the reader's)
  for (const pb::ManifestPieceFile& f : head.piece_files()) {
    h.Bytes(f.name());
    h.Int(f.piece_count());
    h.Int(f.size_bytes());
  }
  h.Int(count_);
  h.Int(static_cast<int64_t>(pieces.low));
  h.Int(static_cast<int64_t>(pieces.high));
  return h.Digest();
}

ManifestShape ManifestShapeOf(const pb::Manifest& m) {
  PieceShapeHasher pieces;
  for (const pb::StoredPiece& p : m.pieces()) pieces.Add(p);
  return pieces.Of(m);
}

absl::StatusOr<pb::Manifest> ParseManifestHead(absl::string_view bytes, absl::string_view path) {
  if (static_cast<int64_t>(bytes.size()) > kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is larger than 2 GiB"));
  }
  pb::Manifest m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " is not a valid protobuf"));
  }
  CKPT_RETURN_IF_ERROR(CheckManifestHead(m, m.pieces_size(), path));
  return m;
}

absl::Status CheckManifestHead(const pb::Manifest& head, int64_t own_pieces,
                               absl::string_view path) {
  absl::Status s = CheckFormat(head);
  if (s.ok() && head.format_version() == kManifestPieceFilesFormatVersion && own_pieces > 0) {
    s =
        ManifestError(absl::StrCat("format version 2 keeps its pieces in piece files but it "
                                   "also holds ",
                                   own_pieces, " pieces itself"));
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<pb::Manifest> ParseManifest(absl::string_view bytes, absl::string_view path) {
  CKPT_ASSIGN_OR_RETURN(pb::Manifest m, ParseManifestHead(bytes, path));
  if (m.format_version() == kManifestPieceFilesFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " keeps its pieces in ", m.piece_files_size(),
                     " piece files beside it: read it with ReadManifestFile"));
  }
  absl::Status s = ValidateManifest(m);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return m;
}

std::string SerializeManifest(const pb::Manifest& manifest) {
  return SerializeDeterministically(manifest);
}

ManifestIndex::ManifestIndex(const pb::Manifest& manifest) : manifest_(manifest) {
  tensor_index_.reserve(manifest.tensors_size());
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    tensor_index_.emplace(manifest.tensors(t).key(), t);
    auto d = DTypeFromProto(manifest.tensors(t).dtype());
    dtypes_.push_back(d.ok() ? *d : DType::kU8);
  }
  tensor_of_piece_.resize(manifest.pieces_size());
  std::vector<int>* file_pieces = nullptr;  // consecutive pieces mostly share a file
  absl::string_view file;
  for (int i = 0; i < manifest.pieces_size(); ++i) {
    const pb::StoredPiece& p = manifest.pieces(i);
    auto t = tensor_index_.find(p.key());
    tensor_of_piece_[i] = t == tensor_index_.end() ? 0 : t->second;
    if (file_pieces == nullptr || p.file() != file) {
      file = p.file();
      file_pieces = &pieces_by_file_[file];
    }
    file_pieces->push_back(i);
  }
}

int ManifestIndex::TensorIndex(absl::string_view key) const {
  auto it = tensor_index_.find(key);
  return it == tensor_index_.end() ? -1 : it->second;
}

absl::Span<const int> ManifestIndex::PiecesInFile(absl::string_view name) const {
  auto it = pieces_by_file_.find(name);
  return it == pieces_by_file_.end() ? absl::Span<const int>() : absl::MakeConstSpan(it->second);
}

absl::Status CheckHeaderAgainstPieces(const pb::DataFile& file, const SafetensorsHeader& header,
                                      absl::Span<const pb::StoredPiece* const> pieces,
                                      absl::Span<const DType> dtypes, bool all_entries_known) {
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
  absl::flat_hash_map<absl::string_view, const SafetensorsEntry*> entries;
  entries.reserve(header.entries.size());
  for (const SafetensorsEntry& e : header.entries) entries.emplace(e.name, &e);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const pb::StoredPiece& p = *pieces[i];
    auto it = entries.find(p.entry_name());
    if (it == entries.end()) return err(p.entry_name(), "listed in the manifest but missing");
    const SafetensorsEntry& e = *it->second;
    const Region region = PieceRegion(p);
    // A compressed piece's entry is its frame as uint8 (storage/piece_codec.h).
    const bool packed = p.codec() != 0;
    const DType dtype = packed ? DType::kU8 : dtypes[i];
    const std::vector<int64_t> shape =
        packed ? std::vector<int64_t>{p.stored_length()} : EntryShape(region);
    if (e.dtype != dtype || e.shape != shape || header.data_start + e.begin != p.byte_offset() ||
        e.end - e.begin != StoredBytes(p)) {
      return err(
          p.entry_name(),
          absl::StrCat("header has dtype ", DTypeName(e.dtype), " shape ", ShapeString(e.shape),
                       " at [", header.data_start + e.begin, ", ", header.data_start + e.end,
                       "); the manifest has tensor \"", p.key(), "\" dtype ", DTypeName(dtype),
                       " shape ", ShapeString(shape), " at [", p.byte_offset(), ", ",
                       p.byte_offset() + StoredBytes(p), ")", packed ? " (compressed)" : ""));
    }
  }
  if (all_entries_known && pieces.size() != header.entries.size()) {
    absl::flat_hash_set<absl::string_view> listed;
    for (const pb::StoredPiece* p : pieces) listed.insert(p->entry_name());
    for (const SafetensorsEntry& e : header.entries) {
      if (!listed.contains(e.name)) return err(e.name, "not listed in the manifest");
    }
  }
  return absl::OkStatus();
}

namespace {

// CheckHeaderAgainstPieces with the pieces `index` puts in `file`.
absl::Status CheckHeader(const ManifestIndex& index, const pb::DataFile& file,
                         const SafetensorsHeader& header, bool all_entries_known) {
  const absl::Span<const int> in_file = index.PiecesInFile(file.name());
  std::vector<const pb::StoredPiece*> pieces;
  std::vector<DType> dtypes;
  pieces.reserve(in_file.size());
  dtypes.reserve(in_file.size());
  for (int i : in_file) {
    pieces.push_back(&index.manifest().pieces(i));
    dtypes.push_back(index.DTypeOfPiece(i));
  }
  return CheckHeaderAgainstPieces(file, header, pieces, dtypes, all_entries_known);
}

}  // namespace

absl::Status CheckHeaderAgainstManifest(const ManifestIndex& index, const pb::DataFile& file,
                                        const SafetensorsHeader& header) {
  return CheckHeader(index, file, header, /*all_entries_known=*/true);
}

absl::Status CheckHeaderAgainstShare(const ManifestIndex& index, const pb::DataFile& file,
                                     const SafetensorsHeader& header) {
  return CheckHeader(index, file, header, /*all_entries_known=*/false);
}

absl::Status CheckHeaderAgainstManifest(const pb::Manifest& manifest, const pb::DataFile& file,
                                        const SafetensorsHeader& header) {
  return CheckHeaderAgainstManifest(ManifestIndex(manifest), file, header);
}

}  // namespace ckpt
