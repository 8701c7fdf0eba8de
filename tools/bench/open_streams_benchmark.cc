// What a unary call costs a gRPC server while it holds N idle server-streaming calls, with the
// streams served by the callback API (on the server's one callback completion queue, with the
// unary calls) or by the async API on a completion queue of their own (`--async_streams`).
//
// Why: Debian's libgrpc is built without NDEBUG, and a completion queue then checks each
// completion against every tag outstanding on it (cq_check_tag, a linear walk). The
// coordinator holds one WatchWork stream per worker (12,800 at 100k ranks), so every completion
// of a join call on the same queue walks them all. This measures that cost on the machine's
// own gRPC, one configuration per run:
//   open_streams_benchmark --streams 12800 [--async_streams] [--calls 20000] [--threads 8]
// Prints the wall and process CPU microseconds per unary call (client and server in one
// process; the client's calls use their own completion queues, so only the server's differ).
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"

namespace ckpt::bench {
namespace {

// A stream that writes nothing and ends when the client cancels it.
class IdleStream final : public grpc::ServerWriteReactor<pb::WorkItem> {
 public:
  void OnCancel() override { Finish(grpc::Status::CANCELLED); }
  void OnDone() override { delete this; }
};

// A heartbeat answered at once.
grpc::ServerUnaryReactor* AnswerAtOnce(grpc::CallbackServerContext* context) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// Heartbeats answered at once; WatchWork streams held (callback API).
class CallbackStreams final : public pb::Coordinator::CallbackService {
 public:
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const pb::HeartbeatRequest*,
                                      pb::HeartbeatResponse*) override {
    return AnswerAtOnce(context);
  }
  grpc::ServerWriteReactor<pb::WorkItem>* WatchWork(grpc::CallbackServerContext*,
                                                    const pb::WatchWorkRequest*) override {
    return new IdleStream;
  }
};

// The same, with WatchWork on the async API: its calls' tags live on `cq`, not on the
// server's callback queue. (A method marked async over a callback one keeps the callback
// handler and is never requestable: the async mark must be the method's only one.)
class AsyncStreams final
    : public pb::Coordinator::WithCallbackMethod_Heartbeat<
          pb::Coordinator::WithAsyncMethod_WatchWork<pb::Coordinator::Service>> {
 public:
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const pb::HeartbeatRequest*,
                                      pb::HeartbeatResponse*) override {
    return AnswerAtOnce(context);
  }
  // One held call: requested, then kept until shutdown.
  struct Held {
    grpc::ServerContext context;
    pb::WatchWorkRequest request;
    grpc::ServerAsyncWriter<pb::WorkItem> writer{&context};
  };
  void RequestOne(grpc::ServerCompletionQueue* cq) {
    held_.push_back(std::make_unique<Held>());
    Held* h = held_.back().get();
    RequestWatchWork(&h->context, &h->request, &h->writer, cq, cq, h);
  }

 private:
  std::vector<std::unique_ptr<Held>> held_;
};

int64_t ProcessCpuMicros() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000LL + usage.ru_utime.tv_usec +
         usage.ru_stime.tv_usec;
}

int Flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

bool Has(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

constexpr char kUsage[] =
    "usage: open_streams_benchmark [--streams N] [--async_streams] [--calls N] [--threads N]\n"
    "Wall and process CPU microseconds per unary call on a gRPC server holding N idle\n"
    "WatchWork streams (callback API, or async on a queue of their own).\n";

// Whether every argument is a known flag (valued ones followed by a value).
bool KnownFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--async_streams") == 0) continue;
    const bool valued = std::strcmp(argv[i], "--streams") == 0 ||
                        std::strcmp(argv[i], "--calls") == 0 ||
                        std::strcmp(argv[i], "--threads") == 0;
    if (!valued || ++i >= argc) return false;
  }
  return true;
}

int Run(int argc, char** argv) {
  if (Has(argc, argv, "--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  const int streams = Flag(argc, argv, "--streams", 12800);
  const int calls = Flag(argc, argv, "--calls", 20000);
  const int threads = Flag(argc, argv, "--threads", 8);
  if (!KnownFlags(argc, argv) || streams < 0 || calls <= 0 || threads <= 0) {
    std::fprintf(stderr, "open_streams_benchmark: bad arguments\n%s", kUsage);
    return 2;
  }
  const bool async_streams = Has(argc, argv, "--async_streams");
  CallbackStreams callback_service;
  AsyncStreams async_service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(async_streams ? static_cast<grpc::Service*>(&async_service)
                                        : &callback_service);
  std::unique_ptr<grpc::ServerCompletionQueue> stream_cq;
  if (async_streams) stream_cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  std::thread stream_poller;
  if (async_streams) {
    for (int i = 0; i < streams; ++i) async_service.RequestOne(stream_cq.get());
    stream_poller = std::thread([&] {
      void* tag;
      bool ok;
      while (stream_cq->Next(&tag, &ok)) {
      }
    });
  }
  const std::string target = absl::StrCat("127.0.0.1:", port);
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = pb::Coordinator::NewStub(channel);

  // The idle streams, opened on a client queue of their own.
  grpc::CompletionQueue client_cq;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientAsyncReader<pb::WorkItem>>> readers;
  for (int i = 0; i < streams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(
        stub->AsyncWatchWork(contexts.back().get(), pb::WatchWorkRequest(), &client_cq, nullptr));
  }
  {
    void* tag;
    bool ok;
    for (int i = 0; i < streams; ++i) client_cq.Next(&tag, &ok);  // every stream started
  }

  std::atomic<int> next{0}, failed{0};
  const absl::Time start = absl::Now();
  const int64_t cpu_start = ProcessCpuMicros();
  std::vector<std::thread> callers;
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back([&] {
      while (next.fetch_add(1) < calls) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        pb::HeartbeatResponse response;
        if (!stub->Heartbeat(&context, pb::HeartbeatRequest(), &response).ok()) ++failed;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  const double wall_us = absl::ToDoubleMicroseconds(absl::Now() - start);
  const double cpu_us = static_cast<double>(ProcessCpuMicros() - cpu_start);
  std::printf(
      "streams %d %s calls %d threads %d failed %d wall_us_per_call %.1f cpu_us_per_call %.1f\n",
      streams, async_streams ? "async" : "callback", calls, threads, failed.load(), wall_us / calls,
      cpu_us / calls);

  for (auto& c : contexts) c->TryCancel();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (async_streams) {
    stream_cq->Shutdown();
    stream_poller.join();
  }
  client_cq.Shutdown();
  void* tag;
  bool ok;
  while (client_cq.Next(&tag, &ok)) {
  }
  return failed.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) { return ckpt::bench::Run(argc, argv); }
