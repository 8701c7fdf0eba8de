// The floor under a repeat save at scale: what its messages alone cost on this machine's gRPC.
//
// A repeat save with an unchanged layout (issue 16) moves, per worker, one JoinOperations call
// (its ranks' digest-only joins in, their answers out) while every worker holds its WatchWork
// stream, then one stream write (its ranks' plan parts by reference). ckpt_loadgen measures the
// coordinator doing that at 102,400 ranks over 12,800 workers. This benchmark sends the same
// messages between two processes, shaped as the loadgen and the coordinator shape them (64
// shared channels, a window of 256 calls, the calls on a completion queue of their own and the
// streams on two; a callback server), with no coordinator behind them: the server answers each
// call with a copy of a prebuilt answer and writes a prebuilt item to every stream. Its wall
// time and both processes' CPU are the limit the coordinator's figures stand beside.
//
//   repeat_save_wire_benchmark [--workers 12800] [--ranks-per-worker 8] [--channels 64]
//                              [--window 256] [--cq-threads 2]
//                              [--joins-on-streams [--answer-joins [--pace-by-answers]]
//                               [--also-watch]]
//
// Prints the message sizes, then per phase (gather: every call answered; dispatch: every
// stream's item read) the wall seconds and the CPU seconds of the client and of the server.
//
// --joins-on-streams measures a protocol the project does not have, to size it: each worker's
// joins are one message on a bidirectional stream it holds, never answered on their own; the
// server writes each stream its dispatch item once every worker's joins arrived (two messages
// per worker instead of a unary call and a write). Its phases are one: first join sent to
// last item read. --answer-joins also answers each join on its stream when it arrives (three
// messages per worker); --also-watch has each worker hold an idle WatchWork stream beside its
// join stream (with both: session 12's JoinStream prototype, a second stream per worker).
// --pace-by-answers holds each joins message in the window until its answer is read, as the
// loadgen paces its calls (otherwise a window slot is freed once the message is written).
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"
#include "tools/loadgen/async_calls.h"
#include "tools/loadgen/proc_stats.h"

namespace ckpt::bench {
namespace {

using loadgen::CompletionLoop;
using loadgen::Window;

constexpr char kPath[] = "/tmp/ckpt-loadgen-Xy12Ab/checkpoints/save-2";
constexpr char kOperation[] = "op-7f3a9c2e41d05b68-000002";

// What one run sends: its size, the client's shape (the loadgen's defaults) and the protocol.
struct Shape {
  int workers = 12800;
  int ranks_per_worker = 8;
  int channels = 64;
  int window = 256;
  int cq_threads = 2;
  bool joins_on_streams = false;
  bool answer_stream_joins = false;  // with joins_on_streams: each answered on the stream too
  bool also_watch = false;  // with joins_on_streams: each worker holds a WatchWork stream too
  // With answer_stream_joins: the window holds a joins message until its answer is read (as the
  // loadgen's window holds a call), not until it is written.
  bool pace_by_answers = false;
};

// A worker's JoinOperations request of a repeat save: its ranks' digest-only joins, with the
// fields the loadgen sends (shared ones, then the rank's own).
pb::JoinOperationsRequest JoinsOf(const Shape& shape, int worker) {
  pb::JoinOperationsRequest request;
  for (int i = 0; i < shape.ranks_per_worker; ++i) {
    pb::JoinOperationRequest* join = request.add_joins();
    join->set_job("loadgen");
    join->set_world_size(shape.workers * shape.ranks_per_worker);
    join->set_kind(pb::OPERATION_SAVE);
    join->set_path(kPath);
    (*join->mutable_metadata())["step"] = "1";
    (*join->mutable_metadata())["written_by"] = "ckpt_loadgen (sparse files: every element 0)";
    join->set_rank(worker * shape.ranks_per_worker + i);
    join->set_worker_id(absl::StrCat("lg-worker-", worker));
    join->set_state_digest(std::string(32, static_cast<char>(0xa5)));
    join->set_held_plan_part_body("op-5be0c4d29a1f7e30-000001");
    join->set_state_omitted(true);
  }
  return request;
}

// The coordinator's answer to it: each join's operation status while it gathers.
pb::JoinOperationsResponse AnswerOf(const Shape& shape) {
  pb::JoinOperationsResponse response;
  for (int i = 0; i < shape.ranks_per_worker; ++i) {
    pb::OperationStatus* op = response.add_results()->mutable_response()->mutable_operation();
    op->set_id(kOperation);
    op->set_job("loadgen");
    op->set_kind(pb::OPERATION_SAVE);
    op->set_path(kPath);
    op->set_requested_by("rank 0");
    op->set_world_size(shape.workers * shape.ranks_per_worker);
    op->set_phase(pb::PHASE_GATHERING);
    op->set_joined_ranks(51200 + i);
    op->set_created_unix_ms(1795912417762);
    op->set_deadline_unix_ms(1795913317762);
    op->set_ranks_described_by_digest(51200 + i);
  }
  return response;
}

// A worker's dispatch write: its ranks' plan parts by reference (the kept body's tail naming
// the new staging directory), batched in one item.
pb::WorkItem DispatchOf(const Shape& shape) {
  pb::WorkItem first;
  for (int i = 0; i < shape.ranks_per_worker; ++i) {
    pb::WorkItem item;
    item.set_operation_id(kOperation);
    item.set_incarnation(0x75da8a05260a8805ULL);
    item.set_job("loadgen");
    item.set_rank(i);
    item.set_kind(pb::OPERATION_SAVE);
    item.set_path(kPath);
    pb::SavePlanPart tail;
    tail.set_staging_dir(absl::StrCat(kPath, ".staging-", kOperation));
    item.set_plan_part(tail.SerializeAsString());
    item.set_plan_part_body_id("op-5be0c4d29a1f7e30-000001");
    item.set_plan_part_by_reference(true);
    if (i == 0) {
      first = std::move(item);
    } else {
      *first.add_batched() = std::move(item);
    }
  }
  return first;
}

// One held WatchWork stream: writes the dispatch item once when told, ends when cancelled.
class HeldStream final : public grpc::ServerWriteReactor<pb::WorkItem> {
 public:
  void OnCancel() override { Finish(grpc::Status::CANCELLED); }
  void OnDone() override { delete this; }
};

// The server: answers joins with copies of one answer; holds streams; GetStatus writes the
// dispatch item to every held stream (from its own thread, as the coordinator's advancer does).
class WireServer final : public pb::Coordinator::CallbackService {
 public:
  WireServer(pb::JoinOperationsResponse answer, pb::WorkItem dispatch, int streams)
      : answer_(std::move(answer)), dispatch_(std::move(dispatch)), streams_(streams) {}
  ~WireServer() override {
    if (writer_.joinable()) writer_.join();
  }

