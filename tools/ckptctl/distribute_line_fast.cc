#include "tools/ckptctl/distribute_line_fast.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "nlohmann/json.hpp"
#include "sharding/dtensor.h"
#include "sharding/piece_id.h"

namespace ckpt::ckptctl {
namespace {

// Longest line handled here: with at least one byte per value, such a line cannot hold more
// values than PlanLineLimits() allows (2^28), so that limit needs no count of its own; and
// every offset into it fits 32 bits.
constexpr size_t kMaxFastLineBytes = size_t{1} << 28;
// PlanLineLimits().max_string_bytes.
constexpr size_t kMaxStringBytes = size_t{1} << 20;

// The scanning helpers work on a cursor `p` that the calling function keeps in a local
// variable (so in a register: the id text written through a char pointer could alias
// anything in memory). Each answers false for anything outside the subset this parser
// handles; the line is then given to the DOM path.

[[gnu::always_inline]] inline void SkipSpace(const char*& p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
}

[[gnu::always_inline]] inline bool Consume(const char*& p, const char* end, char c) {
  SkipSpace(p, end);
  if (p == end || *p != c) return false;
  ++p;
  return true;
}

inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// -?(0|[1-9][0-9]{0,17}) not followed by a digit, '.', 'e' or 'E' (floats go to the DOM).
// With `w`, the number is also written there as nlohmann writes it: as read, but "-0" as "0".
[[gnu::always_inline]] inline bool ParseInt(const char*& p, const char* end, int64_t* out,
                                            char** w = nullptr) {
  SkipSpace(p, end);
  const bool negative = p < end && *p == '-';
  if (negative) ++p;
  if (p == end || !IsDigit(*p)) return false;
  const char* digits = p;
  int64_t value = 0;
  if (*p == '0') {
    ++p;
  } else {
    for (int n = 0; p < end && IsDigit(*p); ++n, ++p) {
      if (n == 18) return false;
      value = value * 10 + (*p - '0');
    }
  }
  if (p < end && (IsDigit(*p) || *p == '.' || *p == 'e' || *p == 'E')) return false;
  *out = negative ? -value : value;
  if (w != nullptr) {
    if (negative && value != 0) *(*w)++ = '-';
    for (const char* d = digits; d < p; ++d) *(*w)++ = *d;
  }
  return true;
}

// A string of printable ASCII without escapes (written back unchanged by nlohmann's dump).
[[gnu::always_inline]] inline bool ParseString(const char*& p, const char* end,
                                               std::string_view* out) {
  if (!Consume(p, end, '"')) return false;
  const char* start = p;
  while (p < end) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"') {
      *out = std::string_view(start, static_cast<size_t>(p - start));
      ++p;
      return out->size() <= kMaxStringBytes;
    }
    if (c < 0x20 || c >= 0x7f || c == '\\') return false;
    ++p;
  }
  return false;
}

// Whether a[0, n) == b[0, n), compared inline 8 bytes at a time (ids and keys are short: a
// call to memcmp costs more than the comparison).
[[gnu::always_inline]] inline bool SameBytes(const char* a, const char* b, size_t n) {
  for (; n >= 8; n -= 8, a += 8, b += 8) {
    uint64_t x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    if (x != y) return false;
  }
  for (; n > 0; --n, ++a, ++b) {
    if (*a != *b) return false;
  }
  return true;
}

// An id's parts other than its offsets (appended to a vector by ReadId).
struct IdParts {
  std::string_view key;
  int32_t num_offsets = 0;
  int32_t flat = -1;  // -1: None; else index into the flats vector given to ReadId
};

// Where ReadId goes on reading (p; nullptr: not in the subset) and writing (w).
struct IdCursor {
  const char* p;
  char* w;
};

