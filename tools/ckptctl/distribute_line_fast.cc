#include "tools/ckptctl/distribute_line_fast.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "nlohmann/json.hpp"
#include "sharding/dtensor.h"
#include "sharding/piece_id.h"

namespace ckpt::ckptctl {
namespace {

// Longest line handled here: with at least one byte per value, such a line cannot hold more
// values than PlanLineLimits() allows (2^28), so that limit needs no count of its own.
constexpr size_t kMaxFastLineBytes = size_t{1} << 28;
// PlanLineLimits().max_string_bytes.
constexpr size_t kMaxStringBytes = size_t{1} << 20;

// A cursor over one line. Every method answers false for anything outside the subset this
// parser handles; the line is then given to the DOM path.
class Reader {
 public:
  explicit Reader(absl::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  void SkipSpace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  bool AtEnd() {
    SkipSpace();
    return p_ == end_;
  }
  bool Null() {
    SkipSpace();
    if (end_ - p_ < 4 || std::memcmp(p_, "null", 4) != 0) return false;
    p_ += 4;
    return true;
  }
  // A string of printable ASCII without escapes (written back unchanged by nlohmann's dump).
  bool String(absl::string_view* out) {
    if (!Consume('"')) return false;
    const char* start = p_;
    while (p_ < end_) {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *out = absl::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return out->size() <= kMaxStringBytes;
      }
      if (c < 0x20 || c >= 0x7f || c == '\\') return false;
      ++p_;
    }
    return false;
  }
  // -?(0|[1-9][0-9]{0,17}) not followed by a digit, '.', 'e' or 'E' (floats go to the DOM).
  bool Int(int64_t* out) {
    SkipSpace();
    const bool negative = p_ < end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    int64_t value = 0;
    if (*p_ == '0') {
      ++p_;
    } else {
      for (int digits = 0; p_ < end_ && *p_ >= '0' && *p_ <= '9'; ++digits, ++p_) {
        if (digits == 18) return false;
        value = value * 10 + (*p_ - '0');
      }
    }
    if (p_ < end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E')) {
      return false;
    }
    *out = negative ? -value : value;
    return true;
  }
  // [each(), each(), ...] (possibly empty).
  template <typename Each>
  bool List(Each each) {
    if (!Consume('[')) return false;
    if (Consume(']')) return true;
    do {
      if (!each()) return false;
    } while (Consume(','));
    return Consume(']');
  }

 private:
  const char* p_;
  const char* end_;
};

// [int, ...] into `out`, through `scratch` so that `out` is allocated once at its size.
bool ReadInts(Reader& r, std::vector<int64_t>* scratch, std::vector<int64_t>* out) {
  scratch->clear();
  const bool read = r.List([&] {
    int64_t value = 0;
    if (!r.Int(&value)) return false;
    scratch->push_back(value);
    return true;
  });
  out->assign(scratch->begin(), scratch->end());
  return read;
}

// [key, [offsets...], null | [start, stop]] into `id` (reused, so its buffers are too).
bool ReadPieceId(Reader& r, std::vector<int64_t>* scratch, PieceId* id) {
  absl::string_view key;
  if (!r.Consume('[') || !r.String(&key) || !r.Consume(',')) return false;
  id->key.assign(key.data(), key.size());
  if (!ReadInts(r, scratch, &id->offsets) || !r.Consume(',')) return false;
  if (r.Null()) {
    id->flat.reset();
  } else {
    int64_t start = 0, stop = 0;
    if (!r.Consume('[') || !r.Int(&start) || !r.Consume(',') || !r.Int(&stop) || !r.Consume(']')) {
      return false;
    }
    id->flat = FlatRange{start, stop};
  }
  return r.Consume(']');
}

// shard_to_ranks: [[id, [ranks...]], ...] appended to `input`.
bool ReadShardToRanks(Reader& r, DistributionInput* input) {
  std::vector<int64_t> scratch;
  return r.List([&] {
    PieceId id;
    std::vector<int64_t> ranks;
    if (!r.Consume('[') || !ReadPieceId(r, &scratch, &id) || !r.Consume(',') ||
        !ReadInts(r, &scratch, &ranks) || !r.Consume(']')) {
      return false;
    }
    input->AddShard(std::move(id), std::nullopt, std::move(ranks));
    return true;
  });
}

// Finds shards by id. Lines usually list shard_to_size (and cross_group) in shard_to_ranks'
// order, so it first looks at the shards after the last one found (up to kScan of them until
// the first miss, then only the next one), and builds a hash index only when that fails.
class ShardFinder {
 public:
  static constexpr int64_t kNotListed = -1;
  static constexpr int64_t kRepeated = -2;  // shard_to_ranks repeats an id: no index

