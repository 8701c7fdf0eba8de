#include "worker/memory_gate.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace ckpt::worker {

MemoryGate::MemoryGate(std::function<absl::Status()> precondition)
    : precondition_(std::move(precondition)) {}

void MemoryGate::Close(const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reason_.ok()) {
    reason_ = reason.ok() ? absl::CancelledError("the operation was cancelled") : reason;
  }
  while (active_ > 0) idle_.wait(mu_);
}

absl::Status MemoryGate::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

absl::Status MemoryGate::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (reason_.ok() && precondition_) {
    absl::Status s = precondition_();
    if (!s.ok()) reason_ = std::move(s);
  }
  if (!reason_.ok()) return reason_;
  ++active_;
  return absl::OkStatus();
}

void MemoryGate::Exit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--active_ == 0) idle_.notify_all();
}

absl::Status MemoryGate::Run(absl::FunctionRef<absl::Status()> access) {
  if (absl::Status s = Enter(); !s.ok()) return s;
  absl::Status result = access();
  Exit();
  return result;
}

absl::Status MemoryGate::Copy(void* dst, const void* src, size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(kChunkBytes, bytes - done);
    absl::Status copied = Run([&] {
      std::memcpy(d + done, s + done, n);
      return absl::OkStatus();
    });
    if (!copied.ok()) return copied;
    done += n;
  }
  return absl::OkStatus();
}

absl::Status MemoryGate::CopyRuns(absl::Span<const CopyRun> runs, int64_t elem_size,
                                  const void* src, void* dst) {
  const int64_t chunk_elements =
      std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(elem_size, 1));
  std::vector<CopyRun> batch;
  int64_t batched = 0;
  auto flush = [&] {
    absl::Status s = Run([&] {
      ckpt::CopyRuns(batch, elem_size, src, dst);
      return absl::OkStatus();
    });
    batch.clear();
    batched = 0;
    return s;
  };
  for (const CopyRun& run : runs) {
    for (int64_t at = 0; at < run.length;) {
      const int64_t n = std::min(run.length - at, chunk_elements - batched);
      batch.push_back(CopyRun{run.src_offset + at, run.dst_offset + at, n});
      batched += n;
      at += n;
      if (batched >= chunk_elements) {
        if (absl::Status s = flush(); !s.ok()) return s;
      }
    }
  }
  return batch.empty() ? absl::OkStatus() : flush();
}

}  // namespace ckpt::worker
