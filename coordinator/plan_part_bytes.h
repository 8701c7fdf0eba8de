// A serialized plan part held by reference, so that the holders of one part (the operation's
// rank entry that dispatches it, the job's kept save plan that a repeat save reuses) share one
// copy of its bytes: at 100k GPT ranks the save plan parts are ~1.1 GiB, and each copy of
// them (reuse kept one, a reused plan made another, dispatch a third) was another ~1.1 GiB.
//
// Pure: no gRPC, threads or logging. Immutable once built; copies share the bytes and may be
// read from any thread.
#ifndef CKPT_COORDINATOR_PLAN_PART_BYTES_H_
#define CKPT_COORDINATOR_PLAN_PART_BYTES_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace ckpt::coordinator {

// The part's bytes are a body followed by an optional tail: fields appended to the body's
// message (protobuf parsing keeps the last value of a singular field, so a tail can replace
// a field of the body without copying it; a reused save plan's staging directory is one).
// Copying one copies two pointers.
class PlanPartBytes {
 public:
  PlanPartBytes() = default;
  // Takes `bytes` (a serialized part) as the body, without copying it.
  PlanPartBytes(std::string bytes)  // NOLINT(runtime/explicit): parts are assigned serializations
      : body_(std::make_shared<const std::string>(std::move(bytes))) {}

  // This part's body shared, with `tail` (serialized fields) appended after any tail it has;
  // parts given one tail share it (a reused plan's parts all get the same staging field).
  PlanPartBytes WithTail(std::shared_ptr<const std::string> tail) const;
  // This part with its body named `id` (the operation that planned it): a worker may keep a
  // named body and later be sent only a tail to append to it (a reused save plan's parts).
  PlanPartBytes WithBodyId(std::shared_ptr<const std::string> id) const;
  const std::string& body_id() const;
  size_t body_size() const { return body_ ? body_->size() : 0; }
  // The tail alone (empty when none).
  std::string TailBytes() const { return tail_ ? *tail_ : std::string(); }

  bool empty() const { return size() == 0; }
  size_t size() const { return (body_ ? body_->size() : 0) + (tail_ ? tail_->size() : 0); }
  // The part's bytes, materialized (body then tail).
  std::string Bytes() const;
  // Whether two parts share one body (for tests and accounting).
  bool SharesBodyWith(const PlanPartBytes& other) const {
    return body_ != nullptr && body_ == other.body_;
  }

  friend bool operator==(const PlanPartBytes& a, absl::string_view b) {
    return a.size() == b.size() && a.Bytes() == b;
  }

 private:
  std::shared_ptr<const std::string> body_;
  std::shared_ptr<const std::string> tail_;
  std::shared_ptr<const std::string> body_id_;  // shared by a plan's parts
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_PLAN_PART_BYTES_H_
