// The last state description (pb::RankState) each rank of each job joined with, kept so that a
// repeat operation with an unchanged layout skips the gather: the rank sends only the digest of
// its description (proto/state_digest.h, SHA-256) and the coordinator uses the kept one.
//
// The digest kept is always the one computed here from the description the rank sent (or, for
// a description sent by reference, from its layout class and column), never one a rank
// supplied, so a match proves (up to SHA-256 collisions) that the rank's
// description is the one whose expansion is kept. Memory is bounded: a job's entries are dropped
// when it ends (the service drops them when its last rank detaches) or is replaced (another world
// size), and the least recently used jobs' when the bytes kept pass the bound. Thread-safe (its own
// lock, held only for map updates: digests are computed and descriptions converted outside it).
//
// A description is kept as layout classes (planner/rank_pieces.h): its pieces as a shared piece
// list, interned here so that ranks of different data-parallel replicas keep one copy, plus the
// rank's own replica ids and flat ranges; the rest of it (layouts, memory kinds, ...) serialized.
// The bytes counted are each rank's own part (the shared lists, one per layout class, are not).
#ifndef CKPT_COORDINATOR_DESCRIPTION_CACHE_H_
#define CKPT_COORDINATOR_DESCRIPTION_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/piece_classes.h"
#include "planner/rank_pieces.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {

// Counters of a DescriptionCache, for status and logs.
struct DescriptionCacheStats {
  int64_t entries = 0;
  int64_t bytes = 0;      // memory the kept descriptions take (kept serialized)
  int64_t hits = 0;       // lookups answered with a kept description
  int64_t misses = 0;     // lookups refused (nothing kept, another digest, another world size)
  int64_t evictions = 0;  // entries dropped for the memory bound
};

// See the file comment.
class DescriptionCache {
 public:
  explicit DescriptionCache(int64_t max_bytes = int64_t{2} << 30) : max_bytes_(max_bytes) {}

  // Keeps `state` as rank `rank`'s description in job `job` of `world_size` ranks, with the
  // digest computed here. Entries of the job at another world size are dropped first; the least
  // recently used other jobs are dropped while the bytes kept would pass the bound (a
  // description that cannot fit alone is not kept: `*kept` says which). Returns the digest.
  // `pieces`, when given, receives the description's shards as layout classes (the list
  // interned here), kept or not. `sent`, when given, is the description as the rank sent it
  // and `state` its expansion (compact tensors, proto/compact_convert.h): the expansion is
  // kept, and the digest is computed from `sent`, which is what the rank digests.
  // The digest is planner/rank_description.h's DescriptionDigest of what the rank sent. A
  // description without compact tensors is also split into its layout class: `layout_class`
  // and `class_digest`, when given, receive it (its list interned here; no list for a rank
  // without pieces).
  std::string Keep(const std::string& job, int world_size, int rank, const pb::RankState& state,
                   bool* kept = nullptr, std::shared_ptr<const RankPieces>* pieces = nullptr,
                   const pb::RankState* sent = nullptr, PieceClass* layout_class = nullptr,
                   std::string* class_digest = nullptr);

  // Keeps the description of a rank that sent it by reference to its layout class: `pieces`
  // (on the class's interned list), `rest` (the description without shards, rank included),
  // under `digest` (computed by the caller from the class digest and the rank's column).
  // Returns whether it was kept (the bound, as Keep).
  bool KeepReferenced(const std::string& job, int world_size, int rank, std::string digest,
                      std::shared_ptr<const RankPieces> pieces, std::string rest);

  // The kept description of `rank` when its digest equals `digest` and the job still has
  // `world_size` ranks, rebuilt from its kept form; FailedPrecondition naming job,
  // rank and why otherwise (the rank must send its full description). With `pieces` given, the
  // description comes back without its shards and `*pieces` holds them as layout classes (no
  // piece is rebuilt).
  absl::StatusOr<std::shared_ptr<const pb::RankState>> Lookup(
      const std::string& job, int world_size, int rank, const std::string& digest,
      std::shared_ptr<const RankPieces>* pieces = nullptr);

  // Forgets one rank's description (it detached), or a whole job's.
  void DropRank(const std::string& job, int rank);
  void DropJob(const std::string& job);

  DescriptionCacheStats Stats() const;

 private:
  struct Entry {
    std::string digest;
    std::shared_ptr<const std::string> rest;   // the serialized pb::RankState without shards
    std::shared_ptr<const RankPieces> pieces;  // its shards (list interned in pieces_)
    int64_t bytes = 0;
  };
  struct JobEntries {
    int world_size = 0;
    absl::btree_map<int, Entry> ranks;         // by rank (a B-tree: see Job::ranks)
    std::list<std::string>::iterator recency;  // position in recency_
  };
  // Stores `entry` as rank `rank`'s (Keep's bound and replacement rules); whether it was kept.
  bool Store(const std::string& job, int world_size, int rank, Entry entry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJobLocked(std::map<std::string, JobEntries>::iterator it);
  void TouchLocked(JobEntries& entries);

  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, JobEntries> jobs_;
  std::list<std::string> recency_;  // job names, most recently used first
  DescriptionCacheStats stats_;
  PieceListInterner pieces_;  // the kept descriptions' shared piece lists
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_DESCRIPTION_CACHE_H_
