#include "proto/status_detail.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt {

pb::StatusDetail ToDetail(const absl::Status& status) {
  pb::StatusDetail d;
  d.set_code(static_cast<int32_t>(status.code()));
  d.set_message(std::string(status.message()));
  return d;
}

absl::Status FromDetail(const pb::StatusDetail& detail) {
  if (detail.code() == 0) return absl::OkStatus();
  if (detail.code() < 0 || detail.code() > 16) {
    return absl::UnknownError(absl::StrCat("(status code ", detail.code(), ") ", detail.message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(detail.code()), detail.message());
}

}  // namespace ckpt
