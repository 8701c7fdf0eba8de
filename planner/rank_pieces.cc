#include "planner/rank_pieces.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

namespace {

// `piece` without replica id, its flat range (if any) zeroed.
void Strip(pb::PieceMeta* piece) {
  piece->clear_replica_id();
  if (piece->region().has_flat()) piece->mutable_region()->mutable_flat()->Clear();
}

// Appends `values` to `content`: their count, then their bytes.
void AppendInts(const google::protobuf::RepeatedField<int64_t>& values, std::string* content) {
  const int64_t n = values.size();
  content->append(reinterpret_cast<const char*>(&n), sizeof(n));
  content->append(reinterpret_cast<const char*>(values.data()), sizeof(int64_t) * values.size());
}

// Appends the interning key's record of `piece` as Strip would leave it (no replica id, its
// flat range's values ignored), read in place: whether tensor and region are present, the
// tensor's size and wire form, the region's offsets and lengths, whether it has a flat range.
// (Copying each piece to strip it was a tenth of a large gather's CPU.)
void AppendKey(const pb::PieceMeta& piece, std::string* content) {
  const pb::TensorMeta& tensor = piece.tensor();
  const int64_t n = static_cast<int64_t>(tensor.ByteSizeLong());
  const char present[2] = {static_cast<char>(piece.has_tensor()),
                           static_cast<char>(piece.has_region())};
  content->append(present, 2);
  const size_t at = content->size();
  content->resize(at + sizeof(n) + static_cast<size_t>(n));
  uint8_t* out = reinterpret_cast<uint8_t*>(content->data() + at);
  std::memcpy(out, &n, sizeof(n));
  tensor.SerializeWithCachedSizesToArray(out + sizeof(n));
  AppendInts(piece.region().offsets(), content);
  AppendInts(piece.region().lengths(), content);
  content->push_back(static_cast<char>(piece.region().has_flat()));
}

}  // namespace

RankPieces::RankPieces(std::vector<pb::PieceMeta>&& pieces) {
  if (pieces.empty()) return;
  auto list = std::make_shared<SharedPieceList>();
  auto column = std::make_shared<Column>();
  list->flat_slot.reserve(pieces.size());
  column->replica.reserve(pieces.size());
  absl::flat_hash_map<std::vector<int64_t>, int32_t> replica_index;
  for (pb::PieceMeta& piece : pieces) {
    column->replica.push_back(ReplicaIndex(piece.replica_id(), &replica_index, column.get()));
    if (piece.region().has_flat()) {
      list->flat_slot.push_back(list->flat_pieces++);
      column->flats.emplace_back(piece.region().flat().start(), piece.region().flat().stop());
    } else {
      list->flat_slot.push_back(-1);
    }
    AppendKey(piece, &content_);
    Strip(&piece);
  }
  list->pieces = std::move(pieces);
  list_ = std::move(list);
  column_ = std::move(column);
}

const RankPieces::Column& RankPieces::column() const {
  static const Column* const kNone = new Column();
  return column_ != nullptr ? *column_ : *kNone;
}

int32_t RankPieces::ReplicaIndex(const google::protobuf::RepeatedField<int64_t>& replica,
                                 absl::flat_hash_map<std::vector<int64_t>, int32_t>* index,
                                 Column* column) {
  constexpr int32_t kScanned = 8;  // a rank's pieces have a few distinct replica ids
  std::vector<std::vector<int64_t>>& replica_ids = column->replica_ids;
  auto same = [&](int32_t k) {
    return std::equal(replica.begin(), replica.end(), replica_ids[k].begin(), replica_ids[k].end());
  };
  if (!column->replica.empty() && same(column->replica.back())) return column->replica.back();
  const int32_t distinct = static_cast<int32_t>(replica_ids.size());
  for (int32_t k = 0; k < std::min(distinct, kScanned); ++k) {
    if (same(k)) return k;
  }
  std::vector<int64_t> id(replica.begin(), replica.end());
  if (distinct >= kScanned) {
    if (index->empty()) {
      for (int32_t k = 0; k < distinct; ++k) index->emplace(replica_ids[k], k);
    }
    auto [it, inserted] = index->try_emplace(id, distinct);
    if (!inserted) return it->second;
  }
  column->main.push_back(std::all_of(id.begin(), id.end(), [](int64_t c) { return c == 0; }));
  replica_ids.push_back(std::move(id));
  return distinct;
}

RankPieces RankPieces::Describe(const google::protobuf::RepeatedPtrField<pb::PieceMeta>& pieces) {
  RankPieces out;
  out.described_size_ = pieces.size();
  auto column = std::make_shared<Column>();
  column->replica.reserve(pieces.size());
  absl::flat_hash_map<std::vector<int64_t>, int32_t> replica_index;
  for (const pb::PieceMeta& piece : pieces) {
    column->replica.push_back(ReplicaIndex(piece.replica_id(), &replica_index, column.get()));
    if (piece.region().has_flat()) {
      column->flats.emplace_back(piece.region().flat().start(), piece.region().flat().stop());
    }
    AppendKey(piece, &out.content_);
  }
  out.column_ = std::move(column);
  return out;
}

