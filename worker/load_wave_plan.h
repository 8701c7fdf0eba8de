// The pure steps of a worker's exchange-based load part (load_exchange_executor.cc runs them):
// the requests of the part's plan resolved against the checkpoint's tensors, the check that the
// deliveries to this rank tile its requests, and per wave the exchange plan (what each unit is,
// who reads it, what each rank must receive) with this rank's reads and scatter targets. No
// I/O, threads or logging. They live in worker/, not planner/, because they produce
// exchange/'s ExchangePlan, which planner/ may not use.
#ifndef CKPT_WORKER_LOAD_WAVE_PLAN_H_
#define CKPT_WORKER_LOAD_WAVE_PLAN_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "exchange/exchange.h"
#include "proto/coordinator.pb.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "sharding/region.h"

namespace ckpt::worker {

// A region some rank receives; `dest` is set (by the executor) for this rank's own requests.
struct LoadRequest {
  int rank = 0;
  std::string key;
  Region region;
  std::vector<int64_t> shape;
  DType dtype = DType::kU8;
  int local_index = -1;  // the trainer's shared tensor it fills (this rank's requests)
  char* dest = nullptr;
};

// The tensor of the checkpoint named `key`; nullptr when it has none.
using TensorLookup = std::function<const pb::TensorMeta*(const std::string& key)>;

// Every rank's requests of `part`, with each tensor's shape and dtype. InvalidArgument naming
// `who`, the rank and the key for a request the checkpoint cannot serve.
absl::StatusOr<std::vector<LoadRequest>> ResolveRequests(const pb::LoadPlanPart& part,
                                                         const TensorLookup& tensors,
                                                         const std::string& who);

// What a rank must receive of `unit` for `request`: with `narrow` (overlap_all_to_all) only
// the part of the unit the request covers, when that part is itself a region (a box
// intersection of two plain boxes, or a flat intersection on one box); otherwise the whole unit.
PieceSpec NeededPart(const PieceSpec& unit, const LoadRequest& request, bool narrow);

// Before anything is read, exchanged or scattered: the plan's deliveries to rank `me` must
// write every element of each of its requests exactly once, so the trainer's memory is never
// left with a hole of stale bytes. Otherwise the error of RunTilingStatus (NotFound for a hole,
// an overlap's own code) naming `who`, the tensor and the elements.
absl::Status CheckDeliveriesTileRequests(const pb::LoadPlanPart& part, const pb::Manifest& manifest,
                                         const std::vector<LoadRequest>& requests, int me,
                                         const std::string& who);

// A unit this rank reads from storage: bytes [begin, end) of stored piece `piece`, into the
// buffer of shard `id`.
struct UnitRead {
  int piece = 0;
  int64_t begin = 0;
  int64_t end = 0;
  PieceId id;
};

// One wave as the exchange runs it on rank `me`.
struct WaveExchange {
  ExchangePlan plan;
  std::vector<UnitRead> reads;  // what `me` reads
  // my_targets[i]: the requests of `me` that plan.needs[me][i] feeds (scattered into).
  std::vector<std::vector<int>> my_targets;
};

// The exchange plan of `wave` for rank `me` of `world`, from a whole plan's wave or an own-share
// part's (LoadPlanPart.own_share: a delivery with request -1 goes to another rank's request
// that the part does not carry; the whole unit, so never with `narrow`); the caller sets
// plan.own_share from the part. InvalidArgument naming `where` for a unit or delivery that does
// not match the manifest or the requests.
absl::StatusOr<WaveExchange> BuildWaveExchange(const pb::LoadWaveEntry& wave,
                                               const pb::Manifest& manifest,
                                               const TensorLookup& tensors,
                                               const std::vector<LoadRequest>& requests, int me,
                                               int world, bool narrow, const std::string& where);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_LOAD_WAVE_PLAN_H_
