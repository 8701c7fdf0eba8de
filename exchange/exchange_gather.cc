// The "gather_rounds" and "gather_object" exchanges.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "exchange/exchange.h"
#include "exchange/exchange_internal.h"

namespace ckpt {

using exchange_internal::ChunkedAllGatherV;
using exchange_internal::Segment;
using exchange_internal::WaveRecorder;

absl::Status ExchangeGatherRoundsInto(Communicator& comm, const ExchangePlan& plan,
                                      const ShardBuffers& loaded,
                                      const DestinationBuffers& destinations,
                                      const ExchangeOptions& options, ExchangeReport* report) {
  using namespace exchange_internal;
  CKPT_ASSIGN_OR_RETURN(DistributionIndex index, IndexPlan(plan, comm));
  CKPT_RETURN_IF_ERROR(CheckLoaded(plan, index, comm.rank(), loaded));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::vector<int>> holders, HoldersOfStoredShards(plan, index));
  CKPT_RETURN_IF_ERROR(CheckDestinations(plan, comm.rank(), loaded, destinations).status());
  StagingArena own_staging;
  StagingArena& staging = options.staging != nullptr ? *options.staging : own_staging;
  const int n = comm.size();
  const int me = comm.rank();

  // Per dtype name (sorted), per rank: its assigned shards in distribution order.
  std::map<std::string, std::vector<std::vector<int>>> by_dtype;
  for (int i = 0; i < static_cast<int>(plan.distribution.size()); ++i) {
    const DistributedPiece& d = plan.distribution[i];
    auto& per_rank = by_dtype[std::string(DTypeName(d.spec.dtype))];
    per_rank.resize(n);
    per_rank[d.main_rank].push_back(i);
  }
  WaveRecorder waves(options.memory_budget_bytes);
  for (const auto& [dtype, per_rank] : by_dtype) {
    size_t rounds = 0;
    for (const auto& shards : per_rank) rounds = std::max(rounds, shards.size());
    for (size_t k = 0; k < rounds; ++k) {
      std::vector<size_t> sizes(n, 0);
      std::vector<const std::string*> targets(n, nullptr);
      std::vector<char*> outputs(n, nullptr);
      for (int r = 0; r < n; ++r) {
        if (k >= per_rank[r].size()) continue;
        const int i = per_rank[r][k];
        const PieceSpec& spec = plan.distribution[i].spec;
        sizes[r] = spec.NumBytes();
        const std::vector<int>& h = holders[i];
        if (r != me && std::binary_search(h.begin(), h.end(), me)) {
          outputs[r] = destinations.at(spec.id).data();
        }
      }
      std::vector<Segment> mine;
      if (sizes[me] > 0) {
        const std::string& bytes = loaded.at(plan.distribution[per_rank[me][k]].spec.id);
        mine.push_back({bytes.data(), bytes.size()});
      }
      CKPT_RETURN_IF_ERROR(
          ChunkedAllGatherV(comm, mine, sizes, options.memory_budget_bytes, options.deadline, waves,
                            staging, [&](int source, size_t offset, const char* data, size_t size) {
                              if (outputs[source] != nullptr) {
                                std::memcpy(outputs[source] + offset, data, size);
                              }
                            }));
    }
  }
  for (const auto& [id, target] : destinations) {
    auto it = loaded.find(id);
    if (it != loaded.end()) CopyLoaded(it->second, target);
  }
  waves.Finish("gather_rounds", report);
  return absl::OkStatus();
}

absl::StatusOr<ShardBuffers> ExchangeGatherRounds(Communicator& comm, const ExchangePlan& plan,
                                                  const ShardBuffers& loaded,
                                                  const ExchangeOptions& options,
                                                  ExchangeReport* report) {
  return exchange_internal::RunAllocating(ExchangeGatherRoundsInto, comm, plan, loaded, options,
                                          report);
}

