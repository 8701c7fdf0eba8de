#include "coordinator/load_direct.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/manifest_share_builder.h"
#include "proto/convert.h"
#include "proto/coordinator.pb.h"
#include "sharding/region.h"
#include "storage/checkpoint_reader.h"

namespace ckpt::coordinator {

namespace {

// The parts of PlanDirectLoadFrom, each with its rank's manifest share when `shares` is set.
absl::StatusOr<std::vector<RankPlan>> PlanDirectParts(const Operation& op,
                                                      const pb::Manifest& manifest,
                                                      const ManifestShareBuilder* shares);

// Hands every read of every rank of `op` to `shares`; InvalidArgument naming the rank and
// tensor for a region outside the shape the rank gives.
absl::Status AddReads(const Operation& op, ManifestShareBuilder& shares) {
  for (int r = 0; r < op.world_size; ++r) {
    const RankPieces& pieces = op.ranks[r].shards;
    for (int i = 0; i < pieces.size(); ++i) {
      const pb::PieceMeta s = pieces.Piece(i);
      const std::vector<int64_t> shape(s.tensor().global_shape().begin(),
                                       s.tensor().global_shape().end());
      absl::StatusOr<Region> region = RegionFromProto(s.region());
      absl::Status valid = region.ok() ? ValidateRegion(*region, shape) : region.status();
      if (!valid.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " tensor ", s.tensor().key(), ": ", valid.message()));
      }
      shares.AddRead(r, s.tensor().key(), shape, *region);
    }
  }
  return absl::OkStatus();
}

// How long the planning of a load from an object store may wait for the store (the real
// clock's: an operation's phase deadline is the coordinator's clock, which tests fake).
constexpr absl::Duration kStoreTimeout = absl::Minutes(5);

}  // namespace

absl::StatusOr<StreamedLoad> StreamLoad(
    const Operation& op, const std::function<void(const pb::StoredPiece&)>& on_kept) {
  auto cannot = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("cannot load checkpoint ", op.path, ": ", s.message()));
  };
  const absl::Time deadline = absl::Now() + kStoreTimeout;
  StreamedLoad out;
  out.shares = std::make_unique<ManifestShareBuilder>(op.world_size);
  ManifestShareBuilder& shares = *out.shares;
  CKPT_RETURN_IF_ERROR(AddReads(op, shares));
  // A piece that does not fit its readers' shape is reported after the shape checks below,
  // which name the rank.
  absl::Status piece_error;
  // A directory's manifest streams past; an object store's comes in one GET (storage/
  // checkpoint_reader.h StreamCheckpointManifest), its head keeping the object generation
  // every share then carries.
  absl::StatusOr<pb::Manifest> head = StreamCheckpointManifest(
      op.path,
      [&](int64_t, pb::StoredPiece& piece) {
        if (!piece_error.ok()) return absl::OkStatus();
        const int64_t kept = shares.pieces_kept();
        piece_error = shares.AddPiece(piece);
        if (on_kept && shares.pieces_kept() > kept) on_kept(piece);
        return absl::OkStatus();
      },
      deadline);
  if (!head.ok()) return cannot(head.status());
  // Every data file is there at its recorded size (the workers check the headers of those
  // their shares name; a missing or truncated file fails the load here, before any rank reads).
  if (absl::Status files = CheckDataFileSizes(op.path, *head, deadline); !files.ok()) {
    return cannot(files);
  }
  if (piece_error.ok()) piece_error = shares.Finish(*head, op.path);
  if (!piece_error.ok()) {
    // Name the rank asking for a tensor the checkpoint lacks or with another shape, when one
    // does (its reads then met no piece, or pieces that do not fit).
    absl::StatusOr<std::vector<RankPlan>> checked = PlanDirectParts(op, *head, nullptr);
    if (!checked.ok()) return checked.status();
    return piece_error.code() == absl::StatusCode::kDataLoss ? piece_error : cannot(piece_error);
  }
  out.head = *std::move(head);
  return out;
}

absl::StatusOr<std::vector<RankPlan>> PlanDirectLoad(const Operation& op) {
  CKPT_ASSIGN_OR_RETURN(StreamedLoad streamed, StreamLoad(op));
  return PlanDirectParts(op, streamed.head, streamed.shares.get());
}

absl::StatusOr<std::vector<RankPlan>> PlanDirectLoadFrom(const Operation& op,
                                                         const pb::Manifest& manifest) {
  return PlanDirectParts(op, manifest, nullptr);
}

namespace {

absl::StatusOr<std::vector<RankPlan>> PlanDirectParts(const Operation& op,
                                                      const pb::Manifest& manifest,
                                                      const ManifestShareBuilder* shares) {
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
    if (shares != nullptr) part.set_manifest_share(shares->ShareOf(r));
    plans[r].bytes = part.total_bytes();
    plans[r].part = part.SerializeAsString();
  }
  return plans;
}

}  // namespace

}  // namespace ckpt::coordinator
