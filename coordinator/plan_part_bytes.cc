#include "coordinator/plan_part_bytes.h"

#include <utility>

namespace ckpt::coordinator {

PlanPartBytes PlanPartBytes::WithTail(std::shared_ptr<const std::string> tail) const {
  PlanPartBytes out;
  out.body_ = body_;
  out.body_id_ = body_id_;
  out.tail_ = std::move(tail);
  if (tail_ != nullptr && out.tail_ != nullptr) {
    out.tail_ = std::make_shared<const std::string>(*tail_ + *out.tail_);
  } else if (tail_ != nullptr) {
    out.tail_ = tail_;
  }
  return out;
}

PlanPartBytes PlanPartBytes::WithBodyId(std::shared_ptr<const std::string> id) const {
  PlanPartBytes out = *this;
  out.body_id_ = std::move(id);
  return out;
}

const std::string& PlanPartBytes::body_id() const {
  static const std::string* const kNone = new std::string();
  return body_id_ ? *body_id_ : *kNone;
}

std::string PlanPartBytes::Bytes() const {
  std::string out;
  out.reserve(size());
  if (body_ != nullptr) out += *body_;
  if (tail_ != nullptr) out += *tail_;
  return out;
}

}  // namespace ckpt::coordinator
