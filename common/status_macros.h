// Status propagation macros: Abseil 20220623 (Debian 12) has no ABSL_RETURN_IF_ERROR /
// ABSL_ASSIGN_OR_RETURN, so the project defines its own two; and WithContext, which prefixes
// an error's message with where it happened.
#ifndef CKPT_COMMON_STATUS_MACROS_H_
#define CKPT_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// The same status with `context` (e.g. "source checkpoint: ") before its message.
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, status.message()));
}

}  // namespace ckpt

#define CKPT_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPT_STATUS_CONCAT_(a, b) CKPT_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define CKPT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status ckpt_status_ = (expr);        \
    if (!ckpt_status_.ok()) return ckpt_status_; \
  } while (false)

// `CKPT_ASSIGN_OR_RETURN(auto x, F());` declares/assigns x from an OK StatusOr, else returns.
#define CKPT_ASSIGN_OR_RETURN(lhs, expr) \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_STATUS_CONCAT_(ckpt_statusor_, __LINE__), lhs, expr)

#define CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#endif  // CKPT_COMMON_STATUS_MACROS_H_