  explicit ShardFinder(const DistributionInput& input) : shards_(input.shards) {}

  int64_t Find(const PieceId& id) {
    const size_t scan = index_built_ ? 1 : kScan;
    for (size_t k = 0; k < scan && next_ + k < shards_.size(); ++k) {
      if (shards_[next_ + k].id == id) return Found(next_ + k);
    }
    if (!index_built_ && !BuildIndex()) return kRepeated;
    auto it = index_.find(&id);
    return it == index_.end() ? kNotListed : Found(static_cast<size_t>(it->second));
  }

 private:
  static constexpr size_t kScan = 256;

  int64_t Found(size_t shard) {
    next_ = shard + 1;
    return static_cast<int64_t>(shard);
  }
  bool BuildIndex() {
    index_built_ = true;
    index_.reserve(shards_.size());
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (!index_.emplace(&shards_[i].id, static_cast<int32_t>(i)).second) return false;
    }
    return true;
  }

  const std::vector<DistributablePiece>& shards_;
  size_t next_ = 0;
  bool index_built_ = false;
  absl::flat_hash_map<const PieceId*, int32_t, PieceIdPtrHash, PieceIdPtrEq> index_;
};

// shard_to_size: [[id, bytes], ...]. Sizes of shards not in shard_to_ranks are unused, but a
// shard listed twice is refused (by the DOM path, with its field).
bool ReadShardToSize(Reader& r, ShardFinder& finder, DistributionInput* input) {
  absl::flat_hash_set<PieceId> unlisted_sized;
  std::vector<int64_t> scratch;
  PieceId id;
  return r.List([&] {
    int64_t bytes = 0;
    if (!r.Consume('[') || !ReadPieceId(r, &scratch, &id) || !r.Consume(',') || !r.Int(&bytes) ||
        !r.Consume(']')) {
      return false;
    }
    const int64_t shard = finder.Find(id);
    if (shard == ShardFinder::kRepeated) return false;
    if (shard == ShardFinder::kNotListed) return unlisted_sized.insert(id).second;
    std::optional<int64_t>& size = input->shards[static_cast<size_t>(shard)].size_bytes;
    if (size.has_value()) return false;
    size = bytes;
    return true;
  });
}

// cross_group: [id, ...]; ids not in shard_to_ranks are ignored, repeats allowed.
bool ReadCrossGroup(Reader& r, ShardFinder& finder, DistributionInput* input) {
  std::vector<int64_t> scratch;
  PieceId id;
  return r.List([&] {
    if (!ReadPieceId(r, &scratch, &id)) return false;
    const int64_t shard = finder.Find(id);
    if (shard == ShardFinder::kRepeated) return false;
    if (shard >= 0) input->shards[static_cast<size_t>(shard)].cross_group = true;
    return true;
  });
}

// The checks the DOM path makes after parsing: num_ranks in range, every holder in
// [0, num_ranks) unless kept as Megatron keeps them, every shard sized.
bool Valid(const DistributionInput& input, bool keep_out_of_range_ranks) {
  if (input.num_ranks < 0 || input.num_ranks > kMaxWorldSize) return false;
  if (!keep_out_of_range_ranks) {
    for (const std::vector<int64_t>& holders : input.holder_lists) {
      for (int64_t rank : holders) {
        if (rank < 0 || rank >= input.num_ranks) return false;
      }
    }
  }
  for (const DistributablePiece& shard : input.shards) {
    if (!shard.size_bytes.has_value()) return false;
  }
  return true;
}

// One field of the top-level object; false also for a field this parser does not take here
// (unknown, repeated, or shard_to_size / cross_group before shard_to_ranks).
struct Fields {
  bool num_ranks = false, shard_to_ranks = false, shard_to_size = false, cross_group = false;
};

bool ReadField(Reader& r, absl::string_view name, Fields* seen, std::optional<ShardFinder>* finder,
               DistributionInput* input) {
  if (name == "num_ranks" && !seen->num_ranks) {
    seen->num_ranks = true;
    return r.Int(&input->num_ranks);
  }
  if (name == "shard_to_ranks" && !seen->shard_to_ranks && !seen->shard_to_size &&
      !seen->cross_group) {
    seen->shard_to_ranks = true;
    if (!ReadShardToRanks(r, input)) return false;
    finder->emplace(*input);  // input->shards no longer grows
    return true;
  }
  if (name == "shard_to_size" && seen->shard_to_ranks && !seen->shard_to_size) {
    seen->shard_to_size = true;
    return ReadShardToSize(r, **finder, input);
  }
  if (name == "cross_group" && seen->shard_to_ranks && !seen->cross_group) {
    seen->cross_group = true;
    return ReadCrossGroup(r, **finder, input);
  }
  return false;
}

void AppendInt(std::string* out, int64_t value) {
  char buffer[24];
  const std::to_chars_result end = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out->append(buffer, static_cast<size_t>(end.ptr - buffer));
}

// A JSON string as nlohmann's dump() writes it: plain printable ASCII as is, anything else
// through nlohmann itself (escapes, invalid UTF-8 replaced).
void AppendString(std::string* out, const std::string& s) {
  bool plain = true;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '"' || c == '\\') {
      plain = false;
      break;
    }
  }
  if (!plain) {
    out->append(nlohmann::json(s).dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace));
    return;
  }
  out->push_back('"');
  out->append(s);
  out->push_back('"');
}