  grpc::ServerUnaryReactor* JoinOperations(grpc::CallbackServerContext* context,
                                           const pb::JoinOperationsRequest*,
                                           pb::JoinOperationsResponse* response) override {
    *response = answer_;
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<pb::WorkItem>* WatchWork(grpc::CallbackServerContext*,
                                                    const pb::WatchWorkRequest*) override {
    auto* stream = new HeldStream;
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(stream);
    if (static_cast<int>(held_.size()) == streams_) all_held_.notify_all();
    return stream;
  }
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const pb::GetStatusRequest*,
                                      pb::GetStatusResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::unique_lock<std::mutex> lock(mu_);
    const bool ready = all_held_.wait_for(lock, std::chrono::seconds(60), [this] {
      return static_cast<int>(held_.size()) == streams_;
    });
    if (!ready || writer_.joinable()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                   "not every stream is held, or the dispatch already ran"));
      return reactor;
    }
    writer_ = std::thread([this] {
      std::lock_guard<std::mutex> lock(mu_);
      for (HeldStream* stream : held_) stream->StartWrite(&dispatch_);
    });
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const pb::JoinOperationsResponse answer_;
  const pb::WorkItem dispatch_;
  const int streams_;
  std::mutex mu_;
  std::condition_variable all_held_;
  std::vector<HeldStream*> held_;  // never written after the dispatch; ended by the client
  std::thread writer_;
};

// A buffer holding `message`'s bytes.
grpc::ByteBuffer BufferOf(const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// --joins-on-streams, the server: every call is a held bidirectional stream whose messages are
// a worker's joins; once `streams` joins arrived, each stream is written the dispatch item.
class StreamJoinServer final : public grpc::CallbackGenericService {
 public:
  // `answers`: each join is answered on its stream as well (`answer`).
  StreamJoinServer(const pb::WorkItem& dispatch, const pb::JoinOperationsResponse& answer,
                   int streams, bool answers)
      : dispatch_(BufferOf(dispatch)),
        answer_(BufferOf(answer)),
        streams_(streams),
        answers_(answers) {}
  ~StreamJoinServer() override {
    if (writer_.joinable()) writer_.join();
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    auto* stream = new JoinStream(this);
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(stream);
    return stream;
  }

 private:
  // One worker's stream: a read always pending (it may join again); with answers, each join's
  // answer, then the dispatch, written one at a time in order.
  class JoinStream final : public grpc::ServerGenericBidiReactor {
   public:
    explicit JoinStream(StreamJoinServer* server) : server_(server) { StartRead(&join_); }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // the client ended: OnCancel finishes
      if (server_->answers_) Write(&server_->answer_);
      server_->Joined();
      StartRead(&join_);
    }
    void OnWriteDone(bool ok) override {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = ok && !queued_.empty();
      if (!writing_) return;
      StartWrite(queued_.front());
      queued_.pop_front();
    }
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }
    // Writes `message` now, or after the writes before it.
    void Write(const grpc::ByteBuffer* message) {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_) {
        queued_.push_back(message);
        return;
      }
      writing_ = true;
      StartWrite(message);
    }

