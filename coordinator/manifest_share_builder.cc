#include "coordinator/manifest_share_builder.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "proto/deterministic.h"
#include "sharding/overlap.h"

namespace ckpt::coordinator {
namespace {

// A region as a hashable value: rank, offsets, lengths, flat range (or -1).
std::vector<int64_t> RegionKey(const Region& region) {
  std::vector<int64_t> key;
  key.reserve(2 * region.offsets.size() + 3);
  key.push_back(region.ndim());
  key.insert(key.end(), region.offsets.begin(), region.offsets.end());
  key.insert(key.end(), region.lengths.begin(), region.lengths.end());
  key.push_back(region.flat ? region.flat->start : -1);
  key.push_back(region.flat ? region.flat->stop : -1);
  return key;
}

// The index in `shape`'s row-major order of the element at box-flat index `ordinal` of the
// box of `region`.
int64_t GlobalOrdinal(const Region& region, absl::Span<const int64_t> shape, int64_t ordinal) {
  int64_t global = 0;
  int64_t stride = 1;
  for (int d = region.ndim() - 1; d >= 0; --d) {
    const int64_t length = std::max<int64_t>(region.lengths[d], 1);
    global += (region.offsets[d] + ordinal % length) * stride;
    ordinal /= length;
    stride *= shape[d];
  }
  return global;
}

// The first and last element of `region` in `shape`'s row-major order (last < first when the
// region holds no element). Every element the region holds lies between them.
std::pair<int64_t, int64_t> Span(const Region& region, absl::Span<const int64_t> shape) {
  const int64_t begin = region.flat ? region.flat->start : 0;
  const int64_t end = region.flat ? region.flat->stop : region.BoxElements();
  if (end <= begin) return {0, -1};
  return {GlobalOrdinal(region, shape, begin), GlobalOrdinal(region, shape, end - 1)};
}

// Whether the boxes of `a` and `b` (same rank) share an element, without building the
// intersection.
bool BoxesMeet(const Region& a, const Region& b) {
  for (int d = 0; d < a.ndim(); ++d) {
    if (std::max(a.offsets[d], b.offsets[d]) >=
        std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d])) {
      return false;
    }
  }
  return true;
}

}  // namespace

ManifestShareBuilder::ManifestShareBuilder(int num_ranks) : groups_of_rank_(num_ranks) {}

void ManifestShareBuilder::AddRead(int rank, absl::string_view key,
                                   absl::Span<const int64_t> global_shape, const Region& region) {
  auto [it, added] = tensor_of_key_.try_emplace(key, static_cast<int>(tensors_.size()));
  if (added) {
    TensorReads t;
    t.key = std::string(key);
    t.shape.assign(global_shape.begin(), global_shape.end());
    tensors_.push_back(std::move(t));
  }
  TensorReads& tensor = tensors_[it->second];
  auto [group, new_group] =
      tensor.group_of_region.try_emplace(RegionKey(region), static_cast<int>(groups_.size()));
  if (new_group) {
    ReadGroup g;
    g.region = region;
    g.tensor = it->second;
    g.elements = region.NumElements();
    g.first_rank = rank;
    if (global_shape == absl::MakeConstSpan(tensor.shape)) {
      std::tie(g.first, g.last) = Span(region, tensor.shape);
    } else {
      // A reader that disagrees about the shape: the load fails on the shape check; give the
      // group the whole tensor's span so the matching stays safe until then.
      g.first = 0;
      g.last = std::numeric_limits<int64_t>::max();
    }
    groups_.push_back(std::move(g));
    tensor.groups.push_back(group->second);
  }
  // A rank reading one region twice lists its group twice; ShareOf keeps each piece once.
  groups_of_rank_[rank].push_back(group->second);
}