// [key, [offsets...], null | [start, stop]] at c.p, written at c.w as the output line writes
// it (nlohmann's dump: no whitespace, "-0" as "0"). Every byte written stands for a byte
// read, so a buffer as long as the line always has room. Offsets are appended to `offsets`
// and a flat range to `flats` unless they are null.
IdCursor ReadId(IdCursor c, const char* end, std::vector<int64_t>* offsets,
                std::vector<FlatRange>* flats, IdParts* parts) {
  const IdCursor kFailed{nullptr, c.w};
  const char* p = c.p;
  char* w = c.w;
  if (!Consume(p, end, '[') || !Consume(p, end, '"')) return kFailed;
  *w++ = '[';
  *w++ = '"';
  // The key, copied as it is scanned: printable ASCII without escapes (see ParseString).
  const char* key = p;
  while (p < end && static_cast<unsigned char>(*p) - 0x20u < 0x5fu && *p != '"' && *p != '\\') {
    *w++ = *p++;
  }
  if (p == end || *p != '"' || static_cast<size_t>(p - key) > kMaxStringBytes) return kFailed;
  parts->key = std::string_view(key, static_cast<size_t>(p - key));
  ++p;
  if (!Consume(p, end, ',') || !Consume(p, end, '[')) return kFailed;
  std::memcpy(w, "\",[", 3);
  w += 3;
  parts->num_offsets = 0;
  if (!Consume(p, end, ']')) {
    do {
      if (parts->num_offsets > 0) *w++ = ',';
      int64_t value = 0;
      if (!ParseInt(p, end, &value, &w)) return kFailed;
      if (offsets != nullptr) offsets->push_back(value);
      ++parts->num_offsets;
    } while (Consume(p, end, ','));
    if (!Consume(p, end, ']')) return kFailed;
  }
  if (!Consume(p, end, ',')) return kFailed;
  *w++ = ']';
  *w++ = ',';
  parts->flat = -1;
  SkipSpace(p, end);
  if (end - p >= 4 && std::memcmp(p, "null", 4) == 0) {
    p += 4;
    std::memcpy(w, "null", 4);
    w += 4;
  } else {
    int64_t start = 0, stop = 0;
    if (!Consume(p, end, '[')) return kFailed;
    *w++ = '[';
    if (!ParseInt(p, end, &start, &w) || !Consume(p, end, ',')) return kFailed;
    *w++ = ',';
    if (!ParseInt(p, end, &stop, &w) || !Consume(p, end, ']')) return kFailed;
    *w++ = ']';
    if (flats != nullptr) {
      parts->flat = static_cast<int32_t>(flats->size());
      flats->push_back(FlatRange{start, stop});
    }
  }
  if (!Consume(p, end, ']')) return kFailed;
  *w++ = ']';
  return IdCursor{p, w};
}

// [rank, ...] at p appended to `holders`; the position after it, or nullptr. A rank outside
// [0, limit) is kept as -1 when `keep_out_of_range`, else refused.
const char* ReadHolders(const char* p, const char* end, int64_t limit, bool keep_out_of_range,
                        std::vector<int32_t>* holders) {
  if (!Consume(p, end, '[')) return nullptr;
  if (Consume(p, end, ']')) return p;
  do {
    int64_t rank = 0;
    if (!ParseInt(p, end, &rank)) return nullptr;
    if (rank < 0 || rank >= limit) {
      if (!keep_out_of_range) return nullptr;
      rank = -1;
    }
    holders->push_back(static_cast<int32_t>(rank));
  } while (Consume(p, end, ','));
  return Consume(p, end, ']') ? p : nullptr;
}

// One field of the top-level object, each at most once.
struct Fields {
  bool num_ranks = false, shard_to_ranks = false, shard_to_size = false, cross_group = false;
};

// Where a shard's id is in the line, as shard_to_ranks writes it.
struct RawId {
  uint32_t begin;
  uint32_t size;
};

// The streaming reader of one line (see ParseDistributeLineFast).
class LineParser {
 public:
  LineParser(std::string_view line, bool keep_out_of_range_ranks)
      : line_(line),
        p_(line.data()),
        end_(line.data() + line.size()),
        keep_out_of_range_ranks_(keep_out_of_range_ranks) {}

  std::optional<FastDistributeLine> Run() {
    if (line_.size() > kMaxFastLineBytes) return std::nullopt;
    Reserve();
    if (!Consume(p_, end_, '{')) return std::nullopt;
    do {
      std::string_view name;
      if (!ParseString(p_, end_, &name) || !Consume(p_, end_, ':') || !ReadField(name)) {
        return std::nullopt;
      }
    } while (Consume(p_, end_, ','));
    if (!Consume(p_, end_, '}')) return std::nullopt;
    SkipSpace(p_, end_);
    if (p_ != end_) return std::nullopt;
    if (!seen_.num_ranks || !seen_.shard_to_ranks || !seen_.shard_to_size) return std::nullopt;
    if (!Valid()) return std::nullopt;
    out_.ids.size = static_cast<size_t>(ids_end_ - out_.ids.buffer.get());
    return std::move(out_);
  }

