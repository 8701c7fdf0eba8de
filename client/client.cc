#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/memory_path.h"
#include "common/store_url.h"
#include "common/transfer_path.h"
#include "proto/operation_phase.h"
#include "proto/wire_names.h"
#include "proto/worker.grpc.pb.h"

namespace ckpt::client {
namespace {

// A save's memory-tier options checked before anything is sent: InvalidArgument naming the
// value for a negative replica count (other than -1, the default), a mem:// persist_to, or a
// persist_to on a storage save (it is durable already).
absl::Status CheckMemorySaveOptions(const std::string& path, const SaveOptions& options) {
  const bool memory = IsMemoryPath(path);
  if (options.memory_replicas < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("save of ", path, ": negative memory_replicas ", options.memory_replicas));
  }
  if (options.persist_to.empty()) return absl::OkStatus();
  if (IsMemoryPath(options.persist_to)) {
    return absl::InvalidArgumentError(
        absl::StrCat("save of ", path, ": persist_to '", options.persist_to,
                     "' is a memory path; a memory checkpoint is persisted to storage"));
  }
  if (!memory) {
    return absl::InvalidArgumentError(absl::StrCat(
        "save of ", path, ": persist_to '", options.persist_to,
        "' is only for memory saves (mem://<name>); a storage save is durable already"));
  }
  return absl::OkStatus();
}

}  // namespace

// A state dict of many tensors easily exceeds gRPC's 4 MB default message size.
grpc::ChannelArguments LargeMessages() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  return args;
}

// The channel to the local worker and the per-call deadline.
class WorkerConnection {
 public:
  WorkerConnection(const std::string& address, absl::Duration rpc_timeout)
      : address_(address),
        rpc_timeout_(rpc_timeout),
        stub_(pb::Worker::NewStub(grpc::CreateCustomChannel(
            address, grpc::InsecureChannelCredentials(), LargeMessages()))) {}

  pb::Worker::Stub* stub() { return stub_.get(); }
  const std::string& address() const { return address_; }
  absl::Duration rpc_timeout() const { return rpc_timeout_; }

  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::ZeroDuration()) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(
        absl::Now() + (timeout > absl::ZeroDuration() ? timeout : rpc_timeout_)));
    return context;
  }

  absl::Status Convert(const grpc::Status& s, absl::string_view call) const {
    return FromGrpcStatus(s, absl::StrCat("worker ", address_, " ", call));
  }

  // Waits until the operation is final or `timeout` passes (then DeadlineExceeded).
  absl::StatusOr<OperationProgress> WaitFinal(const std::string& session_id,
                                              const std::string& operation_id,
                                              absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::Duration slice = std::min(deadline - absl::Now(), absl::Seconds(30));
      if (slice < absl::ZeroDuration()) slice = absl::ZeroDuration();
      absl::StatusOr<OperationProgress> p = Progress(session_id, operation_id, slice);
      if (WorkerDidNotAnswer(p, deadline)) continue;
      if (!p.ok()) return p.status();
      if (p->finished) return p;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("operation ", operation_id, " is still ", p->phase, " after ",
                         absl::FormatDuration(timeout), " (", p->bytes_done, " of ", p->bytes_total,
                         " bytes done)"));
      }
    }
  }

  // Waits until this rank's save part is snapshotted by its worker or the operation ended.
  absl::StatusOr<OperationProgress> WaitSnapshot(const std::string& session_id,
                                                 const std::string& operation_id,
                                                 absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::Duration slice = std::min(deadline - absl::Now(), absl::Seconds(30));
      if (slice < absl::ZeroDuration()) slice = absl::ZeroDuration();
      absl::StatusOr<OperationProgress> p =
          Progress(session_id, operation_id, slice, /*until_snapshot=*/true);
      if (WorkerDidNotAnswer(p, deadline)) continue;
      if (!p.ok()) return p.status();
      if (p->snapshotted || p->finished) return p;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("operation ", operation_id, " is still ",
                                                        p->phase, " after ",
                                                        absl::FormatDuration(timeout),
                                                        " and this rank's state is not "
                                                        "snapshotted yet"));
      }
    }
  }

  // A Wait call that ran past its deadline: the worker did not answer (it may be stopped or
  // overloaded). Asked again while the caller's deadline allows, so that a worker that comes
  // back reports the operation's real outcome (e.g. the abort naming it) rather than this.
  static bool WorkerDidNotAnswer(const absl::StatusOr<OperationProgress>& p, absl::Time deadline) {
    return !p.ok() && p.status().code() == absl::StatusCode::kDeadlineExceeded &&
           absl::Now() < deadline;
  }

  absl::StatusOr<OperationProgress> Progress(const std::string& session_id,
                                             const std::string& operation_id, absl::Duration wait,
                                             bool until_snapshot = false) {
    pb::WaitRequest request;
    request.set_session_id(session_id);
    request.set_operation_id(operation_id);
    request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    request.set_until_snapshot(until_snapshot);
    pb::WaitResponse response;
    absl::Status s =
        Convert(stub_->Wait(Context(wait + rpc_timeout_).get(), request, &response), "Wait");
    if (!s.ok()) return s;
    OperationProgress p;
    p.phase = OperationPhaseName(response.phase());
    p.finished = IsFinal(response.phase());
    p.bytes_done = response.bytes_done();
    p.bytes_total = response.bytes_total();
    p.received_version = response.received_version();
    p.snapshotted = response.snapshotted();
    const pb::SaveSnapshotReport& r = response.snapshot();
    p.snapshot = SnapshotInfo{r.copied_bytes(),
                              r.lent_bytes(),
                              r.device_bytes(),
                              r.device_over_pinned_budget(),
                              r.pinned_budget_bytes(),
                              r.snapshot_waited_for_writes(),
                              r.bytes_written_before_snapshot()};
    if (response.code() != 0) {
      p.status = absl::Status(static_cast<absl::StatusCode>(response.code()), response.message());
    }
    return p;
  }

 private:
  std::string address_;
  absl::Duration rpc_timeout_;
  std::unique_ptr<pb::Worker::Stub> stub_;
};