void ManifestShareBuilder::IndexSpans(TensorReads& tensor) {
  std::sort(tensor.groups.begin(), tensor.groups.end(),
            [&](int a, int b) { return groups_[a].first < groups_[b].first; });
  tensor.max_last.resize(tensor.groups.size());
  int64_t max_last = std::numeric_limits<int64_t>::min();
  for (size_t i = 0; i < tensor.groups.size(); ++i) {
    max_last = std::max(max_last, groups_[tensor.groups[i]].last);
    tensor.max_last[i] = max_last;
  }
  tensor.group_of_region.clear();
  tensor.indexed = true;
}

absl::Status ManifestShareBuilder::AddPiece(const pb::StoredPiece& piece) {
  auto found = tensor_of_key_.find(piece.key());
  if (found == tensor_of_key_.end()) return absl::OkStatus();
  TensorReads& tensor = tensors_[found->second];
  if (!tensor.indexed) IndexSpans(tensor);
  absl::StatusOr<Region> region = RegionFromProto(piece.region());
  absl::Status valid = region.ok() ? ValidateRegion(*region, tensor.shape) : region.status();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a stored piece of tensor ", piece.key(), " does not fit its readers' shape ",
                     ShapeString(tensor.shape), ": ", valid.message()));
  }
  const auto [first, last] = Span(*region, tensor.shape);
  if (last < first) return absl::OkStatus();
  // Groups starting at or before the piece's last element, scanned back while one of them (or
  // an earlier one) still reaches the piece's first.
  auto end = std::upper_bound(tensor.groups.begin(), tensor.groups.end(), last,
                              [&](int64_t v, int g) { return v < groups_[g].first; });
  int kept = -1;
  for (int64_t i = (end - tensor.groups.begin()) - 1; i >= 0 && tensor.max_last[i] >= first; --i) {
    ReadGroup& g = groups_[tensor.groups[i]];
    if (g.last < first || !BoxesMeet(g.region, *region)) continue;
    absl::StatusOr<int64_t> overlap = OverlapElements(g.region, *region, tensor.shape);
    if (!overlap.ok()) return overlap.status();
    if (*overlap == 0) continue;
    if (kept < 0) kept = KeepPiece(found->second, piece);
    g.covered += *overlap;
    g.pieces.push_back(kept);
  }
  return absl::OkStatus();
}

int ManifestShareBuilder::KeepPiece(int tensor, const pb::StoredPiece& piece) {
  pb::SharedPiece shared;
  shared.set_tensor_id(tensor);
  shared.set_file_id(FileId(piece.file()));
  *shared.mutable_region() = piece.region();
  shared.set_byte_offset(piece.byte_offset());
  shared.set_byte_length(piece.byte_length());
  shared.set_xxh3_64(piece.xxh3_64());
  shared.set_writer_rank(piece.writer_rank());
  *shared.mutable_block_xxh3() = piece.block_xxh3();
  shared.set_codec(piece.codec());
  shared.set_stored_length(piece.stored_length());
  shared.set_raw_xxh3_64(piece.raw_xxh3_64());
  shared.set_codec_chunk_bytes(piece.codec_chunk_bytes());
  piece_file_.push_back(shared.file_id());
  piece_tensor_.push_back(tensor);
  piece_offsets_.push_back(static_cast<int64_t>(piece_records_.size()));
  AppendMessageField(pb::ManifestShare::kPiecesFieldNumber, shared, &piece_records_);
  pb::SharedPiece described;
  described.set_tensor_id(tensor);
  *described.mutable_region() = piece.region();
  unread_offsets_.push_back(static_cast<int64_t>(unread_records_.size()));
  AppendMessageField(pb::ManifestShare::kUnreadPiecesFieldNumber, described, &unread_records_);
  return static_cast<int>(piece_offsets_.size() - 1);
}

int ManifestShareBuilder::FileId(const std::string& name) {
  auto [it, added] = file_of_name_.try_emplace(name, static_cast<int>(file_names_.size()));
  if (added) file_names_.push_back(name);
  return it->second;
}