 private:
  static constexpr int64_t kNotListed = -1;
  static constexpr int64_t kFail = -2;
  // Shards looked at from the last one found before building the index of all ids.
  static constexpr size_t kScan = 256;

  // A shard takes at least ~40 bytes of a line (its id twice, a rank, a size); reserving for
  // that many saves the vectors' regrowth copies (pages never touched are never faulted in).
  void Reserve() {
    const size_t shards = std::min<size_t>(line_.size() / 40, size_t{1} << 22);
    CompactDistributionInput& in = out_.input;
    in.shards.reserve(shards);
    in.list_start.reserve(shards + 1);
    in.offsets.reserve(shards * 2);
    in.holders.reserve(shards * 4);
    out_.ids.ends.reserve(shards + 1);
    raw_.reserve(shards);
    out_.ids.buffer.reset(new char[line_.size() + 1]);
    ids_end_ = out_.ids.buffer.get();
  }

  // [each(p), each(p), ...] at p_ (possibly empty), where each(p) reads one element at p
  // and returns the position after it, or nullptr.
  template <typename Each>
  bool ReadList(Each each) {
    const char* p = p_;
    if (!Consume(p, end_, '[')) return false;
    if (!Consume(p, end_, ']')) {
      do {
        p = each(p);
        if (p == nullptr) return false;
      } while (Consume(p, end_, ','));
      if (!Consume(p, end_, ']')) return false;
    }
    p_ = p;
    return true;
  }

  bool ReadField(std::string_view name) {
    if (name == "num_ranks" && !seen_.num_ranks) {
      seen_.num_ranks = true;
      return ParseInt(p_, end_, &out_.input.num_ranks);
    }
    if (name == "shard_to_ranks" && !seen_.shard_to_ranks && !seen_.shard_to_size &&
        !seen_.cross_group) {
      seen_.shard_to_ranks = true;
      ranks_before_num_ranks_ = !seen_.num_ranks;
      return ReadList([this](const char* p) { return ReadShardToRanksEntry(p); });
    }
    if (name == "shard_to_size" && seen_.shard_to_ranks && !seen_.shard_to_size) {
      seen_.shard_to_size = true;
      next_ = 0;
      return ReadList([this](const char* p) { return ReadShardToSizeEntry(p); });
    }
    if (name == "cross_group" && seen_.shard_to_ranks && !seen_.cross_group) {
      seen_.cross_group = true;
      next_ = 0;
      return ReadList([this](const char* p) { return ReadCrossGroupEntry(p); });
    }
    return false;  // unknown, repeated, or out of the order this parser takes
  }

  // [id, [ranks...]] at p: a new shard with its own holder list. A rank outside [0, N) is
  // kept as -1 with keep_out_of_range_ranks and refused otherwise (N = kMaxWorldSize until
  // num_ranks is read; Valid() checks such lists again).
  const char* ReadShardToRanksEntry(const char* p) {
    CompactDistributionInput& in = out_.input;
    if (!Consume(p, end_, '[')) return nullptr;
    SkipSpace(p, end_);
    const int64_t offsets_start = static_cast<int64_t>(in.offsets.size());
    IdParts parts;
    const IdCursor id = ReadId(IdCursor{p, ids_end_}, end_, &in.offsets, &in.flats, &parts);
    if (id.p == nullptr) return nullptr;
    raw_.push_back(RawId{static_cast<uint32_t>(p - line_.data()), static_cast<uint32_t>(id.p - p)});
    ids_end_ = id.w;
    out_.ids.ends.push_back(static_cast<size_t>(ids_end_ - out_.ids.buffer.get()));
    const int32_t key = InternKey(parts.key);
    p = id.p;
    if (!Consume(p, end_, ',')) return nullptr;
    const int64_t limit = seen_.num_ranks ? std::min(in.num_ranks, kMaxWorldSize) : kMaxWorldSize;
    p = ReadHolders(p, end_, limit, keep_out_of_range_ranks_, &in.holders);
    if (p == nullptr || !Consume(p, end_, ']')) return nullptr;
    in.list_start.push_back(static_cast<int64_t>(in.holders.size()));
    // Filled in place (a Shard built aside is copied with a slow string instruction).
    CompactDistributionInput::Shard& shard = in.shards.emplace_back();
    shard.offsets_start = offsets_start;
    shard.num_offsets = parts.num_offsets;
    shard.key = key;
    shard.holder_list = static_cast<int32_t>(in.shards.size() - 1);
    shard.flat = parts.flat;
    return p;
  }

