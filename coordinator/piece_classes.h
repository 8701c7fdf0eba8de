// The layout classes (planner/rank_description.h) of each job's ranks that the coordinator
// holds, by digest, so that the job's other ranks may describe their pieces by reference
// (pb::PieceListReference, issue 16), and the calls waiting for a class to arrive.
//
// A call of joins that name classes is admitted (Admit) in one of three ways:
//   * every class named is held, or some class named is not held and no rank was asked for it
//     within its wait: the call goes on now. Its joins naming classes not held are answered
//     send_full_state, so each such class is asked of one call's rank; the class is marked
//     asked until now + `supply_wait`.
//   * otherwise every class it names that is not held was asked of another call within its
//     wait: the call is parked, and its `resume` is handed back (by Add) once every class it
//     waits for is held. When the earliest of those waits passes (Expire), the call is admitted
//     again: the first parked call to find a class's supplier overdue is asked for the class in
//     its place (handed back; its joins naming classes not held are answered send_full_state)
//     and the others wait for the new supplier. A call is never parked past its `latest` (its
//     RPC's deadline, less a margin): then it is handed back whatever it waits for.
// So one rank per class sends its description in full, the others wait a round trip for it and
// send ~1.5 KB instead of ~21 KB each, and no call waits on a call that waits on it: a call
// that was asked for a class is never parked. A supplier that is late (a burst of joins delays
// its resend past `supply_wait`) costs one more full description per wait, not one per waiting
// call; a supplier that is gone is replaced after one wait.
//
// Bounded: at most `max_classes_per_job` classes per job (more are not kept; their ranks send
// in full, and the calls waiting for such a class are handed back when it arrives); a job's classes
// and parked calls go when it is dropped. Every parked call's resume is handed back exactly once
// (the owner takes them all at shutdown). Thread-safe (its own lock; resumes are returned, never
// called under it).
#ifndef CKPT_COORDINATOR_PIECE_CLASSES_H_
#define CKPT_COORDINATOR_PIECE_CLASSES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "planner/rank_pieces.h"

namespace ckpt::coordinator {

// One layout class: its shared piece list (interned) and the rest of its description.
struct PieceClass {
  std::shared_ptr<const SharedPieceList> list;
  std::shared_ptr<const std::string> rest;  // RankState without shards and rank, serialized
};

// See the file comment.
class PieceClasses {
 public:
  using Resume = std::function<void()>;

  PieceClasses(absl::Duration supply_wait, int64_t max_classes_per_job)
      : supply_wait_(supply_wait), max_classes_per_job_(max_classes_per_job) {}

  // The class `digest` of `job`, when held.
  std::optional<PieceClass> Find(const std::string& job, const std::string& digest) const;

  // Admits a call of `job` whose joins name `digests` (see the file comment) at `now`. True:
  // the call goes on now. False: it is parked, at most until `latest`, and `resume` will be
  // handed back by Add, Expire or DropJob (exactly once).
  bool Admit(const std::string& job, const std::set<std::string>& digests, absl::Time now,
             absl::Time latest, Resume resume);

  // Holds `layout_class` as `digest` of `job` (a rank described it in full); returns the parked
  // calls that now hold every class they wait for. Beyond the job's bound nothing is held.
  std::vector<Resume> Add(const std::string& job, const std::string& digest,
                          PieceClass layout_class);

  // The parked calls whose wait passed at `now` and that are asked for a class in place of an
  // overdue supplier, or whose `latest` passed.
  std::vector<Resume> Expire(absl::Time now);

  // Forgets `job`'s classes; returns its parked calls (to be answered).
  std::vector<Resume> DropJob(const std::string& job);
  // Every parked call (shutdown).
  std::vector<Resume> TakeAllParked();

  // Classes held (all jobs) and calls parked now, for status and tests.
  int64_t classes() const;
  int64_t parked() const;

 private:
  struct Parked {
    std::string job;
    std::set<std::string> waiting;  // digests not held when it was parked
    absl::Time until;               // the earliest wait among `waiting`
    absl::Time latest;              // handed back then whatever it waits for
    Resume resume;
  };
  struct JobClasses {
    std::map<std::string, PieceClass> held;
    std::map<std::string, absl::Time> asked;  // digest -> until when its supplier is awaited
  };

  // Marks `job`'s classes among `digests` that are not held as asked (of the caller's call)
  // where no supplier is awaited at `now`.
  void AskOverdue(JobClasses& classes, const std::set<std::string>& digests, absl::Time now);
  // The earliest wait among `digests` asked of others, or InfinitePast when one is overdue.
  static absl::Time EarliestWait(const JobClasses& classes, const std::set<std::string>& digests,
                                 absl::Time now);

  const absl::Duration supply_wait_;
  const int64_t max_classes_per_job_;
  mutable std::mutex mu_;
  std::map<std::string, JobClasses> jobs_;
  std::vector<Parked> parked_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_PIECE_CLASSES_H_
