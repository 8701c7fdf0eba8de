// One rank's gathered pieces as layout classes: what ranks of different data-parallel replicas
// share (their piece list with replica ids dropped and flat ranges zeroed, interned so that
// every rank with the same list holds one copy) and what is the rank's own (a compact column
// of its replica ids and flat ranges). At 100k ranks x ~290 pieces the shared lists are a few
// hundred and the columns a few KiB per rank, where whole PieceMeta lists were ~0.5 MiB per rank.
//
// Pure: no gRPC, threads or logging. Not thread-safe (PieceListInterner); a RankPieces may be
// read from any thread once built (its shared list is immutable).
#ifndef CKPT_PLANNER_RANK_PIECES_H_
#define CKPT_PLANNER_RANK_PIECES_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/types.pb.h"

namespace ckpt {

// A piece list shared by ranks: each PieceMeta without replica ids, its flat range (when it has
// one) present but zeroed. Immutable once built.
struct SharedPieceList {
  std::vector<pb::PieceMeta> pieces;
  // Per piece: its slot in a rank's flat ranges (-1: the piece has no flat range).
  std::vector<int32_t> flat_slot;
  int32_t flat_pieces = 0;
};

// One rank's pieces: a shared list plus the rank's replica ids and flat ranges.
class RankPieces {
 public:
  RankPieces() = default;
  // Splits `pieces` (not interned: the list is the rank's own until PieceListInterner::Intern).
  explicit RankPieces(absl::Span<const pb::PieceMeta> pieces)
      : RankPieces(std::vector<pb::PieceMeta>(pieces.begin(), pieces.end())) {}
  // The same, stripping the pieces in place (no copy).
  explicit RankPieces(std::vector<pb::PieceMeta>&& pieces);
  // The rank's own column and the interning key of `pieces`, without a list: the shared list is
  // only built (copied) by PieceListInterner::Intern(rank, pieces) when no equal list is
  // interned, so ranks of a known layout class never copy a piece. Empty until interned.
  static RankPieces Describe(const google::protobuf::RepeatedPtrField<pb::PieceMeta>& pieces);
  // A rank of an interned list (`list`, not null) with its own column (issue 16: a rank that
  // described its pieces by reference to its layout class): `replica_ids` its distinct replica
  // ids, `replica_of_piece` each piece's index into them, `flats` the (start, stop) of each
  // piece with a flat range, in order. InvalidArgument when the column does not fit the list
  // (counts, indexes); the ranges' values are the planner's to check.
  static absl::StatusOr<RankPieces> FromColumn(std::shared_ptr<const SharedPieceList> list,
                                               std::vector<std::vector<int64_t>> replica_ids,
                                               std::vector<int32_t> replica_of_piece,
                                               std::vector<std::pair<int64_t, int64_t>> flats);
  // For tests and hand-built operations: `op.ranks[r].shards = {piece, ...}`.
  RankPieces(std::initializer_list<pb::PieceMeta> pieces)  // NOLINT(runtime/explicit)
      : RankPieces(absl::MakeConstSpan(pieces.begin(), pieces.size())) {}

  int size() const { return list_ == nullptr ? 0 : static_cast<int>(list_->pieces.size()); }
  // Pieces described, also before the list is built (Describe).
  int described_size() const { return list_ == nullptr ? described_size_ : size(); }
  bool empty() const { return size() == 0; }
  void clear() { *this = RankPieces(); }

  // Piece i as the rank described it (shared list + the rank's replica id and flat range).
  pb::PieceMeta Piece(int i) const;
  // Read-only (a const copy: assigning to it would change nothing).
  const pb::PieceMeta operator[](int i) const { return Piece(i); }
  // Every piece, materialized (tests, small operations).
  std::vector<pb::PieceMeta> Pieces() const;
  // Piece i without replica id, its flat range zeroed (see has_flat / flat_*).
  const pb::PieceMeta& shared(int i) const { return list_->pieces[i]; }
  const pb::TensorMeta& tensor(int i) const { return list_->pieces[i].tensor(); }
  bool has_flat(int i) const { return list_->flat_slot[i] >= 0; }
  int64_t flat_start(int i) const { return column_->flats[list_->flat_slot[i]].first; }
  int64_t flat_stop(int i) const { return column_->flats[list_->flat_slot[i]].second; }
  absl::Span<const int64_t> replica_id(int i) const {
    return column_->replica_ids[column_->replica[i]];
  }
  // Replica id all zeros (or empty).
  bool is_main_replica(int i) const { return column_->main[column_->replica[i]]; }

  // The shared list (its identity groups ranks into layout classes; null when empty).
  const SharedPieceList* list() const { return list_.get(); }
  std::shared_ptr<const SharedPieceList> shared_list() const { return list_; }
  // The rank's column (see FromColumn), as Describe or the constructor found it: distinct
  // replica ids in first-use order.
  const std::vector<std::vector<int64_t>>& distinct_replica_ids() const {
    return column().replica_ids;
  }
  const std::vector<int32_t>& replica_of_piece() const { return column().replica; }
  const std::vector<std::pair<int64_t, int64_t>>& flat_ranges() const { return column().flats; }
  // The interning key of the shared list (Describe, until interned): the pieces without
  // replica ids and flat range values, in a form only this build reads.
  const std::string& interning_key() const { return content_; }
  // Bytes of the rank's own part (the column, and the interning key until interned), for
  // accounting.
  int64_t OwnBytes() const;

 private:
  friend class PieceListInterner;

  // The rank's own part, immutable once built and shared by copies (a repeat join hands the
  // kept description's pieces to the operation without copying the column).
  struct Column {
    std::vector<int32_t> replica;                    // per piece: index into replica_ids
    std::vector<std::vector<int64_t>> replica_ids;   // the rank's distinct replica ids
    std::vector<bool> main;                          // per distinct replica id: all zeros
    std::vector<std::pair<int64_t, int64_t>> flats;  // per flat slot: (start, stop)
  };
  const Column& column() const;

  std::shared_ptr<const SharedPieceList> list_;
  std::shared_ptr<const Column> column_;
  std::string content_;         // serialized shared list until interned (the interning key)
  int32_t described_size_ = 0;  // Describe: pieces until the list is built

  // The index in column->replica_ids of `replica` (added when new); `index` is used once there
  // are more than a few distinct ids.
  static int32_t ReplicaIndex(const google::protobuf::RepeatedField<int64_t>& replica,
                              absl::flat_hash_map<std::vector<int64_t>, int32_t>* index,
                              Column* column);
};

// Interns shared lists by content: ranks whose lists are equal get one copy. Entries whose
// list no rank holds any more are dropped as the table grows.
class PieceListInterner {
 public:
  // Replaces `pieces`' own list by the interned copy of an equal one (or interns its own).
  void Intern(RankPieces* pieces);
  // Gives `rank` (from RankPieces::Describe(source)) the interned list equal to `source`
  // stripped, building and interning it when there is none.
  void Intern(RankPieces* rank, const google::protobuf::RepeatedPtrField<pb::PieceMeta>& source);
  // Lists currently interned and alive.
  int64_t LiveLists() const;

 private:
  // The interned list for `content` (null when none is alive).
  std::shared_ptr<const SharedPieceList> Find(const std::string& content) const;
  void Add(std::string content, const std::shared_ptr<const SharedPieceList>& list);

  absl::flat_hash_map<std::string, std::weak_ptr<const SharedPieceList>> lists_;
  size_t sweep_at_ = 64;
};

}  // namespace ckpt

#endif  // CKPT_PLANNER_RANK_PIECES_H_