namespace {

// Wire form of one rank's map (without data): count, then per shard key, offsets, flat range
// and byte size, all little-endian fixed width.
void PutU64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string SerializeHeader(const ShardBuffers& loaded) {
  std::string s;
  PutU64(s, loaded.size());
  for (const auto& [id, bytes] : loaded) {
    PutU64(s, id.key.size());
    s += id.key;
    PutU64(s, id.offsets.size());
    for (int64_t o : id.offsets) PutU64(s, static_cast<uint64_t>(o));
    PutU64(s, id.flat.has_value() ? 1 : 0);
    if (id.flat) {
      PutU64(s, static_cast<uint64_t>(id.flat->start));
      PutU64(s, static_cast<uint64_t>(id.flat->stop));
    }
    PutU64(s, bytes.size());
  }
  return s;
}

// A parsed header entry.
struct HeaderEntry {
  PieceId id;
  uint64_t size;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}
  bool U64(uint64_t* v) {
    if (size_ - at_ < 8) return false;
    std::memcpy(v, data_ + at_, 8);
    at_ += 8;
    return true;
  }
  bool Bytes(size_t n, std::string* out) {
    if (size_ - at_ < n) return false;
    out->assign(data_ + at_, n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == size_; }

 private:
  const char* data_;
  size_t size_;
  size_t at_ = 0;
};

absl::StatusOr<std::vector<HeaderEntry>> ParseHeader(const char* data, size_t size, int rank) {
  auto bad = [rank] {
    return absl::DataLossError(
        absl::StrCat("gather_object: malformed shard map received from rank ", rank));
  };
  Reader r(data, size);
  uint64_t count = 0;
  if (!r.U64(&count) || count > size) return bad();
  std::vector<HeaderEntry> entries(count);
  for (HeaderEntry& e : entries) {
    uint64_t len = 0, ndim = 0, has_flat = 0;
    if (!r.U64(&len) || !r.Bytes(len, &e.id.key) || !r.U64(&ndim) || ndim > size) return bad();
    e.id.offsets.resize(ndim);
    for (int64_t& o : e.id.offsets) {
      uint64_t v;
      if (!r.U64(&v)) return bad();
      o = static_cast<int64_t>(v);
    }
    if (!r.U64(&has_flat) || has_flat > 1) return bad();
    if (has_flat) {
      uint64_t a, b;
      if (!r.U64(&a) || !r.U64(&b)) return bad();
      e.id.flat = FlatRange{static_cast<int64_t>(a), static_cast<int64_t>(b)};
    }
    if (!r.U64(&e.size)) return bad();
  }
  if (!r.done()) return bad();
  return entries;
}

// Step 1: every rank's map of shard ids and sizes (small): sizes, then the headers. Returns the
// concatenated headers; counts[r] is rank r's header size.
absl::StatusOr<std::string> GatherHeaders(Communicator& comm, const ShardBuffers& loaded,
                                          const ExchangeOptions& options, WaveRecorder& waves,
                                          std::vector<size_t>* counts) {
  const int n = comm.size();
  const std::string header = SerializeHeader(loaded);
  std::vector<uint64_t> header_sizes(n);
  uint64_t my_header_size = header.size();
  absl::Time start = absl::Now();
  CKPT_RETURN_IF_ERROR(
      comm.AllGather(&my_header_size, sizeof(uint64_t), header_sizes.data(), options.deadline));
  waves.Add(8 * n, 8 * (n - 1), 8 * (n - 1), absl::Now() - start);
  counts->assign(header_sizes.begin(), header_sizes.end());
  std::string headers(TotalBytes(*counts), '\0');  // small: ids and sizes only
  start = absl::Now();
  CKPT_RETURN_IF_ERROR(comm.AllGatherV(header.data(), *counts, headers.data(), options.deadline));
  waves.Add(headers.size(), header.size() * (n - 1), headers.size() - header.size(),
            absl::Now() - start);
  return headers;
}

// Where a shard's bytes are: a rank and a range of its data payload.
struct Location {
  int rank;
  uint64_t offset;  // in that rank's data payload
  uint64_t size;
};

// Every rank's shards located in its payload, and each rank's payload size.
struct ShardMap {
  absl::flat_hash_map<PieceId, Location> where;
  std::vector<size_t> payload_sizes;
};

// Step 2a: locates every shard of the gathered headers in exactly one rank's map.
absl::StatusOr<ShardMap> LocateShards(const std::string& headers,
                                      const std::vector<size_t>& counts) {
  const int n = static_cast<int>(counts.size());
  ShardMap map;
  map.payload_sizes.assign(n, 0);
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    CKPT_ASSIGN_OR_RETURN(std::vector<HeaderEntry> entries,
                          ParseHeader(headers.data() + at, counts[r], r));
    at += counts[r];
    for (const HeaderEntry& e : entries) {
      auto [it, inserted] = map.where.emplace(e.id, Location{r, map.payload_sizes[r], e.size});
      if (!inserted) {
        return absl::FailedPreconditionError(
            absl::StrCat("gather_object: shard ", e.id.DebugString(), " was loaded by both rank ",
                         it->second.rank, " and rank ", r));
      }
      map.payload_sizes[r] += e.size;
    }
  }
  return map;
}