SaveHandle::SaveHandle(std::shared_ptr<WorkerConnection> connection, std::string session_id,
                       std::string operation_id)
    : connection_(std::move(connection)),
      session_id_(std::move(session_id)),
      operation_id_(std::move(operation_id)) {}

absl::Status SaveHandle::WaitDurable(absl::Duration timeout) {
  absl::StatusOr<OperationProgress> p = connection_->WaitFinal(session_id_, operation_id_, timeout);
  if (!p.ok()) return p.status();
  return p->status;
}

absl::StatusOr<OperationProgress> SaveHandle::Progress() {
  return connection_->Progress(session_id_, operation_id_, absl::ZeroDuration());
}

Client::Client(ResolvedOptions options, std::shared_ptr<WorkerConnection> connection)
    : options_(std::move(options)), connection_(std::move(connection)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const Options& options,
                                                        const EnvLookup& env) {
  absl::StatusOr<ResolvedOptions> resolved = ResolveOptions(options, env);
  if (!resolved.ok()) return resolved.status();
  auto connection =
      std::make_shared<WorkerConnection>(resolved->worker_address, resolved->rpc_timeout);
  pb::TrainerHello hello;
  hello.set_job(resolved->job);
  hello.set_rank(resolved->rank);
  hello.set_world_size(resolved->world_size);
  hello.set_local_rank(resolved->local_rank);
  hello.set_pid(getpid());
  pb::TrainerHelloResponse response;
  auto context = connection->Context();
  context->set_wait_for_ready(true);  // the worker may still be starting
  absl::Status s =
      connection->Convert(connection->stub()->Hello(context.get(), hello, &response), "Hello");
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("job ", resolved->job, " rank ", resolved->rank,
                                               ": cannot connect: ", s.message()));
  }
  std::unique_ptr<Client> client(new Client(*std::move(resolved), std::move(connection)));
  client->worker_id_ = response.worker_id();
  client->session_id_ = response.session_id();
  client->worker_host_ = response.host();
  return client;
}

