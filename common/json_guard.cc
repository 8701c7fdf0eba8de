#include "common/json_guard.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using Json = nlohmann::json;

// Longest key or parser message quoted in an error.
constexpr size_t kMaxQuoted = 64;
constexpr size_t kMaxParserMessage = 240;

// `text` cut to `max` bytes with control bytes escaped, so an error stays one short line.
std::string Quoted(absl::string_view text, size_t max) {
  std::string out;
  for (unsigned char c : text.substr(0, max)) {
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

// A SAX consumer that builds nothing: it tracks the open containers (for the path and the
// depth), counts values and remembers each open object's keys.
class GuardSax : public nlohmann::json_sax<Json> {
 public:
  explicit GuardSax(const JsonLimits& limits) : limits_(limits) {}

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t& value) override { return Value() && Fits(value); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(/*object=*/true); }
  bool start_array(std::size_t) override { return Open(/*object=*/false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }

  bool key(string_t& key) override {
    if (!Fits(key)) return false;
    Frame& frame = frames_.back();
    if (!frame.keys.insert(key).second) {
      frame.key.reset();  // the path names the object
      return Fail(
          absl::StrCat("key \"", Quoted(key, kMaxQuoted), "\" appears twice in this object"));
    }
    frame.key = std::move(key);
    return true;
  }

  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& error) override {
    absl::string_view what = error.what();
    if (size_t bracket = what.find("] "); bracket != absl::string_view::npos) {
      what.remove_prefix(bracket + 2);  // "[json.exception.parse_error.101] "
    }
    frames_.clear();  // the message carries the position
    return Fail(absl::StrCat("not valid JSON: ", Quoted(what, kMaxParserMessage)));
  }

  absl::Status status() const { return status_; }

 private:
  struct Frame {
    bool object = false;
    int64_t index = -1;              // arrays: the element being read
    std::optional<std::string> key;  // objects: the member being read
    absl::flat_hash_set<std::string> keys;
  };

  // One value starts here (a scalar, or an array/object about to open).
  bool Value() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    if (++values_ > limits_.max_values) {
      return Fail(absl::StrCat("more than the limit of ", limits_.max_values, " JSON values"));
    }
    return true;
  }

  bool Open(bool object) {
    if (!Value()) return false;
    if (static_cast<int64_t>(frames_.size()) >= limits_.max_depth) {
      return Fail(absl::StrCat("nested deeper than the limit of ", limits_.max_depth, " levels"));
    }
    frames_.emplace_back();
    frames_.back().object = object;
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  bool Fits(const std::string& text) {
    if (static_cast<int64_t>(text.size()) <= limits_.max_string_bytes) return true;
    return Fail(absl::StrCat("a string of ", text.size(), " bytes, more than the limit of ",
                             limits_.max_string_bytes));
  }

  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (f.object && f.key) {
        absl::StrAppend(&path, path.empty() ? "" : ".",
                        f.key->empty() ? "\"\"" : Quoted(*f.key, kMaxQuoted));
      } else if (!f.object && f.index >= 0) {
        absl::StrAppend(&path, "[", f.index, "]");
      }
    }
    return path.empty() ? "(document)" : path;
  }

  bool Fail(absl::string_view what) {
    status_ = absl::InvalidArgumentError(absl::StrCat(Path(), ": ", what));
    return false;
  }

  const JsonLimits& limits_;
  std::vector<Frame> frames_;
  int64_t values_ = 0;
  absl::Status status_;
};

}  // namespace

absl::Status CheckJson(absl::string_view text, const JsonLimits& limits) {
  if (static_cast<int64_t>(text.size()) > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("(document): ", text.size(),
                                                   " bytes, more than the limit of ",
                                                   limits.max_bytes, " bytes"));
  }
  GuardSax sax(limits);
  try {
    const bool ok = Json::sax_parse(text.begin(), text.end(), &sax);
    if (!ok && sax.status().ok()) {
      return absl::InvalidArgumentError("(document): not valid JSON");
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("(document): not valid JSON: ", Quoted(e.what(), kMaxParserMessage)));
  }
  return sax.status();
}

}  // namespace ckpt
