// The last save plan of each job, reused by a repeat save whose ranks' state descriptions are
// all unchanged (issue 16): planning is then a copy of the kept plan parts.
//
// A save plan (PlanSave with the default SavePlanOptions) depends only on the gathered pieces
// in rank order and the world size; the ranks' workers and hosts, the user metadata and the
// path do not enter it, except the staging directory each part names, which is replaced. So
// the key is the world size and every rank's description digest (RankEntry::description_digest,
// SHA-256 computed by the coordinator); a rank without one (its worker sent no digest) means no
// reuse. Memory is bounded: one plan per job, least recently used jobs dropped past the bound.
// The kept parts share their bytes with the operation that dispatches them (PlanPartBytes):
// keeping a plan copies none, and a reused plan's parts are the kept bodies plus one shared
// tail naming the new staging directory, so a job's plan is held once however often it is
// reused.
#ifndef CKPT_COORDINATOR_SAVE_PLAN_REUSE_H_
#define CKPT_COORDINATOR_SAVE_PLAN_REUSE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/job_state.h"

namespace ckpt::coordinator {

// Appends pb::SavePlanPart.compression = `spec` to every part as a tail (nothing when empty),
// after any staging tail, so kept bodies never carry it and a reused plan takes the new save's.
void AddCompressionTail(const std::string& spec, std::vector<RankPlan>* plans);

// See the file comment. Thread-safe.
class SavePlanReuse {
 public:
  explicit SavePlanReuse(int64_t max_bytes = int64_t{2} << 30) : max_bytes_(max_bytes) {}

  // The job's kept plan with every part's staging directory set to `staging_dir` and marked
  // RankPlan::reused, when `op`'s world size, process groups and every rank's description
  // digest equal those it was planned for.
  std::optional<std::vector<RankPlan>> Find(const Operation& op, const std::string& staging_dir);
  // Keeps `plans` (just built for `op`) as the job's plan, unless a rank has no digest
  // (sharing the parts' bytes; nothing is copied), and names the kept parts' bodies by `op`'s
  // id (PlanPartBytes::body_id), in `plans` too, so workers may keep them for a reuse.
  void Keep(const Operation& op, std::vector<RankPlan>* plans);

  int64_t reused() const;

 private:
  struct Kept {
    std::vector<std::string> digests;  // by rank
    std::string groups;                // SaveGroupsKey (coordinator/group_plan.h)
    std::vector<PlanPartBytes> parts;  // by rank
    std::vector<int64_t> part_bytes;   // by rank: RankPlan::bytes
    int64_t bytes = 0;
    std::list<std::string>::iterator recency;
  };
  void DropLocked(std::map<std::string, Kept>::iterator it);

  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, Kept> jobs_;
  std::list<std::string> recency_;  // most recently used first
  int64_t bytes_ = 0;
  int64_t reused_ = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SAVE_PLAN_REUSE_H_
