#include "tools/loadgen/async_calls.h"

namespace ckpt::loadgen {

CompletionLoop::CompletionLoop(int threads) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      void* tag = nullptr;
      bool ok = false;
      while (cq_.Next(&tag, &ok)) {
        auto* completion = static_cast<Completion*>(tag);
        completion->fn(ok);
        delete completion;
      }
    });
  }
}

CompletionLoop::~CompletionLoop() {
  cq_.Shutdown();
  for (std::thread& t : threads_) t.join();
}

std::string BufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

void Window::Acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return in_flight_ < limit_; });
  ++in_flight_;
}

void Window::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
  }
  cv_.notify_all();
}

void Window::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return in_flight_ == 0; });
}

Executor::Executor(int threads) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      while (true) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
          if (tasks_.empty()) return;
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    });
  }
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Executor::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

}  // namespace ckpt::loadgen