   private:
    StreamJoinServer* const server_;
    grpc::ByteBuffer join_;
    std::mutex mu_;
    bool writing_ = false;
    std::deque<const grpc::ByteBuffer*> queued_;
  };

  // Counts a worker's joins; the last one starts the dispatch on a thread of its own.
  void Joined() {
    std::lock_guard<std::mutex> lock(mu_);
    if (++joined_ != streams_) return;
    writer_ = std::thread([this] {
      std::lock_guard<std::mutex> lock(mu_);
      for (JoinStream* stream : held_) stream->Write(&dispatch_);
    });
  }

  const grpc::ByteBuffer dispatch_;
  const grpc::ByteBuffer answer_;
  const int streams_;
  const bool answers_;
  std::mutex mu_;
  std::vector<JoinStream*> held_;
  int joined_ = 0;
  std::thread writer_;
};

// CPU seconds (user + system) of process `pid` so far; 0 when it cannot be read.
double CpuSecondsOf(pid_t pid) {
  absl::StatusOr<loadgen::ProcStats> stats = loadgen::ReadProcStats(pid);
  return stats.ok() ? stats->cpu_seconds : 0;
}

// The wall clock and both processes' CPU seconds at one moment: phases are timed between two.
struct Reading {
  absl::Time at;
  double client_cpu = 0;
  double server_cpu = 0;
};

Reading ReadNow(pid_t server) {
  return {absl::Now(), CpuSecondsOf(getpid()), CpuSecondsOf(server)};
}

// "<phase> seconds W client_cpu_s C server_cpu_s S" for the phase between `from` and `to`.
std::string PhaseLine(const char* phase, const Reading& from, const Reading& to) {
  return absl::StrFormat("%s seconds %.3f client_cpu_s %.2f server_cpu_s %.2f\n", phase,
                         absl::ToDoubleSeconds(to.at - from.at), to.client_cpu - from.client_cpu,
                         to.server_cpu - from.server_cpu);
}

// Serves on a loopback port until killed; writes the port to `port_fd` first.
int Serve(const Shape& shape, int port_fd) {
  WireServer service(AnswerOf(shape), DispatchOf(shape), shape.workers);
  StreamJoinServer stream_joins(DispatchOf(shape), AnswerOf(shape), shape.workers,
                                shape.answer_stream_joins);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  if (!shape.joins_on_streams || shape.also_watch) builder.RegisterService(&service);
  if (shape.joins_on_streams) builder.RegisterCallbackGenericService(&stream_joins);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || write(port_fd, &port, sizeof(port)) != sizeof(port)) return 1;
  close(port_fd);
  pause();  // killed by the client when done
  return 0;
}