// A needed shard's range of a source rank's payload and where its bytes go.
struct Wanted {
  uint64_t offset;
  uint64_t size;
  char* output;
};

// Step 2b: per source rank, the shards this rank needs, in payload order. Refuses a needed
// shard that no rank loaded or whose size differs.
absl::StatusOr<std::vector<std::vector<Wanted>>> WantedBySource(
    const ShardMap& map, const DestinationBuffers& destinations, int me) {
  std::vector<std::vector<Wanted>> wanted(map.payload_sizes.size());
  for (const auto& [id, bytes] : destinations) {
    auto it = map.where.find(id);
    if (it == map.where.end()) {
      return absl::NotFoundError(absl::StrCat("gather_object: rank ", me, " needs shard ",
                                              id.DebugString(), " which no rank loaded"));
    }
    if (it->second.size != bytes.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gather_object: rank ", it->second.rank, " loaded ", it->second.size, " bytes for shard ",
          id.DebugString(), ", rank ", me, " expects ", bytes.size()));
    }
    // Empty shards need no bytes (and would break the offset order's partitioning).
    if (it->second.size > 0) {
      wanted[it->second.rank].push_back({it->second.offset, it->second.size, bytes.data()});
    }
  }
  for (auto& w : wanted) {
    std::sort(w.begin(), w.end(),
              [](const Wanted& a, const Wanted& b) { return a.offset < b.offset; });
  }
  return wanted;
}

}  // namespace

absl::Status ExchangeGatherObjectInto(Communicator& comm, const ExchangePlan& plan,
                                      const ShardBuffers& loaded,
                                      const DestinationBuffers& destinations,
                                      const ExchangeOptions& options, ExchangeReport* report) {
  using namespace exchange_internal;
  CKPT_RETURN_IF_ERROR(CheckPlanShape(plan, comm));
  CKPT_RETURN_IF_ERROR(CheckDestinations(plan, comm.rank(), loaded, destinations).status());
  StagingArena own_staging;
  StagingArena& staging = options.staging != nullptr ? *options.staging : own_staging;
  WaveRecorder waves(options.memory_budget_bytes);
  std::vector<size_t> counts;
  CKPT_ASSIGN_OR_RETURN(std::string headers, GatherHeaders(comm, loaded, options, waves, &counts));
  CKPT_ASSIGN_OR_RETURN(ShardMap map, LocateShards(headers, counts));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::vector<Wanted>> wanted,
                        WantedBySource(map, destinations, comm.rank()));

  // 3. The data of every map, in budgeted windows; keep the bytes of needed shards.
  std::vector<Segment> mine;
  for (const auto& [id, bytes] : loaded) mine.push_back({bytes.data(), bytes.size()});
  CKPT_RETURN_IF_ERROR(ChunkedAllGatherV(
      comm, mine, map.payload_sizes, options.memory_budget_bytes, options.deadline, waves, staging,
      [&](int source, size_t offset, const char* data, size_t size) {
        const std::vector<Wanted>& w = wanted[source];
        // First wanted shard ending after `offset` (shards are disjoint and sorted).
        auto it = std::partition_point(
            w.begin(), w.end(), [offset](const Wanted& x) { return x.offset + x.size <= offset; });
        for (; it != w.end() && it->offset < offset + size; ++it) {
          uint64_t lo = std::max<uint64_t>(it->offset, offset);
          uint64_t hi = std::min<uint64_t>(it->offset + it->size, offset + size);
          if (lo >= hi) continue;
          std::memcpy(it->output + (lo - it->offset), data + (lo - offset), hi - lo);
        }
      }));
  waves.Finish("gather_object", report);
  return absl::OkStatus();
}

absl::StatusOr<ShardBuffers> ExchangeGatherObject(Communicator& comm, const ExchangePlan& plan,
                                                  const ShardBuffers& loaded,
                                                  const ExchangeOptions& options,
                                                  ExchangeReport* report) {
  return exchange_internal::RunAllocating(ExchangeGatherObjectInto, comm, plan, loaded, options,
                                          report);
}

}  // namespace ckpt
