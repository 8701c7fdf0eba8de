#include "worker/save_write_pipeline.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

SaveWritePipeline::SaveWritePipeline(std::vector<DataFileStream*> streams, std::string who,
                                     std::function<absl::Status()> stop,
                                     std::function<void(const SavePipelineEvent&)> trace)
    : streams_(std::move(streams)),
      who_(std::move(who)),
      stop_(std::move(stop)),
      trace_(std::move(trace)) {
  thread_ = std::thread([this] { Run(); });
}

SaveWritePipeline::~SaveWritePipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Fail(absl::CancelledError(absl::StrCat(who_, ": the save's writes were stopped")));
    input_closed_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SaveWritePipeline::Fail(const absl::Status& s) {
  if (error_.ok()) error_ = s;
}

void SaveWritePipeline::Push(SaveWriteItem item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(item));
  }
  changed_.notify_all();
}

void SaveWritePipeline::CloseInput() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    input_closed_ = true;
  }
  changed_.notify_all();
}

absl::Status SaveWritePipeline::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int64_t SaveWritePipeline::bytes_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_written_;
}

absl::Status SaveWritePipeline::AppendLocked(int file, int piece, const void* data, int64_t bytes) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  absl::Status s = streams_[file]->Append(piece, data, bytes);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(who_, ": writing ", streams_[file]->path(), ": ", s.message()));
  }
  return s;
}

absl::Status SaveWritePipeline::Write(SaveWriteItem& item) {
  if (stop_) {
    if (absl::Status s = stop_(); !s.ok()) return s;
  }
  DataFileStream& stream = *streams_[item.file];
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    s = item.piece < 0 ? stream.AppendData(item.data, item.bytes)
                       : stream.Append(item.piece, item.data, item.bytes);
  }
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(who_, ": writing ", stream.path(), ": ", s.message()));
  }
  if (trace_ && item.sequence >= 0) {
    trace_(SavePipelineEvent{SavePipelineEvent::kWritten, item.sequence});
  }
  return absl::OkStatus();
}

void SaveWritePipeline::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [this] { return !queue_.empty() || input_closed_; });
    if (queue_.empty()) return;  // closed and everything written (or dropped)
    SaveWriteItem item = std::move(queue_.front());
    queue_.pop_front();
    if (!error_.ok()) {  // dropped: its chunk goes back to the pool
      lock.unlock();
      item.chunk.Reset();
      lock.lock();
      changed_.notify_all();
      continue;
    }
    busy_ = true;
    lock.unlock();
    absl::Status s = Write(item);
    item.chunk.Reset();  // back to the pool: the snapshot may copy the next chunk into it
    lock.lock();
    busy_ = false;
    if (s.ok()) {
      bytes_written_ += item.bytes;
    } else {
      Fail(s);
    }
    changed_.notify_all();
  }
}

absl::Status SaveWritePipeline::Drain(const std::function<void(int64_t)>& progress,
                                      const std::function<bool()>& cancelled) {
  constexpr auto kEvery = std::chrono::milliseconds(500);
  auto next_report = std::chrono::steady_clock::now() + kEvery;
  std::unique_lock<std::mutex> lock(mu_);
  while (error_.ok() && (!queue_.empty() || busy_ || !input_closed_)) {
    changed_.wait_until(lock, next_report);
    if (std::chrono::steady_clock::now() < next_report) continue;
    next_report += kEvery;
    const int64_t written = bytes_written_;
    lock.unlock();
    const bool stop = cancelled && cancelled();
    if (progress) progress(written);
    lock.lock();
    if (stop) {
      Fail(absl::CancelledError(absl::StrCat(
          who_, ": the operation was aborted; stopped after writing ", written, " bytes")));
    }
  }
  absl::Status result = error_;
  lock.unlock();
  if (result.ok()) {
    changed_.notify_all();
    thread_.join();  // it returns: the input is closed and the queue empty
  }
  return result;
}

}  // namespace ckpt::worker