absl::Status ManifestShareBuilder::Finish(const pb::Manifest& head, absl::string_view path) {
  format_version_ = head.format_version();
  checksum_block_bytes_ = head.checksum_block_bytes();
  object_generation_ = head.object_generation();
  tensor_meta_.assign(tensors_.size(), pb::TensorMeta());
  for (const pb::TensorMeta& t : head.tensors()) {
    auto it = tensor_of_key_.find(t.key());
    if (it != tensor_of_key_.end()) tensor_meta_[it->second] = t;
  }
  file_meta_.assign(file_names_.size(), pb::DataFile());
  for (const pb::DataFile& f : head.files()) {
    auto it = file_of_name_.find(f.name());
    if (it != file_of_name_.end()) file_meta_[it->second] = f;
  }
  file_of_name_.clear();
  for (const ReadGroup& g : groups_) {
    if (g.covered == g.elements) continue;
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", path, " stores ", g.covered, " of the ", g.elements, " elements of tensor ",
        tensors_[g.tensor].key, " ", g.region.DebugString(), " that rank ", g.first_rank,
        " reads (its pieces do not tile the region exactly)"));
  }
  return absl::OkStatus();
}

std::string ManifestShareBuilder::ShareOf(int rank) const {
  std::vector<int32_t> pieces;
  std::vector<int> tensors;
  for (int g : groups_of_rank_[rank]) {
    pieces.insert(pieces.end(), groups_[g].pieces.begin(), groups_[g].pieces.end());
    tensors.push_back(groups_[g].tensor);
  }
  std::sort(pieces.begin(), pieces.end());
  pieces.erase(std::unique(pieces.begin(), pieces.end()), pieces.end());
  return Assemble(pieces, {}, std::move(tensors));
}

std::string ManifestShareBuilder::ShareOfPieces(absl::Span<const int32_t> read,
                                                absl::Span<const int32_t> unread,
                                                absl::Span<const std::string> keys) const {
  std::vector<int> tensors;
  for (const std::string& key : keys) {
    auto it = tensor_of_key_.find(key);
    if (it != tensor_of_key_.end()) tensors.push_back(it->second);
  }
  return Assemble(read, unread, std::move(tensors));
}

absl::string_view ManifestShareBuilder::Record(const std::string& records,
                                               const std::vector<int64_t>& offsets, int32_t id) {
  const int64_t begin = offsets[id];
  const int64_t end = id + 1 < static_cast<int32_t>(offsets.size())
                          ? offsets[id + 1]
                          : static_cast<int64_t>(records.size());
  return absl::string_view(records).substr(begin, end - begin);
}

std::string ManifestShareBuilder::Assemble(absl::Span<const int32_t> read,
                                           absl::Span<const int32_t> unread,
                                           std::vector<int> tensors) const {
  const int32_t kept = static_cast<int32_t>(piece_offsets_.size());
  std::vector<int> files;
  std::string records;
  for (int32_t id : read) {
    if (id < 0 || id >= kept) continue;
    absl::StrAppend(&records, Record(piece_records_, piece_offsets_, id));
    files.push_back(piece_file_[id]);
    tensors.push_back(piece_tensor_[id]);
  }
  for (int32_t id : unread) {
    if (id < 0 || id >= kept) continue;
    absl::StrAppend(&records, Record(unread_records_, unread_offsets_, id));
    tensors.push_back(piece_tensor_[id]);
  }
  for (std::vector<int>* ids : {&tensors, &files}) {
    std::sort(ids->begin(), ids->end());
    ids->erase(std::unique(ids->begin(), ids->end()), ids->end());
  }
  pb::ManifestShare head;
  head.set_format_version(format_version_);
  head.set_checksum_block_bytes(checksum_block_bytes_);
  head.set_object_generation(object_generation_);
  for (int t : tensors) {
    *head.add_tensors() = tensor_meta_[t];
    head.add_tensor_ids(t);
  }
  for (int f : files) {
    *head.add_files() = file_meta_[f];
    head.add_file_ids(f);
  }
  // Fields may come in any order: the head's, then the piece records as kept.
  std::string out = head.SerializeAsString();
  out += records;
  return out;
}

}  // namespace ckpt::coordinator