  int32_t InternKey(std::string_view key) {
    CompactDistributionInput& in = out_.input;
    // Consecutive shards usually share a key.
    if (last_key_ >= 0 && in.keys[last_key_].size() == key.size() &&
        SameBytes(in.keys[last_key_].data(), key.data(), key.size())) {
      return last_key_;
    }
    auto [it, inserted] = key_index_.try_emplace(key, static_cast<int32_t>(in.keys.size()));
    if (inserted) in.keys.push_back(key);
    last_key_ = it->second;
    return last_key_;
  }

  // [id, bytes] at p. Sizes of shards not in shard_to_ranks are unused, but a shard listed
  // twice is refused (by the DOM path, with its field).
  const char* ReadShardToSizeEntry(const char* p) {
    std::string_view canonical;
    int64_t bytes = 0;
    if (!Consume(p, end_, '[')) return nullptr;
    const int64_t shard = FindShard(p, &canonical);
    if (shard == kFail || !Consume(p, end_, ',') || !ParseInt(p, end_, &bytes) ||
        !Consume(p, end_, ']')) {
      return nullptr;
    }
    if (shard == kNotListed) return unlisted_sized_.emplace(canonical).second ? p : nullptr;
    int64_t& size = out_.input.shards[static_cast<size_t>(shard)].size_bytes;
    if (size != CompactDistributionInput::kNoSize) return nullptr;
    size = bytes;
    return p;
  }

  // id at p; ids not in shard_to_ranks are ignored, repeats allowed.
  const char* ReadCrossGroupEntry(const char* p) {
    std::string_view canonical;
    const int64_t shard = FindShard(p, &canonical);
    if (shard == kFail) return nullptr;
    if (shard >= 0) out_.input.shards[static_cast<size_t>(shard)].cross_group = true;
    return p;
  }

  // The shard whose id is at p (which moves past it), or kNotListed (`*canonical`: the id
  // as the output writes it), or kFail. Ids are usually listed in shard_to_ranks' order, and
  // one written the same way is the same id (a JSON array ends where its brackets balance):
  // so it first compares the text with the ids of the shards after the last one found, and
  // parses the id and looks it up in an index of all ids only when that fails.
  int64_t FindShard(const char*& p, std::string_view* canonical) {
    SkipSpace(p, end_);
    const size_t remaining = static_cast<size_t>(end_ - p);
    const size_t stop = std::min(raw_.size(), next_ + (index_built_ ? 1 : kScan));
    for (size_t k = next_; k < stop; ++k) {
      const RawId raw = raw_[k];
      if (raw.size <= remaining && SameBytes(p, line_.data() + raw.begin, raw.size)) {
        p += raw.size;
        next_ = k + 1;
        return static_cast<int64_t>(k);
      }
    }
    // Written past the ids, which this id's text can never reach (see ReadId).
    IdParts parts;
    const IdCursor id = ReadId(IdCursor{p, ids_end_}, end_, nullptr, nullptr, &parts);
    if (id.p == nullptr) return kFail;
    p = id.p;
    *canonical = std::string_view(ids_end_, static_cast<size_t>(id.w - ids_end_));
    if (!index_built_ && !BuildIndex()) return kFail;
    auto it = index_.find(*canonical);
    if (it == index_.end()) return kNotListed;
    next_ = static_cast<size_t>(it->second) + 1;
    return it->second;
  }

  // False when shard_to_ranks repeats an id (DistributeShardsToRanks would refuse the line).
  bool BuildIndex() {
    index_built_ = true;
    const std::string_view text(out_.ids.buffer.get(),
                                static_cast<size_t>(ids_end_ - out_.ids.buffer.get()));
    const std::vector<size_t>& ends = out_.ids.ends;
    index_.reserve(ends.size() - 1);
    for (size_t i = 0; i + 1 < ends.size(); ++i) {
      const std::string_view id = text.substr(ends[i], ends[i + 1] - ends[i]);
      if (!index_.emplace(id, static_cast<int32_t>(i)).second) return false;
    }
    return true;
  }

