#include "planner/rank_pieces.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace ckpt {

RankPieces::RankPieces(absl::Span<const pb::PieceMeta> pieces) {
  if (pieces.empty()) return;
  auto list = std::make_shared<SharedPieceList>();
  list->pieces.reserve(pieces.size());
  list->flat_slot.reserve(pieces.size());
  replica_.reserve(pieces.size());
  absl::flat_hash_map<std::vector<int64_t>, int32_t> replica_index;
  for (const pb::PieceMeta& piece : pieces) {
    pb::PieceMeta& shared = list->pieces.emplace_back(piece);
    std::vector<int64_t> replica(piece.replica_id().begin(), piece.replica_id().end());
    shared.clear_replica_id();
    auto [it, inserted] =
        replica_index.try_emplace(replica, static_cast<int32_t>(replica_ids_.size()));
    if (inserted) {
      main_.push_back(
          std::all_of(replica.begin(), replica.end(), [](int64_t c) { return c == 0; }));
      replica_ids_.push_back(std::move(replica));
    }
    replica_.push_back(it->second);
    if (piece.region().has_flat()) {
      list->flat_slot.push_back(list->flat_pieces++);
      flats_.emplace_back(piece.region().flat().start(), piece.region().flat().stop());
      shared.mutable_region()->mutable_flat()->Clear();
    } else {
      list->flat_slot.push_back(-1);
    }
  }
  for (const pb::PieceMeta& shared : list->pieces) shared.AppendToString(&content_);
  // Piece boundaries are part of the key (two lists never serialize to one string by chance).
  content_.append(reinterpret_cast<const char*>(&list->flat_pieces), sizeof(int32_t));
  for (const pb::PieceMeta& shared : list->pieces) {
    const int64_t n = static_cast<int64_t>(shared.ByteSizeLong());
    content_.append(reinterpret_cast<const char*>(&n), sizeof(n));
  }
  list_ = std::move(list);
}

pb::PieceMeta RankPieces::Piece(int i) const {
  pb::PieceMeta piece = list_->pieces[i];
  for (int64_t c : replica_id(i)) piece.add_replica_id(c);
  if (has_flat(i)) {
    pb::FlatRange* flat = piece.mutable_region()->mutable_flat();
    flat->set_start(flat_start(i));
    flat->set_stop(flat_stop(i));
  }
  return piece;
}

std::vector<pb::PieceMeta> RankPieces::Pieces() const {
  std::vector<pb::PieceMeta> out;
  out.reserve(size());
  for (int i = 0; i < size(); ++i) out.push_back(Piece(i));
  return out;
}

int64_t RankPieces::OwnBytes() const {
  int64_t bytes = static_cast<int64_t>(replica_.capacity() * sizeof(int32_t) +
                                       flats_.capacity() * sizeof(flats_[0]) + main_.size() / 8);
  for (const std::vector<int64_t>& r : replica_ids_) bytes += r.capacity() * sizeof(int64_t) + 24;
  return bytes;
}

void PieceListInterner::Intern(RankPieces* pieces) {
  if (pieces->list_ == nullptr || pieces->content_.empty()) return;
  auto [it, inserted] = lists_.try_emplace(std::move(pieces->content_));
  pieces->content_ = std::string();
  if (std::shared_ptr<const SharedPieceList> kept = it->second.lock()) {
    pieces->list_ = std::move(kept);
    return;
  }
  it->second = pieces->list_;
  if (inserted && lists_.size() >= sweep_at_) {
    absl::erase_if(lists_, [](const auto& entry) { return entry.second.expired(); });
    sweep_at_ = std::max<size_t>(64, 2 * lists_.size());
  }
}

int64_t PieceListInterner::LiveLists() const {
  int64_t live = 0;
  for (const auto& [content, list] : lists_) live += list.expired() ? 0 : 1;
  return live;
}

}  // namespace ckpt
