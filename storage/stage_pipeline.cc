#include "storage/stage_pipeline.h"

#include <future>
#include <utility>

namespace ckpt {

char* ReusedBuffer::Get(int64_t bytes) {
  if (bytes < 1) bytes = 1;
  if (size_ < bytes) {
    data_.reset();  // first, to keep the peak low
    data_.reset(new char[bytes]);
    size_ = bytes;
    ++allocations_;
  }
  return data_.get();
}

absl::Status RunStagePipeline(int64_t steps, const PipelineStage& produce,
                              const PipelineStage& consume, bool overlap) {
  if (!overlap) {
    for (int64_t k = 0; k < steps; ++k) {
      if (absl::Status s = produce(k, static_cast<int>(k % 2)); !s.ok()) return s;
      if (absl::Status s = consume(k, static_cast<int>(k % 2)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::future<absl::Status> consuming;  // consume of the previous step, when running
  auto join = [&consuming]() -> absl::Status {
    return consuming.valid() ? consuming.get() : absl::OkStatus();
  };
  for (int64_t k = 0; k < steps; ++k) {
    const int slot = static_cast<int>(k % 2);
    // Slot `slot` was last drained by consume(k - 2), which was joined before consume(k - 1)
    // started, so it is free here.
    absl::Status produced = produce(k, slot);
    absl::Status previous = join();
    if (!previous.ok()) return previous;
    if (!produced.ok()) return produced;
    consuming = std::async(std::launch::async, [&consume, k, slot] { return consume(k, slot); });
  }
  return join();
}

}  // namespace ckpt