Client::~Client() {
  pb::GoodbyeRequest request;
  request.set_session_id(session_id_);
  pb::GoodbyeResponse response;
  (void)connection_->stub()->Goodbye(connection_->Context().get(), request, &response);
}

std::unique_ptr<StateDict> Client::NewStateDict() const {
  return std::make_unique<StateDict>(options_.job, options_.rank);
}

absl::Status Client::Share(const StateDict& state) { return Register(state, Lending::kNone); }

absl::Status Client::Register(const StateDict& state, Lending lending) {
  if (state.rank() != options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict of rank ", state.rank(), " shared by rank ", options_.rank));
  }
  pb::RegisterTensorsRequest request;
  request.set_session_id(session_id_);
  for (pb::SharedTensor& t : state.Describe(lending)) *request.add_tensors() = std::move(t);
  pb::RegisterTensorsResponse response;
  return connection_->Convert(
      connection_->stub()->RegisterTensors(connection_->Context().get(), request, &response),
      "RegisterTensors");
}

absl::StatusOr<std::string> Client::Transfer(
    bool save, const std::string& path, const StateDict& state,
    const std::map<std::string, std::string>& metadata, const std::string& operation_id,
    absl::Duration arrival_timeout, Lending lending, pb::LoadAlgorithm load_algorithm,
    int64_t memory_budget_bytes, int memory_replicas, const std::string& persist_to,
    bool persist_overwrite, const std::string& process_groups, const std::string& compression,
    bool overwrite) {
  if (absl::Status s = Register(state, lending); !s.ok()) return s;
  pb::TransferRequest request;
  request.set_session_id(session_id_);
  // The coordinator accepts only absolute paths (under its checkpoint roots); a relative one
  // means this process's working directory. A memory checkpoint's path (mem://<name>), a
  // transfer's (xfer://<name>) and an object store's URL (s3://bucket/key) go as they are.
  request.set_path(AbsoluteLocation(path));
  request.mutable_metadata()->insert(metadata.begin(), metadata.end());
  request.set_operation_id(operation_id);
  request.set_timeout_ms(absl::ToInt64Milliseconds(arrival_timeout));
  request.set_load_algorithm(load_algorithm);
  if (memory_replicas >= 0) request.set_memory_replicas(memory_replicas);
  if (!persist_to.empty()) {
    request.set_persist_to(AbsoluteLocation(persist_to));
    request.set_persist_overwrite(persist_overwrite);
  }
  request.set_memory_budget_bytes(memory_budget_bytes);
  request.set_process_groups(process_groups);
  request.set_compression(compression);
  request.set_overwrite(overwrite);
  pb::TransferResponse response;
  auto context = connection_->Context();
  grpc::Status s = save ? connection_->stub()->Save(context.get(), request, &response)
                        : connection_->stub()->Load(context.get(), request, &response);
  absl::Status status = connection_->Convert(s, save ? "Save" : "Load");
  if (!status.ok()) return status;
  return response.operation_id();
}

absl::StatusOr<std::unique_ptr<SaveHandle>> Client::Save(const std::string& path,
                                                         const StateDict& state,
                                                         const SaveOptions& options) {
  if (absl::Status s = CheckMemorySaveOptions(path, options); !s.ok()) return s;
  // A memory save keeps host bytes: device tensors go through a host shadow (never lent: the
  // next save refills it).
  Lending lending = options.lending;
  absl::StatusOr<const StateDict*> source = &state;
  if (IsMemoryPath(path)) {
    source = StagedOnHost("memory-save", absl::StrCat("saving ", path), state);
    if (!source.ok()) return source.status();
    if (*source != &state) lending = Lending::kNone;
  }
  absl::StatusOr<std::string> op = Transfer(
      true, path, **source, options.metadata, "", options.arrival_timeout, lending,
      pb::LOAD_ALGORITHM_UNSPECIFIED, 0, options.memory_replicas, options.persist_to,
      options.persist_overwrite, options.process_groups, options.compression, options.overwrite);
  if (!op.ok()) return op.status();
  auto handle = std::make_unique<SaveHandle>(connection_, session_id_, *op);
  // Return once this rank's worker copied the state out of the trainer's memory (or the save
  // already ended); WaitDurable waits for the commit.
  absl::StatusOr<OperationProgress> p =
      connection_->WaitSnapshot(session_id_, *op, options.arrival_timeout + absl::Hours(1));
  if (!p.ok()) return p.status();
  if (!p->status.ok()) return p->status;
  handle->snapshot_ = p->snapshot;
  return handle;
}

