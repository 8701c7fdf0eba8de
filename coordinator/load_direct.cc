#include "coordinator/load_direct.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"

namespace ckpt::coordinator {

absl::StatusOr<std::vector<RankPlan>> PlanDirectLoad(const Operation& op) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(op.path);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(), absl::StrCat("cannot load checkpoint ", op.path,
                                                             ": ", reader.status().message()));
  }
  return PlanDirectLoadFrom(op, (*reader)->manifest());
}

absl::StatusOr<std::vector<RankPlan>> PlanDirectLoadFrom(const Operation& op,
                                                         const pb::Manifest& manifest) {
  std::map<std::string, const pb::TensorMeta*> by_key;
  for (const pb::TensorMeta& t : manifest.tensors()) by_key.emplace(t.key(), &t);
  std::vector<RankPlan> plans(op.world_size);
  for (int r = 0; r < op.world_size; ++r) {
    pb::LoadPlanPart part;
    part.set_rank(r);
    part.set_path(op.path);
    const RankPieces& shards = op.ranks[r].shards;
    for (int i = 0; i < shards.size(); ++i) {
      const pb::PieceMeta s = shards.Piece(i);
      const std::string& key = s.tensor().key();
      auto found = by_key.find(key);
      const pb::TensorMeta* stored = found == by_key.end() ? nullptr : found->second;
      if (stored == nullptr) {
        return absl::NotFoundError(absl::StrCat("rank ", r, " asks for tensor ", key,
                                                ", which checkpoint ", op.path, " does not hold"));
      }
      std::vector<int64_t> shape(s.tensor().global_shape().begin(),
                                 s.tensor().global_shape().end());
      std::vector<int64_t> stored_shape(stored->global_shape().begin(),
                                        stored->global_shape().end());
      if (stored->dtype() != s.tensor().dtype() || shape != stored_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " asks for tensor ", key, " as ", pb::DType_Name(s.tensor().dtype()),
            ShapeString(shape), " but checkpoint ", op.path, " holds it as ",
            pb::DType_Name(stored->dtype()), ShapeString(stored_shape)));
      }
      absl::StatusOr<Region> region = RegionFromProto(s.region());
      absl::Status valid = region.ok() ? ValidateRegion(*region, shape) : region.status();
      if (!valid.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " tensor ", key, ": ", valid.message()));
      }
      absl::StatusOr<DType> dtype = DTypeFromProto(s.tensor().dtype());
      if (!dtype.ok()) return dtype.status();
      pb::LoadRead* read = part.add_reads();
      read->set_key(key);
      *read->mutable_region() = s.region();
      read->set_local_index(i);
      read->set_size_bytes(region->NumElements() * DTypeSize(*dtype));
      part.set_total_bytes(part.total_bytes() + read->size_bytes());
    }
    plans[r].bytes = part.total_bytes();
    plans[r].part = part.SerializeAsString();
  }
  return plans;
}

}  // namespace ckpt::coordinator
