// A tensor's identity and global description (key, dtype, global shape), and one piece's
// metadata (tensor, region, replica id) — the sharding-side twins of proto TensorMeta and
// PieceMeta. A rank's piece with its rank attached is a TensorPiece (layout.h).
#ifndef CKPT_SHARDING_TENSOR_META_H_
#define CKPT_SHARDING_TENSOR_META_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/region.h"

namespace ckpt {

struct TensorMeta {
  std::string key;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;

  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.key == b.key && a.dtype == b.dtype && a.global_shape == b.global_shape;
  }
};

struct PieceMeta {
  TensorMeta tensor;
  Region region;
  std::vector<int64_t> replica_id;  // all zeros (or empty): the main replica

  friend bool operator==(const PieceMeta& a, const PieceMeta& b) {
    return a.tensor == b.tensor && a.region == b.region && a.replica_id == b.replica_id;
  }
};

// Non-empty key and a shape of non-negative dims with at most 2^62 elements.
absl::Status ValidateTensorMeta(const TensorMeta& meta);

// A valid tensor, a region valid for its shape, non-negative replica id entries. Messages
// name the tensor key.
absl::Status ValidatePieceMeta(const PieceMeta& meta);

// The piece `rank` holds, and back.
TensorPiece ToTensorPiece(const PieceMeta& meta, int64_t rank);
PieceMeta ToPieceMeta(const TensorPiece& piece);

}  // namespace ckpt

#endif  // CKPT_SHARDING_TENSOR_META_H_
