#include "planner/rank_description.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/deterministic.h"
#include "proto/state_digest.h"

namespace ckpt {
namespace {

constexpr char kClassTag[] = "ckpt-layout-class-v1";
constexpr char kDescriptionTag[] = "ckpt-rank-description-v2";

// Appends `n` as 8 bytes (little-endian), so that the digested fields cannot run together.
void AppendLength(uint64_t n, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
}

}  // namespace

std::string WireWithoutShards(const std::string& serialized, bool drop_rank) {
  std::string rest;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(serialized.data()),
                                            static_cast<int>(serialized.size()));
  for (;;) {
    const int start = in.CurrentPosition();
    const uint32_t tag = in.ReadTag();
    if (tag == 0) break;
    if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) break;
    const int field = google::protobuf::internal::WireFormatLite::GetTagFieldNumber(tag);
    if (field == pb::RankState::kShardsFieldNumber ||
        (drop_rank && field == pb::RankState::kRankFieldNumber)) {
      continue;
    }
    rest.append(serialized, start, in.CurrentPosition() - start);
  }
  return rest;
}

std::string ClassDigest(absl::string_view list_key, absl::string_view class_rest) {
  std::string bytes(kClassTag, sizeof(kClassTag));
  AppendLength(list_key.size(), &bytes);
  bytes.append(list_key.data(), list_key.size());
  AppendLength(class_rest.size(), &bytes);
  bytes.append(class_rest.data(), class_rest.size());
  return Sha256(bytes);
}

std::string SplitDescriptionDigest(absl::string_view class_digest, int32_t rank,
                                   const pb::RankColumn& column) {
  std::string bytes(kDescriptionTag, sizeof(kDescriptionTag));
  AppendLength(class_digest.size(), &bytes);
  bytes.append(class_digest.data(), class_digest.size());
  AppendLength(static_cast<uint32_t>(rank), &bytes);
  bytes.append(SerializeDeterministically(column));
  return Sha256(bytes);
}

pb::RankColumn ColumnOf(const RankPieces& pieces) {
  pb::RankColumn column;
  for (const std::vector<int64_t>& id : pieces.distinct_replica_ids()) {
    column.add_replica_ids()->mutable_coordinates()->Add(id.begin(), id.end());
  }
  column.mutable_replica_of_piece()->Add(pieces.replica_of_piece().begin(),
                                         pieces.replica_of_piece().end());
  column.mutable_flat_ranges()->Reserve(2 * static_cast<int>(pieces.flat_ranges().size()));
  for (const auto& [start, stop] : pieces.flat_ranges()) {
    column.add_flat_ranges(start);
    column.add_flat_ranges(stop);
  }
  return column;
}

absl::StatusOr<RankPieces> PiecesOfColumn(std::shared_ptr<const SharedPieceList> list,
                                          const pb::RankColumn& column) {
  if (column.flat_ranges_size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the column has ", column.flat_ranges_size(),
                                                   " flat range bounds (an odd number)"));
  }
  std::vector<std::vector<int64_t>> ids;
  ids.reserve(column.replica_ids_size());
  for (const pb::RankColumn::ReplicaId& id : column.replica_ids()) {
    ids.emplace_back(id.coordinates().begin(), id.coordinates().end());
  }
  std::vector<std::pair<int64_t, int64_t>> flats;
  flats.reserve(column.flat_ranges_size() / 2);
  for (int i = 0; i + 1 < column.flat_ranges_size(); i += 2) {
    flats.emplace_back(column.flat_ranges(i), column.flat_ranges(i + 1));
  }
  return RankPieces::FromColumn(
      std::move(list), std::move(ids),
      std::vector<int32_t>(column.replica_of_piece().begin(), column.replica_of_piece().end()),
      std::move(flats));
}

absl::StatusOr<DescriptionSplit> SplitDescription(const pb::RankState& state,
                                                  std::string serialized) {
  if (state.compact_tensors_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", state.rank(), ": a description with compact tensors is not split by class"));
  }
  if (serialized.empty()) serialized = SerializeDeterministically(state);
  DescriptionSplit split;
  split.pieces = RankPieces::Describe(state.shards());
  split.class_rest = WireWithoutShards(serialized, /*drop_rank=*/true);
  split.class_digest = ClassDigest(split.pieces.interning_key(), split.class_rest);
  split.column = ColumnOf(split.pieces);
  split.digest = SplitDescriptionDigest(split.class_digest, state.rank(), split.column);
  return split;
}

std::string DescriptionDigest(const pb::RankState& state) {
  if (state.compact_tensors_size() > 0) return RankStateDigest(state);
  return SplitDescription(state)->digest;
}

}  // namespace ckpt
