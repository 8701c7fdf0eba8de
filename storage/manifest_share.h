// The worker's side of a ManifestShare (proto/manifest.proto): the compact part of a
// checkpoint's manifest that a coordinator sends with one rank's direct load, expanded back into
// the pb::Manifest that CheckpointReader::OpenShare opens. Pure: no I/O.
#ifndef CKPT_STORAGE_MANIFEST_SHARE_H_
#define CKPT_STORAGE_MANIFEST_SHARE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "proto/manifest.pb.h"

namespace ckpt {

// The manifest `share` stands for: its format version, checksum block size, tensors and data
// files, and its pieces with their keys, file names and entry names (EncodeEntryName) filled
// in from the ids. DataLoss naming the id when the share is inconsistent: tensor_ids or file_ids
// not parallel to their lists, an id listed twice, a piece naming an id not listed, or a piece
// without a valid region. What the pieces say about the checkpoint is checked by OpenShare.
absl::StatusOr<pb::Manifest> ExpandManifestShare(const pb::ManifestShare& share);

// The unread pieces of an exchange load's share (ManifestShare.unread_pieces), each as a
// StoredPiece with only its key and region: what the worker needs of the units it receives
// but does not read. DataLoss naming the piece when it names a tensor id the share does not
// list (or the ids are inconsistent, as above) or its region is not valid for the tensor.
absl::StatusOr<std::vector<pb::StoredPiece>> ExpandUnreadPieces(const pb::ManifestShare& share);

}  // namespace ckpt

#endif  // CKPT_STORAGE_MANIFEST_SHARE_H_