absl::StatusOr<RankPieces> RankPieces::FromColumn(std::shared_ptr<const SharedPieceList> list,
                                                  std::vector<std::vector<int64_t>> replica_ids,
                                                  std::vector<int32_t> replica_of_piece,
                                                  std::vector<std::pair<int64_t, int64_t>> flats) {
  if (list == nullptr) return absl::InvalidArgumentError("no piece list to describe by");
  const size_t pieces = list->pieces.size();
  if (replica_of_piece.size() != pieces) {
    return absl::InvalidArgumentError(absl::StrCat("the column names ", replica_of_piece.size(),
                                                   " pieces; the layout class has ", pieces));
  }
  if (flats.size() != static_cast<size_t>(list->flat_pieces)) {
    return absl::InvalidArgumentError(absl::StrCat("the column has ", flats.size(),
                                                   " flat ranges; the layout class has ",
                                                   list->flat_pieces, " flat pieces"));
  }
  if (replica_ids.size() > std::max<size_t>(pieces, 1)) {
    return absl::InvalidArgumentError(absl::StrCat("the column has ", replica_ids.size(),
                                                   " replica ids for ", pieces, " pieces"));
  }
  for (size_t i = 0; i < pieces; ++i) {
    if (replica_of_piece[i] < 0 || static_cast<size_t>(replica_of_piece[i]) >= replica_ids.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece ", i, " of the column names replica id ", replica_of_piece[i], " of ",
                       replica_ids.size()));
    }
  }
  auto column = std::make_shared<Column>();
  column->replica = std::move(replica_of_piece);
  column->flats = std::move(flats);
  for (const std::vector<int64_t>& id : replica_ids) {
    column->main.push_back(std::all_of(id.begin(), id.end(), [](int64_t c) { return c == 0; }));
  }
  column->replica_ids = std::move(replica_ids);
  RankPieces out;
  out.list_ = std::move(list);
  out.column_ = std::move(column);
  return out;
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
  const Column& c = column();
  int64_t bytes = static_cast<int64_t>(c.replica.capacity() * sizeof(int32_t) +
                                       c.flats.capacity() * sizeof(c.flats[0]) + c.main.size() / 8 +
                                       content_.capacity());
  for (const std::vector<int64_t>& r : c.replica_ids) bytes += r.capacity() * sizeof(int64_t) + 24;
  return bytes;
}

void PieceListInterner::Intern(RankPieces* rank,
                               const google::protobuf::RepeatedPtrField<pb::PieceMeta>& source) {
  if (rank->list_ != nullptr || source.empty()) return;
  std::shared_ptr<const SharedPieceList> list = Find(rank->content_);
  if (list == nullptr) {
    auto built = std::make_shared<SharedPieceList>();
    built->pieces.assign(source.begin(), source.end());
    built->flat_slot.reserve(source.size());
    for (pb::PieceMeta& piece : built->pieces) {
      built->flat_slot.push_back(piece.region().has_flat() ? built->flat_pieces++ : -1);
      Strip(&piece);
    }
    list = std::move(built);
    Add(std::move(rank->content_), list);
  }
  // Frees the key's buffer: assigning an empty string would keep its capacity (libstdc++).
  std::string().swap(rank->content_);
  rank->list_ = std::move(list);
}

std::shared_ptr<const SharedPieceList> PieceListInterner::Find(const std::string& content) const {
  auto it = lists_.find(content);
  return it == lists_.end() ? nullptr : it->second.lock();
}

void PieceListInterner::Add(std::string content,
                            const std::shared_ptr<const SharedPieceList>& list) {
  auto [it, inserted] = lists_.insert_or_assign(std::move(content), list);
  if (inserted && lists_.size() >= sweep_at_) {
    absl::erase_if(lists_, [](const auto& entry) { return entry.second.expired(); });
    sweep_at_ = std::max<size_t>(64, 2 * lists_.size());
  }
}

void PieceListInterner::Intern(RankPieces* pieces) {
  if (pieces->list_ == nullptr || pieces->content_.empty()) return;
  if (std::shared_ptr<const SharedPieceList> kept = Find(pieces->content_)) {
    pieces->list_ = std::move(kept);
  } else {
    Add(std::move(pieces->content_), pieces->list_);
  }
  std::string().swap(pieces->content_);
}

int64_t PieceListInterner::LiveLists() const {
  int64_t live = 0;
  for (const auto& [content, list] : lists_) live += list.expired() ? 0 : 1;
  return live;
}

}  // namespace ckpt
