// Conversions between the wire types of proto/types.proto and the sharding/ library's types;
// the only place they live. Conversions from proto validate what they read (unknown dtype
// values, offsets/lengths count mismatches, regions outside the tensor, negative replica
// ids) and return InvalidArgument naming the tensor key where one is known.
#ifndef CKPT_PROTO_CONVERT_H_
#define CKPT_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "proto/types.pb.h"
#include "sharding/dtype.h"
#include "sharding/region.h"
#include "sharding/tensor_meta.h"

namespace ckpt {

pb::DType DTypeToProto(DType dtype);
// DTYPE_UNSPECIFIED and values this build does not know are errors.
absl::StatusOr<DType> DTypeFromProto(int value);

pb::FlatRange FlatRangeToProto(const FlatRange& range);
// start <= stop, both non-negative.
absl::StatusOr<FlatRange> FlatRangeFromProto(const pb::FlatRange& range);

pb::Region RegionToProto(const Region& region);
// Structural checks only (equal offsets/lengths counts, non-negative values, a sane flat
// range); use ValidateRegion or PieceMetaFromProto to check it against a tensor shape.
absl::StatusOr<Region> RegionFromProto(const pb::Region& region);

pb::TensorMeta TensorMetaToProto(const TensorMeta& meta);
absl::StatusOr<TensorMeta> TensorMetaFromProto(const pb::TensorMeta& meta);

pb::PieceMeta PieceMetaToProto(const PieceMeta& meta);
// Fully validated: the region must lie inside the tensor's shape.
absl::StatusOr<PieceMeta> PieceMetaFromProto(const pb::PieceMeta& meta);

}  // namespace ckpt

#endif  // CKPT_PROTO_CONVERT_H_
