// The load generator's concurrency: gRPC completion queues drained by a few threads (each
// completion runs a callback), a window bounding how many calls are in flight, and a fixed
// pool of executor threads for the work that follows a completion. Nothing here grows with
// the number of simulated ranks or workers except queued callbacks.
#ifndef CKPT_TOOLS_LOADGEN_ASYNC_CALLS_H_
#define CKPT_TOOLS_LOADGEN_ASYNC_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace ckpt::loadgen {

// A completion-queue tag: the callback runs on a queue thread with the event's `ok`.
struct Completion {
  std::function<void(bool ok)> fn;
};

// Owns a completion queue and the threads draining it.
class CompletionLoop {
 public:
  explicit CompletionLoop(int threads);
  ~CompletionLoop();  // shuts the queue down and joins the threads

  grpc::CompletionQueue* cq() { return &cq_; }
  // A tag for the queue that runs `fn` once and deletes itself.
  static void* Tag(std::function<void(bool ok)> fn) { return new Completion{std::move(fn)}; }

 private:
  grpc::CompletionQueue cq_;
  std::vector<std::thread> threads_;
};

// One unary call through the completion loop: `prepare(context, cq)` returns the reader (a
// stub's PrepareAsync<Method>), `done(status, response)` runs on a queue thread.
template <typename Response, typename Prepare>
void AsyncUnary(CompletionLoop& loop, absl::Duration timeout, Prepare prepare,
                std::function<void(const grpc::Status&, Response&)> done) {
  struct Call {
    grpc::ClientContext context;
    Response response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
  };
  auto* call = new Call;
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  call->reader = prepare(&call->context, loop.cq());
  call->reader->StartCall();
  call->reader->Finish(&call->response, &call->status,
                       CompletionLoop::Tag([call, done = std::move(done)](bool) {
                         done(call->status, call->response);
                         delete call;
                       }));
}

// The bytes of `buffer` in one string ("" when they cannot be read).
std::string BufferToString(const grpc::ByteBuffer& buffer);

// Bounds the calls in flight: Acquire blocks while `limit` are outstanding.
class Window {
 public:
  explicit Window(int limit) : limit_(limit) {}
  void Acquire();
  void Release();
  // Blocks until nothing is outstanding.
  void Drain();

 private:
  const int limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0;
};

// A fixed pool of threads running queued tasks in order of arrival.
class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // runs what is queued, then joins
  void Post(std::function<void()> task);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::loadgen

#endif  // CKPT_TOOLS_LOADGEN_ASYNC_CALLS_H_
