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

// A cursor over one line. Every method answers false for anything outside the subset this
// parser handles; the line is then given to the DOM path.
class Reader {
 public:
  explicit Reader(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  const char* pos() const { return p_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void Skip(size_t n) { p_ += n; }

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
  bool String(std::string_view* out) {
    if (!Consume('"')) return false;
    const char* start = p_;
    while (p_ < end_) {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *out = std::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return out->size() <= kMaxStringBytes;
      }
      if (c < 0x20 || c >= 0x7f || c == '\\') return false;
      ++p_;
    }
    return false;
  }
  // -?(0|[1-9][0-9]{0,17}) not followed by a digit, '.', 'e' or 'E' (floats go to the DOM);
  // `*text` is the number as written.
  bool Int(int64_t* out, std::string_view* text = nullptr) {
    SkipSpace();
    const char* start = p_;
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
    if (text != nullptr) *text = std::string_view(start, static_cast<size_t>(p_ - start));
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

// Writes an id's text as the output line writes it (nlohmann's dump: no whitespace) at an
// unchecked cursor. Each token written is at most as long as the token read (whitespace is
// dropped, "-0" becomes "0", everything else is copied), so a buffer as long as the line
// always has room.
class IdWriter {
 public:
  explicit IdWriter(char* at) : w_(at) {}
  char* pos() const { return w_; }
  void Put(char c) { *w_++ = c; }
  void Put(std::string_view s) {
    std::memcpy(w_, s.data(), s.size());
    w_ += s.size();
  }
  void PutInt(std::string_view text) {
    if (text == "-0") {
      Put('0');
    } else {
      Put(text);
    }
  }

 private:
  char* w_;
};

// An id's parts other than its offsets (appended to a vector by ReadId).
struct IdParts {
  std::string_view key;
  int32_t num_offsets = 0;
  int32_t flat = -1;  // -1: None; else index into the flats vector given to ReadId
};

// [key, [offsets...], null | [start, stop]] at `r`, written as the output writes it by `w`.
// Offsets are appended to `offsets` and a flat range to `flats` unless they are null.
bool ReadId(Reader& r, IdWriter& w, std::vector<int64_t>* offsets, std::vector<FlatRange>* flats,
            IdParts* parts) {
  if (!r.Consume('[') || !r.String(&parts->key) || !r.Consume(',') || !r.Consume('[')) {
    return false;
  }
  w.Put('[');
  w.Put('"');
  w.Put(parts->key);
  w.Put("\",[");
  parts->num_offsets = 0;
  if (!r.Consume(']')) {
    do {
      int64_t value = 0;
      std::string_view text;
      if (!r.Int(&value, &text)) return false;
      if (parts->num_offsets > 0) w.Put(',');
      w.PutInt(text);
      if (offsets != nullptr) offsets->push_back(value);
      ++parts->num_offsets;
    } while (r.Consume(','));
    if (!r.Consume(']')) return false;
  }
  if (!r.Consume(',')) return false;
  w.Put("],");
  parts->flat = -1;
  if (r.Null()) {
    w.Put("null");
  } else {
    int64_t start = 0, stop = 0;
    std::string_view start_text, stop_text;
    if (!r.Consume('[') || !r.Int(&start, &start_text) || !r.Consume(',') ||
        !r.Int(&stop, &stop_text) || !r.Consume(']')) {
      return false;
    }
    w.Put('[');
    w.PutInt(start_text);
    w.Put(',');
    w.PutInt(stop_text);
    w.Put(']');
    if (flats != nullptr) {
      parts->flat = static_cast<int32_t>(flats->size());
      flats->push_back(FlatRange{start, stop});
    }
  }
  if (!r.Consume(']')) return false;
  w.Put(']');
  return true;
}

// One field of the top-level object, each at most once.
struct Fields {
  bool num_ranks = false, shard_to_ranks = false, shard_to_size = false, cross_group = false;
};

// The streaming reader of one line (see ParseDistributeLineFast).
class LineParser {
 public:
  LineParser(std::string_view line, bool keep_out_of_range_ranks)
      : line_(line), r_(line), keep_out_of_range_ranks_(keep_out_of_range_ranks) {}

  std::optional<FastDistributeLine> Run() {
    if (line_.size() > kMaxFastLineBytes) return std::nullopt;
    Reserve();
    if (!r_.Consume('{')) return std::nullopt;
    do {
      std::string_view name;
      if (!r_.String(&name) || !r_.Consume(':') || !ReadField(name)) return std::nullopt;
    } while (r_.Consume(','));
    if (!r_.Consume('}') || !r_.AtEnd()) return std::nullopt;
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
    raw_begin_.reserve(shards);
    raw_len_.reserve(shards);
    out_.ids.buffer.reset(new char[line_.size() + 1]);
    ids_end_ = out_.ids.buffer.get();
  }

  bool ReadField(std::string_view name) {
    if (name == "num_ranks" && !seen_.num_ranks) {
      seen_.num_ranks = true;
      return r_.Int(&out_.input.num_ranks);
    }
    if (name == "shard_to_ranks" && !seen_.shard_to_ranks && !seen_.shard_to_size &&
        !seen_.cross_group) {
      seen_.shard_to_ranks = true;
      ranks_before_num_ranks_ = !seen_.num_ranks;
      return r_.List([&] { return ReadShardToRanksEntry(); });
    }
    if (name == "shard_to_size" && seen_.shard_to_ranks && !seen_.shard_to_size) {
      seen_.shard_to_size = true;
      next_ = 0;
      return r_.List([&] { return ReadShardToSizeEntry(); });
    }
    if (name == "cross_group" && seen_.shard_to_ranks && !seen_.cross_group) {
      seen_.cross_group = true;
      next_ = 0;
      return r_.List([&] { return ReadCrossGroupEntry(); });
    }
    return false;  // unknown, repeated, or out of the order this parser takes
  }

  // [id, [ranks...]]: a new shard with its own holder list.
  bool ReadShardToRanksEntry() {
    CompactDistributionInput& in = out_.input;
    if (!r_.Consume('[')) return false;
    r_.SkipSpace();
    const char* raw = r_.pos();
    IdWriter w(ids_end_);
    CompactDistributionInput::Shard shard;
    shard.offsets_start = static_cast<int64_t>(in.offsets.size());
    IdParts parts;
    if (!ReadId(r_, w, &in.offsets, &in.flats, &parts)) return false;
    raw_begin_.push_back(static_cast<uint32_t>(raw - line_.data()));
    raw_len_.push_back(static_cast<uint32_t>(r_.pos() - raw));
    ids_end_ = w.pos();
    out_.ids.ends.push_back(static_cast<size_t>(ids_end_ - out_.ids.buffer.get()));
    shard.num_offsets = parts.num_offsets;
    shard.flat = parts.flat;
    shard.key = InternKey(parts.key);
    shard.holder_list = static_cast<int32_t>(in.shards.size());
    if (!r_.Consume(',') || !ReadHolders() || !r_.Consume(']')) return false;
    in.shards.push_back(shard);
    return true;
  }

  // [rank, ...] appended as one holder list. A rank outside [0, N) is kept as -1 with
  // keep_out_of_range_ranks and refused otherwise (N = kMaxWorldSize until num_ranks is read;
  // Valid() checks such lists again).
  bool ReadHolders() {
    CompactDistributionInput& in = out_.input;
    const int64_t limit = seen_.num_ranks ? std::min(in.num_ranks, kMaxWorldSize) : kMaxWorldSize;
    const bool read = r_.List([&] {
      int64_t rank = 0;
      if (!r_.Int(&rank)) return false;
      if (rank < 0 || rank >= limit) {
        if (!keep_out_of_range_ranks_) return false;
        rank = -1;
      }
      in.holders.push_back(static_cast<int32_t>(rank));
      return true;
    });
    in.list_start.push_back(static_cast<int64_t>(in.holders.size()));
    return read;
  }

  int32_t InternKey(std::string_view key) {
    CompactDistributionInput& in = out_.input;
    // Consecutive shards usually share a key.
    if (!in.shards.empty() && in.keys[in.shards.back().key] == key) return in.shards.back().key;
    auto [it, inserted] = key_index_.try_emplace(key, static_cast<int32_t>(in.keys.size()));
    if (inserted) in.keys.push_back(key);
    return it->second;
  }

  // [id, bytes]. Sizes of shards not in shard_to_ranks are unused, but a shard listed twice
  // is refused (by the DOM path, with its field).
  bool ReadShardToSizeEntry() {
    std::string_view canonical;
    int64_t bytes = 0;
    if (!r_.Consume('[')) return false;
    const int64_t shard = FindShard(&canonical);
    if (shard == kFail || !r_.Consume(',') || !r_.Int(&bytes) || !r_.Consume(']')) return false;
    if (shard == kNotListed) return unlisted_sized_.emplace(canonical).second;
    int64_t& size = out_.input.shards[static_cast<size_t>(shard)].size_bytes;
    if (size != CompactDistributionInput::kNoSize) return false;
    size = bytes;
    return true;
  }

  // id; ids not in shard_to_ranks are ignored, repeats allowed.
  bool ReadCrossGroupEntry() {
    std::string_view canonical;
    const int64_t shard = FindShard(&canonical);
    if (shard == kFail) return false;
    if (shard >= 0) out_.input.shards[static_cast<size_t>(shard)].cross_group = true;
    return true;
  }

  // The shard whose id is at the reader (which moves past it), or kNotListed (`*canonical`:
  // the id as the output writes it), or kFail. Ids are usually listed in shard_to_ranks'
  // order, and one written the same way is the same id (a JSON array ends where its
  // brackets balance): so it first compares the text with the ids of the shards after the
  // last one found, and parses the id and looks it up in an index of all ids only when that
  // fails.
  int64_t FindShard(std::string_view* canonical) {
    r_.SkipSpace();
    const size_t num_shards = raw_len_.size();
    const size_t stop = std::min(num_shards, next_ + (index_built_ ? 1 : kScan));
    for (size_t k = next_; k < stop; ++k) {
      const size_t len = raw_len_[k];
      if (len <= r_.remaining() && std::memcmp(r_.pos(), line_.data() + raw_begin_[k], len) == 0) {
        r_.Skip(len);
        next_ = k + 1;
        return static_cast<int64_t>(k);
      }
    }
    // Written past the ids, which this id's text can never reach (see IdWriter).
    IdWriter w(ids_end_);
    IdParts parts;
    if (!ReadId(r_, w, nullptr, nullptr, &parts)) return kFail;
    *canonical = std::string_view(ids_end_, static_cast<size_t>(w.pos() - ids_end_));
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
  Reader r_;
  bool keep_out_of_range_ranks_;
  Fields seen_;
  bool ranks_before_num_ranks_ = false;
  FastDistributeLine out_;
  char* ids_end_ = nullptr;                    // end of the ids written so far
  std::vector<uint32_t> raw_begin_, raw_len_;  // each shard's id as the line has it
  absl::flat_hash_map<std::string_view, int32_t> key_index_;
  size_t next_ = 0;  // the shard after the last one FindShard found
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
  for (size_t i = 0; i < assignment.size(); ++i) {
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