// The client: the loadgen's shape of a repeat save's gather and dispatch, timed. Never
// destroyed: the process ends with _exit once the figures are printed.
class WireClient {
 public:
  WireClient(const Shape& shape, int port) : shape_(shape), window_(shape.window) {
    const std::string target = absl::StrCat("127.0.0.1:", port);
    for (int c = 0; c < shape.channels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt("ckpt.bench_channel", c);  // a connection of its own per channel
      auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(pb::Coordinator::NewStub(channel));
      generic_.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
    calls_ = std::make_unique<CompletionLoop>(shape.cq_threads);
    for (int i = 0; i < 2; ++i) stream_loops_.push_back(std::make_unique<CompletionLoop>(1));
    streams_.resize(shape.workers);
  }
  // Opens every worker's stream; false when one did not start.
  bool OpenStreams() {
    return StartEveryWorker([this](int w, std::function<void(bool)> started) {
      streams_[w] = std::make_unique<Stream>();
      Stream* s = streams_[w].get();
      s->reader = stubs_[w % shape_.channels]->PrepareAsyncWatchWork(
          &s->context, pb::WatchWorkRequest(), stream_loops_[w % 2]->cq());
      s->reader->StartCall(CompletionLoop::Tag([this, s, started](bool ok) {
        if (ok) ReadOne(s);
        started(ok);
      }));
    });
  }

  // Every worker's JoinOperations call, `window` in flight; the count of failed calls.
  int Gather() {
    std::vector<std::string> requests;
    for (int w = 0; w < shape_.workers; ++w) {
      requests.push_back(JoinsOf(shape_, w).SerializeAsString());
    }
    std::atomic<int> failed{0};
    for (int w = 0; w < shape_.workers; ++w) {
      window_.Acquire();
      auto* call = new Call;
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      grpc::Slice slice(requests[w]);
      grpc::ByteBuffer buffer(&slice, 1);
      call->reader = generic_[w % shape_.channels]->PrepareUnaryCall(
          &call->context, "/ckpt.pb.Coordinator/JoinOperations", buffer, calls_->cq());
      call->reader->StartCall();
      call->reader->Finish(&call->response, &call->status,
                           CompletionLoop::Tag([this, call, &failed](bool) {
                             pb::JoinOperationsResponse parsed;  // the loadgen reads each answer
                             if (!call->status.ok() ||
                                 !parsed.ParseFromString(loadgen::BufferToString(call->response))) {
                               ++failed;
                             }
                             delete call;
                             window_.Release();
                           }));
    }
    window_.Drain();
    return failed.load();
  }

  // Asks the server to write every stream, then waits until each item was read; false on a
  // failed request or when `timeout` passes first.
  bool Dispatch(absl::Duration timeout) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(90)));
    pb::GetStatusResponse response;
    if (!stubs_[0]->GetStatus(&context, pb::GetStatusRequest(), &response).ok()) return false;
    std::unique_lock<std::mutex> lock(read_mu_);
    return read_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                             [this] { return read_ == expected_reads_; });
  }

  // --joins-on-streams: opens every worker's bidirectional stream, a read pending on each;
  // false when one did not start.
  bool OpenJoinStreams() {
    join_streams_.resize(shape_.workers);
    return StartEveryWorker([this](int w, std::function<void(bool)> started) {
      join_streams_[w] = std::make_unique<JoinStreamCall>();
      JoinStreamCall* c = join_streams_[w].get();
      c->stream = generic_[w % shape_.channels]->PrepareCall(&c->context, "/ckpt.bench/JoinStream",
                                                             stream_loops_[w % 2]->cq());
      c->stream->StartCall(CompletionLoop::Tag([this, c, started](bool ok) {
        if (ok) ReadDispatch(c);
        started(ok);
      }));
    });
  }

  // Writes every worker's joins on its stream, `window` writes in flight, then waits until each
  // stream's dispatch item was read; false when a write failed or `timeout` passed first.
  bool JoinOnStreams(absl::Duration timeout) {
    std::vector<grpc::ByteBuffer> joins;
    for (int w = 0; w < shape_.workers; ++w) joins.push_back(BufferOf(JoinsOf(shape_, w)));
    std::atomic<int> failed{0};
    for (int w = 0; w < shape_.workers; ++w) {
      window_.Acquire();
      join_streams_[w]->stream->Write(joins[w], CompletionLoop::Tag([this, &failed](bool ok) {
                                        if (!ok) ++failed;
                                        if (!shape_.pace_by_answers) window_.Release();
                                      }));
    }
    window_.Drain();
    std::unique_lock<std::mutex> lock(read_mu_);
    return read_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] {
      return read_ == expected_reads_;
    }) && failed.load() == 0;
  }

 private:
  // Runs `start(w, started)` for every worker, which starts its stream and calls `started`
  // with whether it did; returns once every stream reported, false when one did not start.
  bool StartEveryWorker(const std::function<void(int, std::function<void(bool)>)>& start) {
    std::mutex mu;
    std::condition_variable cv;
    int started = 0, failed = 0;
    for (int w = 0; w < shape_.workers; ++w) {
      start(w, [&](bool ok) {
        std::lock_guard<std::mutex> lock(mu);
        ++(ok ? started : failed);
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started + failed == shape_.workers; });
    return failed == 0;
  }

  struct Stream {
    grpc::ClientContext context;
    pb::WorkItem item;
    std::unique_ptr<grpc::ClientAsyncReader<pb::WorkItem>> reader;
  };
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  };

  struct JoinStreamCall {
    grpc::ClientContext context;
    grpc::ByteBuffer item;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
    bool answered = false;  // its first message (with --answer-joins, the joins' answer) read
  };

  // Counts a message read; the waiter wakes once, at the last expected.
  void CountRead() {
    bool last;
    {
      std::lock_guard<std::mutex> lock(read_mu_);
      last = ++read_ == expected_reads_;
    }
    if (last) read_cv_.notify_all();
  }

  void ReadDispatch(JoinStreamCall* c) {
    c->stream->Read(&c->item, CompletionLoop::Tag([this, c](bool ok) {
      if (!ok) return;                                                // cancelled at the end
      if (!c->answered && shape_.pace_by_answers) window_.Release();  // the call is answered
      c->answered = true;
      CountRead();
      ReadDispatch(c);
    }));
  }

  void ReadOne(Stream* s) {
    s->reader->Read(&s->item, CompletionLoop::Tag([this, s](bool ok) {
      if (!ok) return;  // cancelled at the end
      CountRead();
      ReadOne(s);
    }));
  }

  const Shape shape_;
  Window window_;
  std::vector<std::unique_ptr<pb::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_;
  std::unique_ptr<CompletionLoop> calls_;
  std::vector<std::unique_ptr<CompletionLoop>> stream_loops_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<std::unique_ptr<JoinStreamCall>> join_streams_;
  std::mutex read_mu_;
  std::condition_variable read_cv_;
  int read_ = 0;
  // Items each phase waits for: one per stream, two with joins answered on the streams.
  const int expected_reads_ = shape_.workers * (shape_.answer_stream_joins ? 2 : 1);
};

