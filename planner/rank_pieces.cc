#include "planner/rank_pieces.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"

namespace ckpt {

RankPieces::RankPieces(std::vector<pb::PieceMeta>&& pieces) {
  if (pieces.empty()) return;
  auto list = std::make_shared<SharedPieceList>();
  list->flat_slot.reserve(pieces.size());
  replica_.reserve(pieces.size());
  size_t bytes = 0;
  absl::flat_hash_map<std::vector<int64_t>, int32_t> replica_index;
  for (pb::PieceMeta& piece : pieces) {
    replica_.push_back(ReplicaIndex(piece.replica_id(), &replica_index));
    piece.clear_replica_id();
    if (piece.region().has_flat()) {
      list->flat_slot.push_back(list->flat_pieces++);
      flats_.emplace_back(piece.region().flat().start(), piece.region().flat().stop());
      piece.mutable_region()->mutable_flat()->Clear();
    } else {
      list->flat_slot.push_back(-1);
    }
    bytes += piece.ByteSizeLong() + sizeof(int64_t);
  }
  // The interning key: each piece's wire form after its length (so that two lists never
  // serialize to one string by chance).
  content_.resize(bytes);
  uint8_t* at = reinterpret_cast<uint8_t*>(content_.data());
  for (const pb::PieceMeta& piece : pieces) {
    const int64_t n = piece.GetCachedSize();
    std::memcpy(at, &n, sizeof(n));
    at = piece.SerializeWithCachedSizesToArray(at + sizeof(n));
  }
  list->pieces = std::move(pieces);
  list_ = std::move(list);
}

int32_t RankPieces::ReplicaIndex(const google::protobuf::RepeatedField<int64_t>& replica,
                                 absl::flat_hash_map<std::vector<int64_t>, int32_t>* index) {
  constexpr int32_t kScanned = 8;  // a rank's pieces have a few distinct replica ids
  auto same = [&](int32_t k) {
    return std::equal(replica.begin(), replica.end(), replica_ids_[k].begin(),
                      replica_ids_[k].end());
  };
  if (!replica_.empty() && same(replica_.back())) return replica_.back();
  const int32_t distinct = static_cast<int32_t>(replica_ids_.size());
  for (int32_t k = 0; k < std::min(distinct, kScanned); ++k) {
    if (same(k)) return k;
  }
  std::vector<int64_t> id(replica.begin(), replica.end());
  if (distinct >= kScanned) {
    if (index->empty()) {
      for (int32_t k = 0; k < distinct; ++k) index->emplace(replica_ids_[k], k);
    }
    auto [it, inserted] = index->try_emplace(id, distinct);
    if (!inserted) return it->second;
  }
  main_.push_back(std::all_of(id.begin(), id.end(), [](int64_t c) { return c == 0; }));
  replica_ids_.push_back(std::move(id));
  return distinct;
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
