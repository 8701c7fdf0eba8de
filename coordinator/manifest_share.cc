#include "coordinator/manifest_share.h"

#include <string>

#include "absl/container/flat_hash_set.h"

namespace ckpt::coordinator {

pb::Manifest ManifestShareFor(const pb::Manifest& manifest, const pb::LoadPlanPart& part) {
  std::vector<bool> used(static_cast<size_t>(manifest.pieces_size()), false);
  for (const pb::LoadWaveEntry& wave : part.waves()) {
    for (const pb::LoadUnitEntry& unit : wave.units()) {
      if (unit.piece() >= 0 && unit.piece() < manifest.pieces_size()) {
        used[static_cast<size_t>(unit.piece())] = true;
      }
    }
  }
  absl::flat_hash_set<std::string> keys, files;
  for (const pb::LoadRequestEntry& request : part.requests()) keys.insert(request.key());
  pb::Manifest share;
  share.set_format_version(manifest.format_version());
  share.set_checksum_block_bytes(manifest.checksum_block_bytes());
  share.set_object_generation(manifest.object_generation());
  share.mutable_pieces()->Reserve(manifest.pieces_size());
  for (int i = 0; i < manifest.pieces_size(); ++i) {
    pb::StoredPiece* piece = share.add_pieces();
    if (!used[static_cast<size_t>(i)]) continue;
    *piece = manifest.pieces(i);
    keys.insert(piece->key());
    files.insert(piece->file());
  }
  for (const pb::TensorMeta& tensor : manifest.tensors()) {
    if (keys.contains(tensor.key())) *share.add_tensors() = tensor;
  }
  for (const pb::DataFile& file : manifest.files()) {
    if (files.contains(file.name())) *share.add_files() = file;
  }
  return share;
}

}  // namespace ckpt::coordinator
