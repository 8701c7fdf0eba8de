#include "worker/transfer_verify.h"

#include <map>
#include <string>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/transfer_path.h"
#include "storage/checksum.h"

namespace ckpt::worker {
namespace {

std::string WorkerOf(const pb::LoadPlanPart& part, int rank) {
  if (rank < 0 || rank >= part.transfer_rank_workers_size()) return "an unknown worker";
  return absl::StrCat("worker ", part.transfer_rank_workers(rank));
}

std::string Published(const pb::LoadPlanPart& part) {
  return TransferPathString(part.transfer_name(), part.transfer_version());
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> ChecksumsOfReadUnits(const ExchangePlan& plan, int me,
                                                           const ShardBuffers& loaded,
                                                           const std::string& where) {
  std::vector<uint64_t> out;
  for (const DistributedPiece& d : plan.distribution) {
    if (d.main_rank != me) continue;
    auto it = loaded.find(d.spec.id);
    if (it == loaded.end()) {
      return absl::InternalError(
          absl::StrCat(where, ": verify: unit ", d.spec.id.DebugString(), " was not read here"));
    }
    out.push_back(Xxh3(it->second.data(), it->second.size()));
  }
  return out;
}

namespace {

// Bytes of checksums each rank contributes to the all-gather: counted from the plan's units
// when the part carries the whole plan; gathered from every rank for an own-share part.
absl::StatusOr<std::vector<size_t>> ChecksumCounts(const pb::LoadPlanPart& part,
                                                   const ExchangePlan& plan, size_t mine,
                                                   Communicator& comm, absl::Time deadline,
                                                   const std::string& where) {
  std::vector<size_t> counts(comm.size(), 0);
  if (part.own_share()) {
    std::vector<uint64_t> gathered(comm.size(), 0);
    const uint64_t my_count = mine;
    if (absl::Status s = comm.AllGather(&my_count, sizeof(uint64_t), gathered.data(), deadline);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where,
                                                 ": verify: gathering the readers' unit "
                                                 "counts: ",
                                                 s.message()));
    }
    for (int r = 0; r < comm.size(); ++r) counts[r] = gathered[r] * sizeof(uint64_t);
    return counts;
  }
  for (const DistributedPiece& d : plan.distribution) {
    if (d.main_rank >= 0 && d.main_rank < comm.size()) counts[d.main_rank] += sizeof(uint64_t);
  }
  return counts;
}

}  // namespace

absl::Status VerifyReceivedUnits(const pb::LoadPlanPart& part, const pb::LoadWaveEntry& wave,
                                 const ExchangePlan& plan, int me,
                                 const std::vector<uint64_t>& mine, const ShardBuffers& received,
                                 Communicator& comm, absl::Time deadline,
                                 const std::string& where) {
  absl::StatusOr<std::vector<size_t>> gathered_counts =
      ChecksumCounts(part, plan, mine.size(), comm, deadline, where);
  if (!gathered_counts.ok()) return gathered_counts.status();
  const std::vector<size_t>& counts = *gathered_counts;
  if (counts[me] != mine.size() * sizeof(uint64_t)) {
    return absl::InternalError(absl::StrCat(where, ": verify: ", mine.size(), " checksums for ",
                                            counts[me] / 8, " units read"));
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<uint64_t> all(total / sizeof(uint64_t));
  if (absl::Status s = comm.AllGatherV(mine.data(), counts, all.data(), deadline); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(where, ": verify: gathering the readers' checksums: ", s.message()));
  }
  // Rank order of the all-gather; within each rank its units in the whole plan's order.
  std::vector<size_t> first(comm.size(), 0);
  for (int r = 1; r < comm.size(); ++r) first[r] = first[r - 1] + counts[r - 1] / sizeof(uint64_t);
  std::vector<size_t> next = first;
  std::map<PieceId, std::pair<uint64_t, int>, PieceIdLess> expected;
  for (size_t i = 0; i < plan.distribution.size(); ++i) {
    const DistributedPiece& d = plan.distribution[i];
    size_t at = next[d.main_rank]++;
    if (part.own_share() && static_cast<int>(i) < wave.units_size()) {
      at = first[d.main_rank] + wave.units(static_cast<int>(i)).reader_ordinal();
    }
    const size_t end = first[d.main_rank] + counts[d.main_rank] / sizeof(uint64_t);
    if (at >= end) {
      return absl::InternalError(absl::StrCat(where, ": verify: reader ", d.main_rank,
                                              " sent no "
                                              "checksum for ",
                                              d.spec.id.DebugString()));
    }
    expected.emplace(d.spec.id, std::make_pair(all[at], d.main_rank));
  }
  for (const PieceSpec& need : plan.needs[me]) {
    auto want = expected.find(need.id);
    auto got = received.find(need.id);
    if (want == expected.end() || got == received.end()) {
      return absl::InternalError(absl::StrCat(where, ": verify: ", need.id.DebugString(),
                                              " is not a whole unit of the wave"));
    }
    if (want->second.second == me) continue;  // read here: nothing travelled
    const uint64_t actual = Xxh3(got->second.data(), got->second.size());
    if (actual != want->second.first) {
      const int reader = want->second.second;
      return absl::DataLossError(absl::StrFormat(
          "%s: verify: tensor \"%s\" %s of %s received from rank %d (%s, the reader) does "
          "not match the checksum the reader computed from its verified stored bytes (got "
          "%016x, want %016x); the receive is refused",
          where, need.id.key, need.region.DebugString(), Published(part), reader,
          WorkerOf(part, reader), actual, want->second.first));
    }
  }
  return absl::OkStatus();
}

// Weak: the testonly worker/test_hooks_on.cc replaces it (see transfer_verify.h).
ABSL_ATTRIBUTE_WEAK void CorruptSentUnitsForTest(const pb::LoadPlanPart& /*part*/,
                                                 const ExchangePlan& /*plan*/, int /*me*/,
                                                 ShardBuffers* /*loaded*/) {}

}  // namespace ckpt::worker