// --joins-on-streams, timed: one phase, first join sent to last dispatch item read.
int MeasureJoinsOnStreams(const Shape& shape, WireClient& client, pid_t server) {
  const Reading start = ReadNow(server);
  const bool done = client.JoinOnStreams(absl::Seconds(120));
  const Reading end = ReadNow(server);
  std::printf(
      "workers %d ranks_per_worker %d channels %d window %d joins_on_streams answered %d "
      "also_watch %d paced_by_answers %d done %d\n%ssum seconds %.3f\n",
      shape.workers, shape.ranks_per_worker, shape.channels, shape.window,
      shape.answer_stream_joins ? 1 : 0, shape.also_watch ? 1 : 0, shape.pace_by_answers ? 1 : 0,
      done ? 1 : 0, PhaseLine("joins_and_dispatch", start, end).c_str(),
      absl::ToDoubleSeconds(end.at - start.at));
  return done ? 0 : 1;
}

int Flag(int argc, char** argv, const char* name, int fallback, bool* bad) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) != 0) continue;
    if (i + 1 >= argc) {
      *bad = true;
      return fallback;
    }
    char* end = nullptr;
    const long value = std::strtol(argv[i + 1], &end, 10);
    if (*end != '\0' || value < 1 || value > 1000000) *bad = true;
    return static_cast<int>(value);
  }
  return fallback;
}

constexpr char kUsage[] =
    "usage: repeat_save_wire_benchmark [--workers 12800] [--ranks-per-worker 8]\n"
    "                                  [--channels 64] [--window 256] [--cq-threads 2]\n"
    "                                  [--joins-on-streams [--answer-joins [--pace-by-answers]]\n"
    "                                   [--also-watch]]\n"
    "The messages of a repeat save (one JoinOperations call per worker while every worker\n"
    "holds its WatchWork stream, then one write per stream) between two processes, with no\n"
    "coordinator behind them: wall and both processes' CPU seconds per phase.\n"
    "--joins-on-streams: each worker's joins as one message on a held bidirectional stream,\n"
    "answered only by its dispatch item (a protocol the project does not have);\n"
    "--answer-joins: each also answered on the stream when it arrives;\n"
    "--also-watch: each worker also holds an idle WatchWork stream;\n"
    "--pace-by-answers: the window holds each joins message until its answer is read.\n";

// Whether every argument is a known flag followed by a value.
bool KnownFlags(int argc, char** argv) {
  const char* known[] = {"--workers", "--ranks-per-worker", "--channels", "--window",
                         "--cq-threads"};
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--joins-on-streams") == 0 ||
        std::strcmp(argv[i], "--answer-joins") == 0 || std::strcmp(argv[i], "--also-watch") == 0 ||
        std::strcmp(argv[i], "--pace-by-answers") == 0) {
      --i;  // no value
      continue;
    }
    bool ok = false;
    for (const char* k : known) ok = ok || std::strcmp(argv[i], k) == 0;
    if (!ok || i + 1 >= argc) return false;
  }
  return true;
}

