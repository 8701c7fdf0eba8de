#include "sharding/piece_id.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

std::string PieceId::DebugString() const {
  std::string offs = offsets.size() == 1 ? absl::StrCat("(", offsets[0], ",)")
                                         : absl::StrCat("(", absl::StrJoin(offsets, ", "), ")");
  std::string range = flat ? absl::StrCat("(", flat->start, ", ", flat->stop, ")") : "None";
  return absl::StrCat("('", key, "', ", offs, ", ", range, ")");
}

int ComparePieceIds(const PieceId& a, const PieceId& b, bool* incomparable) {
  if (incomparable != nullptr) *incomparable = false;
  // std::string::compare uses char_traits<char>::compare, which compares as unsigned char.
  if (int c = a.key.compare(b.key); c != 0) return c < 0 ? -1 : 1;
  const size_t n = std::min(a.offsets.size(), b.offsets.size());
  for (size_t i = 0; i < n; ++i) {
    if (a.offsets[i] != b.offsets[i]) return a.offsets[i] < b.offsets[i] ? -1 : 1;
  }
  if (a.offsets.size() != b.offsets.size()) return a.offsets.size() < b.offsets.size() ? -1 : 1;
  if (a.flat.has_value() != b.flat.has_value()) {
    if (incomparable != nullptr) *incomparable = true;
    return a.flat.has_value() ? 1 : -1;
  }
  if (!a.flat) return 0;
  if (a.flat->start != b.flat->start) return a.flat->start < b.flat->start ? -1 : 1;
  if (a.flat->stop != b.flat->stop) return a.flat->stop < b.flat->stop ? -1 : 1;
  return 0;
}

}  // namespace ckpt