absl::StatusOr<SnapshotInfo> Client::SaveAndWait(const std::string& path, const StateDict& state,
                                                 const SaveOptions& options,
                                                 absl::Duration timeout) {
  SaveOptions lent = options;
  lent.lending = Lending::kAllHostTensors;  // the caller touches nothing before the commit
  absl::StatusOr<std::unique_ptr<SaveHandle>> handle = Save(path, state, lent);
  if (!handle.ok()) return handle.status();
  if (absl::Status s = (*handle)->WaitDurable(timeout); !s.ok()) return s;
  return (*handle)->snapshot();
}

absl::Status Client::Load(const std::string& path, StateDict& state, const LoadOptions& options) {
  absl::StatusOr<OperationProgress> p = LoadToEnd(path, state, options);
  if (!p.ok()) return p.status();
  return p->status;
}

absl::StatusOr<OperationProgress> Client::LoadToEnd(const std::string& path, StateDict& state,
                                                    const LoadOptions& options) {
  absl::StatusOr<pb::LoadAlgorithm> algorithm = ParseLoadAlgorithm(options.exchange_algorithm);
  if (!algorithm.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadOptions::exchange_algorithm: ", algorithm.status().message()));
  }
  absl::StatusOr<std::string> op =
      Transfer(false, path, state, {}, "", options.arrival_timeout, Lending::kNone, *algorithm,
               options.memory_budget_bytes, -1, "", false, options.process_groups);
  if (!op.ok()) return op.status();
  return connection_->WaitFinal(session_id_, *op, options.arrival_timeout + options.deadline);
}

absl::StatusOr<PollResult> Client::Poll(StateDict& state) {
  return Poll(state, [](const std::string&, const std::string&) { return absl::OkStatus(); });
}

absl::StatusOr<PollResult> Client::Poll(
    StateDict& state,
    const std::function<absl::Status(const std::string& kind, const std::string& path)>& prepare) {
  pb::PollRequest request;
  request.set_session_id(session_id_);
  pb::PollResponse response;
  absl::Status s = connection_->Convert(
      connection_->stub()->Poll(connection_->Context().get(), request, &response), "Poll");
  if (!s.ok()) return s;
  PollResult result;
  if (!response.pending()) return result;
  result.performed = true;
  result.kind = OperationKindName(response.kind());
  const bool save = response.kind() == pb::OPERATION_SAVE;
  result.path = response.path();
  result.operation_id = response.operation_id();
  if (absl::Status s = prepare(result.kind, result.path); !s.ok()) return s;
  // An operator-requested receive (xfer://) lands in the shadow first, as Receive does.
  const bool receive = !save && IsTransferPath(result.path);
  absl::StatusOr<StateDict*> target = &state;
  if (receive) target = ShadowFor(TransferNameOf(result.path), state);
  if (!target.ok()) return target.status();
  absl::StatusOr<std::string> op = Transfer(save, result.path, **target, {}, result.operation_id,
                                            absl::Minutes(5), Lending::kNone);
  if (!op.ok()) return op.status();
  // A save returns at the snapshot, like Save (the operator's ckptctl waits for the commit);
  // a load once the tensors hold the loaded values.
  absl::StatusOr<OperationProgress> p =
      save ? connection_->WaitSnapshot(session_id_, *op, absl::Minutes(5) + absl::Hours(1))
           : connection_->WaitFinal(session_id_, *op, absl::Minutes(5) + absl::Hours(1));
  if (!p.ok()) return p.status();
  if (!p->status.ok()) return p->status;
  if (receive) {
    if (absl::Status copied = CopyTensors(**target, state); !copied.ok()) return copied;
  }
  return result;
}

}  // namespace ckpt::client
