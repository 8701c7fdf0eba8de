// The time source of the coordinator's pure state machines. Injected so that tests drive
// leases and deadlines with a FakeClock instead of sleeping.
#ifndef CKPT_COORDINATOR_CLOCK_H_
#define CKPT_COORDINATOR_CLOCK_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckpt::coordinator {

// Reads the current time. Implementations must be safe to call from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// Wall-clock time (absl::Now()), used by the daemons.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that only moves when a test tells it to. Not thread-safe; tests own it.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}
  absl::Time Now() const override { return now_; }
  void Advance(absl::Duration d) { now_ += d; }
  void Set(absl::Time t) { now_ = t; }

 private:
  absl::Time now_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_CLOCK_H_
