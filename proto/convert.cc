#include "proto/convert.h"

#include <array>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ckpt {
namespace {

constexpr absl::string_view kProtoPrefix = "DTYPE_";

absl::Status WithKey(const std::string& key, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("tensor '", key, "': ", s.message()));
}

}  // namespace

pb::DType DTypeToProto(DType dtype) {
  // Proto enumerators are the safetensors names with a DTYPE_ prefix: looked up by name once
  // per dtype (a plan converts millions of pieces).
  static const std::array<pb::DType, std::size(kAllDTypes)> kByDType = [] {
    std::array<pb::DType, std::size(kAllDTypes)> table;
    for (DType d : kAllDTypes) {
      pb::DType value = pb::DTYPE_UNSPECIFIED;
      pb::DType_Parse(absl::StrCat(kProtoPrefix, DTypeName(d)), &value);
      table[static_cast<size_t>(d)] = value;
    }
    return table;
  }();
  const size_t index = static_cast<size_t>(dtype);
  return index < kByDType.size() ? kByDType[index] : pb::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> DTypeFromProto(int value) {
  if (value == pb::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError("dtype is DTYPE_UNSPECIFIED");
  }
  if (!pb::DType_IsValid(value)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype enum value ", value));
  }
  const std::string& name = pb::DType_Name(static_cast<pb::DType>(value));
  auto dtype = ParseDType(absl::string_view(name).substr(kProtoPrefix.size()));
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", name, " has no sharding counterpart: ", dtype.status().message()));
  }
  return *dtype;
}

pb::FlatRange FlatRangeToProto(const FlatRange& range) {
  pb::FlatRange out;
  out.set_start(range.start);
  out.set_stop(range.stop);
  return out;
}

absl::StatusOr<FlatRange> FlatRangeFromProto(const pb::FlatRange& range) {
  if (range.start() < 0 || range.start() > range.stop()) {
    return absl::InvalidArgumentError(
        absl::StrCat("flat range [", range.start(), ", ", range.stop(), ") is not a valid range"));
  }
  return FlatRange{range.start(), range.stop()};
}

pb::Region RegionToProto(const Region& region) {
  pb::Region out;
  for (int64_t o : region.offsets) out.add_offsets(o);
  for (int64_t l : region.lengths) out.add_lengths(l);
  if (region.flat) *out.mutable_flat() = FlatRangeToProto(*region.flat);
  return out;
}

absl::StatusOr<Region> RegionFromProto(const pb::Region& region) {
  if (region.offsets_size() != region.lengths_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region has ", region.offsets_size(), " offsets but ", region.lengths_size(), " lengths"));
  }
  Region out;
  out.offsets.assign(region.offsets().begin(), region.offsets().end());
  out.lengths.assign(region.lengths().begin(), region.lengths().end());
  for (int i = 0; i < region.offsets_size(); ++i) {
    if (out.offsets[i] < 0 || out.lengths[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("region ", out.DebugString(), " has a negative value at dim ", i));
    }
  }
  if (region.has_flat()) {
    CKPT_ASSIGN_OR_RETURN(out.flat, FlatRangeFromProto(region.flat()));
  }
  return out;
}

pb::TensorMeta TensorMetaToProto(const TensorMeta& meta) {
  pb::TensorMeta out;
  out.set_key(meta.key);
  out.set_dtype(DTypeToProto(meta.dtype));
  for (int64_t d : meta.global_shape) out.add_global_shape(d);
  return out;
}

absl::StatusOr<TensorMeta> TensorMetaFromProto(const pb::TensorMeta& meta) {
  TensorMeta out;
  out.key = meta.key();
  auto dtype = DTypeFromProto(meta.dtype());
  if (!dtype.ok()) return WithKey(out.key, dtype.status());
  out.dtype = *dtype;
  out.global_shape.assign(meta.global_shape().begin(), meta.global_shape().end());
  CKPT_RETURN_IF_ERROR(ValidateTensorMeta(out));
  return out;
}

pb::PieceMeta PieceMetaToProto(const PieceMeta& meta) {
  pb::PieceMeta out;
  *out.mutable_tensor() = TensorMetaToProto(meta.tensor);
  *out.mutable_region() = RegionToProto(meta.region);
  for (int64_t r : meta.replica_id) out.add_replica_id(r);
  return out;
}

absl::StatusOr<PieceMeta> PieceMetaFromProto(const pb::PieceMeta& meta) {
  PieceMeta out;
  CKPT_ASSIGN_OR_RETURN(out.tensor, TensorMetaFromProto(meta.tensor()));
  auto region = RegionFromProto(meta.region());
  if (!region.ok()) return WithKey(out.tensor.key, region.status());
  out.region = *std::move(region);
  out.replica_id.assign(meta.replica_id().begin(), meta.replica_id().end());
  CKPT_RETURN_IF_ERROR(ValidatePieceMeta(out));
  return out;
}

}  // namespace ckpt
