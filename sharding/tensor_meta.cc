#include "sharding/tensor_meta.h"

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status ValidateTensorMeta(const TensorMeta& meta) {
  if (meta.key.empty()) return absl::InvalidArgumentError("tensor key is empty");
  if (auto n = CheckedNumElements(meta.global_shape); !n.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", meta.key, "': ", n.status().message()));
  }
  return absl::OkStatus();
}

absl::Status ValidatePieceMeta(const PieceMeta& meta) {
  if (absl::Status s = ValidateTensorMeta(meta.tensor); !s.ok()) return s;
  if (absl::Status s = ValidateRegion(meta.region, meta.tensor.global_shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", meta.tensor.key, "': ", s.message()));
  }
  for (int64_t c : meta.replica_id) {
    if (c < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", meta.tensor.key, "' region ",
                                                     meta.region.DebugString(),
                                                     ": negative replica id entry ", c));
    }
  }
  return absl::OkStatus();
}

TensorPiece ToTensorPiece(const PieceMeta& meta, int64_t rank) {
  return TensorPiece{meta.tensor.key,          rank,        meta.tensor.dtype,
                     meta.tensor.global_shape, meta.region, meta.replica_id};
}

PieceMeta ToPieceMeta(const TensorPiece& piece) {
  return PieceMeta{TensorMeta{piece.key, piece.dtype, piece.global_shape}, piece.region,
                   piece.replica_id};
}

}  // namespace ckpt