  // The checks the DOM path makes after parsing: num_ranks in range, every holder in
  // [0, num_ranks) unless kept as Megatron keeps them, every shard sized.
  bool Valid() {
    CompactDistributionInput& in = out_.input;
    if (in.num_ranks < 0 || in.num_ranks > kMaxWorldSize) return false;
    if (ranks_before_num_ranks_) {
      for (int32_t& rank : in.holders) {
        if (rank >= in.num_ranks || rank < 0) {
          if (!keep_out_of_range_ranks_) return false;
          rank = -1;
        }
      }
    }
    for (const CompactDistributionInput::Shard& shard : in.shards) {
      if (shard.size_bytes == CompactDistributionInput::kNoSize) return false;
    }
    return true;
  }

  std::string_view line_;
  const char* p_;  // where the line is read on
  const char* end_;
  bool keep_out_of_range_ranks_;
  Fields seen_;
  bool ranks_before_num_ranks_ = false;
  FastDistributeLine out_;
  char* ids_end_ = nullptr;  // end of the ids written so far
  std::vector<RawId> raw_;   // each shard's id as the line has it
  absl::flat_hash_map<std::string_view, int32_t> key_index_;
  int32_t last_key_ = -1;  // the key of the last shard read
  size_t next_ = 0;        // the shard after the last one FindShard found
  bool index_built_ = false;
  absl::flat_hash_map<std::string_view, int32_t> index_;  // id as the output writes it
  absl::flat_hash_set<std::string> unlisted_sized_;
};

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

std::optional<FastDistributeLine> ParseDistributeLineFast(absl::string_view line,
                                                          bool keep_out_of_range_ranks) {
  return LineParser(std::string_view(line.data(), line.size()), keep_out_of_range_ranks).Run();
}

FormattedShardIds FormatShardIds(const DistributionInput& input) {
  std::string text;
  FormattedShardIds ids;
  ids.ends.reserve(input.shards.size() + 1);
  for (const DistributablePiece& shard : input.shards) {
    AppendPieceId(&text, shard.id);
    ids.ends.push_back(text.size());
  }
  ids.buffer.reset(new char[text.size() + 1]);
  std::memcpy(ids.buffer.get(), text.data(), text.size());
  ids.size = text.size();
  return ids;
}

std::string FormatDistributeResult(const FormattedShardIds& ids,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds) {
  constexpr std::string_view kHead = "{\"assignment\":[";
  constexpr std::string_view kSeconds = "],\"plan_seconds\":";
  const std::string seconds = nlohmann::json(plan_seconds).dump();
  int64_t max_rank = 0;
  for (const ShardAssignment& a : assignment) max_rank = std::max(max_rank, a.rank);
  char digits[24];
  const size_t rank_digits =
      static_cast<size_t>(std::to_chars(digits, digits + sizeof(digits), max_rank).ptr - digits);
  // "[" id "," rank "]" and a comma per pair; the closing '}' and a '\n' the caller may add.
  const size_t bound = kHead.size() + ids.size + assignment.size() * (4 + rank_digits) +
                       kSeconds.size() + seconds.size() + 2;
  std::string out;
  out.resize(bound);
  char* w = out.data();
  const auto put = [&w](std::string_view s) {
    std::memcpy(w, s.data(), s.size());
    w += s.size();
  };
  put(kHead);
  const char* text = ids.buffer.get();
  const size_t n = assignment.size();
  constexpr size_t kPrefetch = 8;
  for (size_t i = 0; i < n; ++i) {
    // The ids are read in visiting order, all over the buffer: fetch them ahead of use.
    if (i + 2 * kPrefetch < n) __builtin_prefetch(&ids.ends[assignment[i + 2 * kPrefetch].shard]);
    if (i + kPrefetch < n) __builtin_prefetch(text + ids.ends[assignment[i + kPrefetch].shard]);
    if (i > 0) *w++ = ',';
    *w++ = '[';
    const size_t shard = static_cast<size_t>(assignment[i].shard);
    put(std::string_view(text + ids.ends[shard], ids.ends[shard + 1] - ids.ends[shard]));
    *w++ = ',';
    w = std::to_chars(w, w + 20, assignment[i].rank).ptr;
    *w++ = ']';
  }
  put(kSeconds);
  put(seconds);
  *w++ = '}';
  out.resize(static_cast<size_t>(w - out.data()));
  return out;
}

std::string FormatDistributeResult(const DistributionInput& input,
                                   const std::vector<ShardAssignment>& assignment,
                                   double plan_seconds) {
  return FormatDistributeResult(FormatShardIds(input), assignment, plan_seconds);
}

}  // namespace ckpt::ckptctl
