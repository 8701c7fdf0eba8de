// Bounds on untrusted JSON, checked in one streaming pass before any DOM is built.
//
// nlohmann's parser itself is iterative, but a DOM that is nested 200,000 deep is not safe
// to use: dump(), comparisons and any recursive walk overflow the stack (a gRPC handler's
// thread has a small one). Repeated object keys are silently resolved by the DOM (the last
// wins), so a layout or plan input could say two things at once. CheckJson rejects both, and
// bounds size, value count and string length, with an error naming the JSON path.
#ifndef CKPT_COMMON_JSON_GUARD_H_
#define CKPT_COMMON_JSON_GUARD_H_

#include <cstdint>
#include <exception>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// What a document may hold. Every scalar, array and object counts as one value.
struct JsonLimits {
  int64_t max_bytes = int64_t{1} << 20;
  int max_depth = 32;  // arrays/objects open at once; a bare scalar has depth 0
  int64_t max_values = int64_t{1} << 20;
  int64_t max_string_bytes = int64_t{1} << 16;  // each string value and each key
};

// Checks that `text` is one valid JSON value within `limits` in which no object repeats a
// key. Errors are InvalidArgument "<where>: <what>", where <where> is a JSON path such as
// `rules[2].placements` ("(document)" for the whole text), e.g.
//   `mesh: key "tp" appears twice in this object`
//   `rules[0].comment: nested deeper than the limit of 32 levels`
//   `(document): not valid JSON: parse error at line 1, column 3: ...`
// Uses no recursion and allocates no more than the text's size.
absl::Status CheckJson(absl::string_view text, const JsonLimits& limits);

// CheckJson, then the DOM of `text` (JsonT: nlohmann::json or nlohmann::ordered_json). No
// exception escapes: a failed allocation is ResourceExhausted.
template <typename JsonT>
absl::StatusOr<JsonT> ParseGuardedJson(absl::string_view text, const JsonLimits& limits) {
  absl::Status checked = CheckJson(text, limits);
  if (!checked.ok()) return checked;
  try {
    JsonT parsed = JsonT::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) {
      return absl::InternalError("(document): the JSON parser rejected a checked document");
    }
    return parsed;
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("(document): ", e.what()));
  }
}

}  // namespace ckpt

#endif  // CKPT_COMMON_JSON_GUARD_H_
