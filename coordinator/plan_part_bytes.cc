#include "coordinator/plan_part_bytes.h"

#include <utility>

namespace ckpt::coordinator {

PlanPartBytes PlanPartBytes::WithTail(std::shared_ptr<const std::string> tail) const {
  PlanPartBytes out;
  out.body_ = body_;
  out.tail_ = std::move(tail);
  if (tail_ != nullptr && out.tail_ != nullptr) {
    out.tail_ = std::make_shared<const std::string>(*tail_ + *out.tail_);
  } else if (tail_ != nullptr) {
    out.tail_ = tail_;
  }
  return out;
}

std::string PlanPartBytes::Bytes() const {
  std::string out;
  out.reserve(size());
  if (body_ != nullptr) out += *body_;
  if (tail_ != nullptr) out += *tail_;
  return out;
}

}  // namespace ckpt::coordinator
