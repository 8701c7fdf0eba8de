#include "storage/manifest_share.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/region.h"
#include "storage/safetensors.h"

namespace ckpt {
namespace {

absl::Status ShareError(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("manifest share: ", what));
}

// Maps each id of `ids` to its position; DataLoss when `ids` and the list they number differ
// in length or an id repeats.
absl::StatusOr<absl::flat_hash_map<int, int>> IndexIds(
    const google::protobuf::RepeatedField<int32_t>& ids, int listed, absl::string_view what) {
  if (ids.size() != listed) {
    return ShareError(absl::StrCat(listed, " ", what, "s but ", ids.size(), " ", what, " ids"));
  }
  absl::flat_hash_map<int, int> index;
  index.reserve(ids.size());
  for (int i = 0; i < ids.size(); ++i) {
    if (!index.emplace(ids[i], i).second) {
      return ShareError(absl::StrCat(what, " id ", ids[i], " is listed twice"));
    }
  }
  return index;
}

}  // namespace

absl::StatusOr<pb::Manifest> ExpandManifestShare(const pb::ManifestShare& share) {
  absl::StatusOr<absl::flat_hash_map<int, int>> tensors =
      IndexIds(share.tensor_ids(), share.tensors_size(), "tensor");
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<absl::flat_hash_map<int, int>> files =
      IndexIds(share.file_ids(), share.files_size(), "file");
  if (!files.ok()) return files.status();
  pb::Manifest m;
  m.set_format_version(share.format_version());
  m.set_checksum_block_bytes(share.checksum_block_bytes());
  m.set_object_generation(share.object_generation());
  *m.mutable_tensors() = share.tensors();
  *m.mutable_files() = share.files();
  m.mutable_pieces()->Reserve(share.pieces_size());
  for (int i = 0; i < share.pieces_size(); ++i) {
    const pb::SharedPiece& s = share.pieces(i);
    auto tensor = tensors->find(s.tensor_id());
    auto file = files->find(s.file_id());
    if (tensor == tensors->end() || file == files->end()) {
      return ShareError(absl::StrCat("piece ", i, " names ",
                                     tensor == tensors->end() ? "tensor" : "file", " id ",
                                     tensor == tensors->end() ? s.tensor_id() : s.file_id(),
                                     ", which the share does not list"));
    }
    absl::StatusOr<Region> region = RegionFromProto(s.region());
    if (!region.ok()) {
      return ShareError(absl::StrCat("piece ", i, ": ", region.status().message()));
    }
    pb::StoredPiece* p = m.add_pieces();
    p->set_key(share.tensors(tensor->second).key());
    *p->mutable_region() = s.region();
    p->set_file(share.files(file->second).name());
    p->set_entry_name(EncodeEntryName(p->key(), *region));
    p->set_byte_offset(s.byte_offset());
    p->set_byte_length(s.byte_length());
    p->set_xxh3_64(s.xxh3_64());
    p->set_writer_rank(s.writer_rank());
    *p->mutable_block_xxh3() = s.block_xxh3();
    p->set_codec(s.codec());
    p->set_stored_length(s.stored_length());
    p->set_raw_xxh3_64(s.raw_xxh3_64());
    p->set_codec_chunk_bytes(s.codec_chunk_bytes());
  }
  return m;
}

absl::StatusOr<std::vector<pb::StoredPiece>> ExpandUnreadPieces(const pb::ManifestShare& share) {
  absl::StatusOr<absl::flat_hash_map<int, int>> tensors =
      IndexIds(share.tensor_ids(), share.tensors_size(), "tensor");
  if (!tensors.ok()) return tensors.status();
  std::vector<pb::StoredPiece> pieces;
  pieces.reserve(share.unread_pieces_size());
  for (int i = 0; i < share.unread_pieces_size(); ++i) {
    const pb::SharedPiece& s = share.unread_pieces(i);
    auto tensor = tensors->find(s.tensor_id());
    if (tensor == tensors->end()) {
      return ShareError(absl::StrCat("unread piece ", i, " names tensor id ", s.tensor_id(),
                                     ", which the share does not list"));
    }
    const pb::TensorMeta& meta = share.tensors(tensor->second);
    absl::StatusOr<Region> region = RegionFromProto(s.region());
    const std::vector<int64_t> shape(meta.global_shape().begin(), meta.global_shape().end());
    absl::Status valid = region.ok() ? ValidateRegion(*region, shape) : region.status();
    if (!valid.ok()) {
      return ShareError(
          absl::StrCat("unread piece ", i, " of tensor ", meta.key(), ": ", valid.message()));
    }
    pb::StoredPiece& p = pieces.emplace_back();
    p.set_key(meta.key());
    *p.mutable_region() = s.region();
  }
  return pieces;
}

}  // namespace ckpt
