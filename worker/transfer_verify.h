// Verify mode of a live-transfer receive (issue 17; LoadPlanPart.transfer_verify): every byte a
// destination rank receives is checked against a checksum its reader computed. Per wave, each
// reader computes the XXH3-64 of every unit it read (from its memory tier, whose reads are
// themselves checked against the manifest's per-piece checksums) before anything is sent;
// after the exchange the readers' checksums are all-gathered over the operation's communicator
// and each rank checks every unit it received from another rank. A mismatch is DataLoss naming
// the tensor, region, published name and version, and the reader's rank and worker.
#ifndef CKPT_WORKER_TRANSFER_VERIFY_H_
#define CKPT_WORKER_TRANSFER_VERIFY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "exchange/exchange.h"
#include "proto/coordinator.pb.h"

namespace ckpt::worker {

// XXH3-64 of each unit `me` read (plan.distribution entries whose main rank is `me`, in
// distribution order). InternalError naming `where` when a read unit is missing from `loaded`.
absl::StatusOr<std::vector<uint64_t>> ChecksumsOfReadUnits(const ExchangePlan& plan, int me,
                                                           const ShardBuffers& loaded,
                                                           const std::string& where);

// All-gathers every rank's ChecksumsOfReadUnits and checks each unit `me` received from
// another rank (plan.needs[me]) against its reader's checksum. `wave` is the part's wave the
// plan was built from (its units are plan.distribution): an own-share part lists only some of
// the other readers' units, so the readers' counts are gathered first and each unit's checksum
// found by its reader_ordinal. DataLoss as in the file comment; the communicator's error when
// an all-gather fails.
absl::Status VerifyReceivedUnits(const pb::LoadPlanPart& part, const pb::LoadWaveEntry& wave,
                                 const ExchangePlan& plan, int me,
                                 const std::vector<uint64_t>& mine, const ShardBuffers& received,
                                 Communicator& comm, absl::Time deadline, const std::string& where);

// Test seam, called on the units a rank read for a verified receive after their checksums were
// taken. Injected at link time: the release definition (transfer_verify.cc) is weak and does
// nothing; the testonly daemon //worker:ckpt_worker_testing links worker/test_hooks_on.cc,
// whose definition flips a byte per unit (the corruption a faulty link would cause in flight).
void CorruptSentUnitsForTest(const pb::LoadPlanPart& part, const ExchangePlan& plan, int me,
                             ShardBuffers* loaded);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_TRANSFER_VERIFY_H_
