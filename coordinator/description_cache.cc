#include "coordinator/description_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/rank_description.h"
#include "proto/deterministic.h"
#include "proto/state_digest.h"

namespace ckpt::coordinator {

std::string DescriptionCache::Keep(const std::string& job, int world_size, int rank,
                                   const pb::RankState& state, bool* kept,
                                   std::shared_ptr<const RankPieces>* pieces_out,
                                   const pb::RankState* sent, PieceClass* layout_class,
                                   std::string* class_digest) {
  if (kept != nullptr) *kept = false;
  Entry entry;
  // Computed here, outside the lock, from what the rank sent (and digests itself). One
  // serialization serves the digest, the class and the kept rest.
  std::string wire = SerializeDeterministically(state);
  std::shared_ptr<RankPieces> pieces;
  std::string rest_of_class;
  const bool compact = sent != nullptr && sent != &state;
  absl::StatusOr<DescriptionSplit> split =
      compact ? absl::StatusOr<DescriptionSplit>(absl::FailedPreconditionError("compact"))
              : SplitDescription(state, wire);
  if (split.ok()) {
    entry.digest = std::move(split->digest);
    pieces = std::make_shared<RankPieces>(std::move(split->pieces));
    rest_of_class = std::move(split->class_rest);
    if (class_digest != nullptr) *class_digest = std::move(split->class_digest);
  } else {
    entry.digest = RankStateDigest(compact ? *sent : state);
    // The pieces as layout classes (at 10k GPT ranks ~45 MiB of own columns where the
    // serialized descriptions took 214 MiB and the parsed ones ~1.5 GiB).
    pieces = std::make_shared<RankPieces>(RankPieces::Describe(state.shards()));
  }
  entry.rest = std::make_shared<const std::string>(WireWithoutShards(wire));
  std::string digest = entry.digest;
  std::lock_guard<std::mutex> lock(mu_);
  // Only the first description of each layout class has its pieces copied.
  pieces_.Intern(pieces.get(), state.shards());
  entry.bytes = static_cast<int64_t>(entry.rest->size()) + pieces->OwnBytes();  // key freed
  if (pieces_out != nullptr) *pieces_out = pieces;
  if (layout_class != nullptr && split.ok()) {
    *layout_class = PieceClass{pieces->shared_list(),
                               std::make_shared<const std::string>(std::move(rest_of_class))};
  }
  entry.pieces = std::move(pieces);
  const bool stored = Store(job, world_size, rank, std::move(entry));
  if (kept != nullptr) *kept = stored;
  return digest;
}

bool DescriptionCache::KeepReferenced(const std::string& job, int world_size, int rank,
                                      std::string digest, std::shared_ptr<const RankPieces> pieces,
                                      std::string rest) {
  Entry entry;
  entry.digest = std::move(digest);
  entry.rest = std::make_shared<const std::string>(std::move(rest));
  entry.bytes = static_cast<int64_t>(entry.rest->size()) + pieces->OwnBytes();
  entry.pieces = std::move(pieces);
  std::lock_guard<std::mutex> lock(mu_);
  return Store(job, world_size, rank, std::move(entry));
}

bool DescriptionCache::Store(const std::string& job, int world_size, int rank, Entry entry) {
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.world_size != world_size) {
    DropJobLocked(it);  // the job was replaced: another world size
    it = jobs_.end();
  }
  if (it != jobs_.end()) {
    auto old = it->second.ranks.find(rank);
    if (old != it->second.ranks.end()) {
      stats_.bytes -= old->second.bytes;
      --stats_.entries;
      it->second.ranks.erase(old);
    }
  }
  // The bound: drop the least recently used other jobs first.
  while (stats_.bytes + entry.bytes > max_bytes_ && !recency_.empty() &&
         (it == jobs_.end() || recency_.back() != job)) {
    auto victim = jobs_.find(recency_.back());
    stats_.evictions += static_cast<int64_t>(victim->second.ranks.size());
    DropJobLocked(victim);
  }
  if (stats_.bytes + entry.bytes > max_bytes_) {
    ++stats_.evictions;  // cannot fit without dropping this job's other ranks: not kept
    return false;
  }
  if (it == jobs_.end()) {
    recency_.push_front(job);
    it = jobs_.emplace(job, JobEntries{world_size, {}, recency_.begin()}).first;
  }
  TouchLocked(it->second);
  stats_.bytes += entry.bytes;
  ++stats_.entries;
  it->second.ranks[rank] = std::move(entry);
  return true;
}

absl::StatusOr<std::shared_ptr<const pb::RankState>> DescriptionCache::Lookup(
    const std::string& job, int world_size, int rank, const std::string& digest,
    std::shared_ptr<const RankPieces>* pieces_out) {
  std::unique_lock<std::mutex> lock(mu_);
  auto refuse = [&](absl::string_view why) {
    ++stats_.misses;
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job, " rank ", rank, " sent only the digest ", ShortDigest(digest),
                     " of its state description, but ", why, ": send the full description"));
  };
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return refuse("the coordinator keeps no description of this job");
  if (it->second.world_size != world_size) {
    return refuse(absl::StrCat("the kept descriptions are of world size ", it->second.world_size,
                               ", not ", world_size));
  }
  auto entry = it->second.ranks.find(rank);
  if (entry == it->second.ranks.end()) {
    return refuse("the coordinator keeps no description of this rank");
  }
  if (entry->second.digest != digest) {
    return refuse(
        absl::StrCat("the kept description's digest is ", ShortDigest(entry->second.digest)));
  }
  ++stats_.hits;
  TouchLocked(it->second);
  std::shared_ptr<const std::string> rest = entry->second.rest;
  std::shared_ptr<const RankPieces> pieces = entry->second.pieces;
  lock.unlock();  // rebuilt outside the lock
  auto state = std::make_shared<pb::RankState>();
  if (!state->ParseFromString(*rest)) {
    return absl::InternalError(
        absl::StrCat("job ", job, " rank ", rank, ": the kept description no longer parses"));
  }
  if (pieces_out != nullptr) {
    *pieces_out = std::move(pieces);
    return std::shared_ptr<const pb::RankState>(std::move(state));
  }
  state->mutable_shards()->Reserve(pieces->size());
  for (int i = 0; i < pieces->size(); ++i) *state->add_shards() = pieces->Piece(i);
  return std::shared_ptr<const pb::RankState>(std::move(state));
}

void DescriptionCache::DropRank(const std::string& job, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  auto entry = it->second.ranks.find(rank);
  if (entry == it->second.ranks.end()) return;
  stats_.bytes -= entry->second.bytes;
  --stats_.entries;
  it->second.ranks.erase(entry);
  if (it->second.ranks.empty()) DropJobLocked(it);
}

void DescriptionCache::DropJob(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) DropJobLocked(it);
}

DescriptionCacheStats DescriptionCache::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DescriptionCache::DropJobLocked(std::map<std::string, JobEntries>::iterator it) {
  for (const auto& [rank, entry] : it->second.ranks) {
    stats_.bytes -= entry.bytes;
    --stats_.entries;
  }
  recency_.erase(it->second.recency);
  jobs_.erase(it);
}

void DescriptionCache::TouchLocked(JobEntries& entries) {
  recency_.splice(recency_.begin(), recency_, entries.recency);
}

}  // namespace ckpt::coordinator
