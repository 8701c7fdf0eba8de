// A rank's description (pb::RankState) split as the coordinator keeps it and as a worker may
// send it (issue 16): its layout class, which ranks of different data-parallel replicas share
// (the piece list without replica ids and flat range values, planner/rank_pieces.h, plus the
// rest of the description but the rank), and the rank's own column (its replica ids and flat
// ranges). Once the coordinator holds a class, a worker sends the class's digest and the
// column (pb::PieceListReference) instead of every piece: at 100k GPT ranks ~1.5 KB a rank
// instead of ~21 KB.
//
// A description has one digest however it is sent (DescriptionDigest): SHA-256 over a version
// tag, the class digest, the rank and the column's deterministic serialization. A description
// with compact tensors (proto/compact_convert.h) is not split (its pieces are expanded by the
// coordinator): its digest is RankStateDigest, of what the rank sent.
//
// Digests are of this build's forms (the interning key is not a wire format): processes of
// different builds may disagree, and then a reference or a digest-only join is answered
// send_full_state, never misread.
//
// Pure: no gRPC, threads or logging.
#ifndef CKPT_PLANNER_RANK_DESCRIPTION_H_
#define CKPT_PLANNER_RANK_DESCRIPTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/rank_pieces.h"
#include "proto/coordinator.pb.h"

namespace ckpt {

// A description split into its layout class and column.
struct DescriptionSplit {
  RankPieces pieces;         // RankPieces::Describe of the shards (not interned)
  std::string class_rest;    // the RankState without shards and rank, deterministic bytes
  std::string class_digest;  // ClassDigest(pieces.interning_key(), class_rest)
  pb::RankColumn column;     // ColumnOf(pieces)
  std::string digest;        // the description's digest (DescriptionDigest)
};

// Splits `state`, whose deterministic serialization is `serialized` (computed when empty).
// InvalidArgument for a state with compact tensors.
absl::StatusOr<DescriptionSplit> SplitDescription(const pb::RankState& state,
                                                  std::string serialized = std::string());

// The digest of a layout class: its piece list's interning key and the rest of its state.
std::string ClassDigest(absl::string_view list_key, absl::string_view class_rest);

// The digest of the description of rank `rank` with class `class_digest` and `column`.
std::string SplitDescriptionDigest(absl::string_view class_digest, int32_t rank,
                                   const pb::RankColumn& column);

// The digest of `state` however it is sent: its split's for a state without compact tensors,
// else RankStateDigest (of the state as sent).
std::string DescriptionDigest(const pb::RankState& state);

// A rank's column, canonical: distinct replica ids in first-use order.
pb::RankColumn ColumnOf(const RankPieces& pieces);

// The pieces of a rank described by `column` over the interned `list`; InvalidArgument when
// the column does not fit the list (RankPieces::FromColumn).
absl::StatusOr<RankPieces> PiecesOfColumn(std::shared_ptr<const SharedPieceList> list,
                                          const pb::RankColumn& column);

// `state` without its shards (field 2), and without its rank (field 1) when `drop_rank`: every
// other field of its deterministic serialization `serialized`, whatever fields RankState gains.
std::string WireWithoutShards(const std::string& serialized, bool drop_rank = false);

}  // namespace ckpt

#endif  // CKPT_PLANNER_RANK_DESCRIPTION_H_