void AppendPieceId(std::string* out, const PieceId& id) {
  out->push_back('[');
  AppendString(out, id.key);
  out->append(",[");
  for (size_t i = 0; i < id.offsets.size(); ++i) {
    if (i > 0) out->push_back(',');
    AppendInt(out, id.offsets[i]);
  }
  out->append("],");
  if (!id.flat) {
    out->append("null");
  } else {
    out->push_back('[');
    AppendInt(out, id.flat->start);
    out->push_back(',');
    AppendInt(out, id.flat->stop);
    out->push_back(']');
  }
  out->push_back(']');
}

}  // namespace

std::optional<DistributionInput> ParseDistributeLineFast(absl::string_view line,
                                                         bool keep_out_of_range_ranks) {
  if (line.size() > kMaxFastLineBytes) return std::nullopt;
  Reader r(line);
  DistributionInput input;
  // A shard takes at least ~40 bytes of a line (its id twice, a rank, a size); reserving for
  // that many saves the vectors' regrowth copies (pages never touched are never faulted in).
  const size_t expected_shards = std::min<size_t>(line.size() / 40, size_t{1} << 22);
  input.shards.reserve(expected_shards);
  input.holder_lists.reserve(expected_shards);
  std::optional<ShardFinder> finder;
  Fields seen;
  if (!r.Consume('{')) return std::nullopt;
  do {
    absl::string_view name;
    if (!r.String(&name) || !r.Consume(':')) return std::nullopt;
    if (!ReadField(r, name, &seen, &finder, &input)) return std::nullopt;
  } while (r.Consume(','));
  if (!r.Consume('}') || !r.AtEnd()) return std::nullopt;
  if (!seen.num_ranks || !seen.shard_to_ranks || !seen.shard_to_size) return std::nullopt;
  if (!Valid(input, keep_out_of_range_ranks)) return std::nullopt;
  return input;
}

FormattedShardIds FormatShardIds(const DistributionInput& input) {
  // Every id written once in shard order (sequential reads of the shards); the result line
  // then copies them in visiting order: one random read per pair instead of three.
  FormattedShardIds ids;
  ids.text.reserve(input.shards.size() * 48);
  ids.ends.assign(input.shards.size() + 1, 0);
  for (size_t i = 0; i < input.shards.size(); ++i) {
    AppendPieceId(&ids.text, input.shards[i].id);
    ids.ends[i + 1] = ids.text.size();
  }
  return ids;
}

std::string FormatDistributeResult(const FormattedShardIds& ids,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds) {
  std::string out;
  out.reserve(ids.text.size() + assignment.size() * 16 + 64);
  out.append("{\"assignment\":[");
  for (size_t i = 0; i < assignment.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.push_back('[');
    const size_t shard = static_cast<size_t>(assignment[i].shard);
    out.append(ids.text, ids.ends[shard], ids.ends[shard + 1] - ids.ends[shard]);
    out.push_back(',');
    AppendInt(&out, assignment[i].rank);
    out.push_back(']');
  }
  out.append("],\"plan_seconds\":");
  out.append(nlohmann::json(plan_seconds).dump());
  out.push_back('}');
  return out;
}

std::string FormatDistributeResult(const DistributionInput& input,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds) {
  return FormatDistributeResult(FormatShardIds(input), assignment, plan_seconds);
}

}  // namespace ckpt::ckptctl