// Today's protocol, timed: gather (every JoinOperations call answered), then dispatch (every
// stream's item read).
int MeasureUnaryJoins(const Shape& shape, WireClient& client, pid_t server) {
  const Reading start = ReadNow(server);
  const int failed = client.Gather();
  const Reading gathered = ReadNow(server);
  const bool dispatched = failed == 0 && client.Dispatch(absl::Seconds(120));
  const Reading end = ReadNow(server);
  std::printf(
      "workers %d ranks_per_worker %d channels %d window %d failed_calls %d dispatched %d\n"
      "%s%ssum seconds %.3f\n",
      shape.workers, shape.ranks_per_worker, shape.channels, shape.window, failed,
      dispatched ? 1 : 0, PhaseLine("gather", start, gathered).c_str(),
      PhaseLine("dispatch", gathered, end).c_str(), absl::ToDoubleSeconds(end.at - start.at));
  return failed == 0 && dispatched ? 0 : 1;
}

// The shape the flags ask for; false on a bad flag.
bool ParseShape(int argc, char** argv, Shape* shape) {
  bool bad = !KnownFlags(argc, argv);
  shape->workers = Flag(argc, argv, "--workers", shape->workers, &bad);
  shape->ranks_per_worker = Flag(argc, argv, "--ranks-per-worker", shape->ranks_per_worker, &bad);
  shape->channels = Flag(argc, argv, "--channels", shape->channels, &bad);
  shape->window = Flag(argc, argv, "--window", shape->window, &bad);
  shape->cq_threads = Flag(argc, argv, "--cq-threads", shape->cq_threads, &bad);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--joins-on-streams") == 0) shape->joins_on_streams = true;
    if (std::strcmp(argv[i], "--answer-joins") == 0) shape->answer_stream_joins = true;
    if (std::strcmp(argv[i], "--also-watch") == 0) shape->also_watch = true;
    if (std::strcmp(argv[i], "--pace-by-answers") == 0) shape->pace_by_answers = true;
  }
  return !bad && (shape->joins_on_streams || (!shape->answer_stream_joins && !shape->also_watch)) &&
         (shape->answer_stream_joins || !shape->pace_by_answers);
}

int Run(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--help") == 0) {
    std::printf("%s", kUsage);
    return 0;
  }
  Shape shape;
  if (!ParseShape(argc, argv, &shape)) {
    std::fprintf(stderr, "repeat_save_wire_benchmark: bad arguments\n%s", kUsage);
    return 2;
  }
  int port_pipe[2];
  if (pipe(port_pipe) != 0) return 1;
  const pid_t server = fork();  // before any gRPC state exists in this process
  if (server < 0) return 1;
  if (server == 0) {
    close(port_pipe[0]);
    _exit(Serve(shape, port_pipe[1]));
  }
  close(port_pipe[1]);
  int port = 0;
  const bool got_port = read(port_pipe[0], &port, sizeof(port)) == sizeof(port);
  close(port_pipe[0]);
  int code = 1;
  if (got_port) {
    std::printf("bytes join_request %zu join_answer %zu dispatch_item %zu\n",
                JoinsOf(shape, 0).ByteSizeLong(), AnswerOf(shape).ByteSizeLong(),
                DispatchOf(shape).ByteSizeLong());
    // The server is a fork of this process: the same libraries (docs/BUILDING.md: `-c opt`
    // links gRPC built with NDEBUG, other builds Debian's).
    const std::string grpc = loadgen::ReadMappedLibraryPath(/*pid=*/0, "libgrpc.so");
    std::printf("grpc %s\n", grpc.empty() ? "unknown" : grpc.c_str());
    auto* client = new WireClient(shape, port);  // see WireClient
    if (shape.joins_on_streams) {
      const bool open = (!shape.also_watch || client->OpenStreams()) && client->OpenJoinStreams();
      code = open ? MeasureJoinsOnStreams(shape, *client, server) : 1;
    } else {
      code = client->OpenStreams() ? MeasureUnaryJoins(shape, *client, server) : 1;
    }
  }
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  std::fflush(stdout);
  _exit(code);  // the client's streams and queues are left to the exit
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) { return ckpt::bench::Run(argc, argv); }
