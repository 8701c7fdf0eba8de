// Each rank's own share of an exchange-based load plan, so that a load's dispatch is not
// O(ranks^2) bytes. The coordinator plans one group's load whole (every rank's requests, the
// waves' units and deliveries: coordinator/load_exchange.cc PlanGroupLoad); PlanSplitter cuts
// from it, per rank, only what that rank's worker needs to run its part of the exchange
// bit-exactly (what exactly: proto/coordinator.proto, LoadPlanPart.own_share). Pure: no gRPC,
// threads or logging.
#ifndef CKPT_COORDINATOR_PLAN_PARTS_H_
#define CKPT_COORDINATOR_PLAN_PARTS_H_

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "proto/coordinator.pb.h"

namespace ckpt::coordinator {

// Whether parts of `algorithm` are cut into own shares: every exchange algorithm (not direct,
// whose parts are per rank already, nor auto or unset, resolved before).
bool SplitsIntoOwnShares(pb::LoadAlgorithm algorithm);

// Indexes one group's whole plan once (requests by rank; per wave units by reader, deliveries
// by destination and by unit), so that each rank's share costs what it carries plus the
// collective schedule, not a scan of the whole plan.
class PlanSplitter {
 public:
  // `whole`: the group's plan (requests and waves; ranks numbered within the group,
  // whole.world_size() of them). It must outlive the splitter.
  explicit PlanSplitter(const pb::LoadPlanPart& whole);

  // Group rank `me`'s share: every field of `whole` but `requests` and `waves`, which carry
  // only `me`'s share, and own_share set. With an algorithm that does not split
  // (SplitsIntoOwnShares), `whole` itself.
  pb::LoadPlanPart ShareOf(int me) const;

 private:
  // Per wave: where each rank appears.
  struct WaveIndex {
    std::vector<std::vector<int>> units_read_by;  // by rank: units it reads, ascending
    std::vector<std::vector<int>> deliveries_to;  // by rank: deliveries to it, ascending
    std::vector<std::vector<int>> deliveries_of;  // by unit: its deliveries, ascending
    std::vector<int> witness;         // by unit: its first delivery to a rank not its reader
    std::vector<int> reader_ordinal;  // by unit: its position among its reader's units
    std::vector<int> exchanged;       // units with a witness, ascending
  };

  // `me`'s share of wave `w` into `out`; `request_index` maps whole-plan requests to `out`'s
  // (those missing are added: overlap_all_to_all's receivers' requests).
  void AddWaveShare(int w, int me, absl::flat_hash_map<int, int>& request_index,
                    pb::LoadPlanPart& out) const;

  const pb::LoadPlanPart& whole_;
  pb::LoadPlanPart header_;  // whole_ without requests and waves: what every share copies
  bool split_ = false;
  bool narrow_ = false;  // overlap_all_to_all: senders cut by their receivers' requests
  std::vector<std::vector<int>> requests_of_;  // by rank: its requests, ascending
  std::vector<WaveIndex> waves_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_PLAN_PARTS_H_
