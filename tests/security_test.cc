// Access control with real daemons on loopback (docs/services.md, Security): TLS with client
// certificates and roles, worker identities bound to their certificates, checkpoint roots,
// rendezvous limits, and the worker's trainer socket (mode, SO_PEERCRED, what --listen may
// remove). Certificates are made at test time with `ckptctl certs`.
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

// Names in /dev/shm that start with `prefix`.
std::vector<std::string> ShmSegmentsStartingWith(const std::string& prefix) {
  std::vector<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (struct dirent* entry = readdir(dir)) {
      if (absl::StartsWith(entry->d_name, prefix)) names.push_back(entry->d_name);
    }
    closedir(dir);
  }
  return names;
}

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return context;
}

grpc::Status GetStatusWith(Cluster& cluster, const TlsFiles& files) {
  auto stub = pb::Coordinator::NewStub(cluster.CoordinatorChannel(files));
  pb::GetStatusResponse response;
  return stub->GetStatus(Ctx().get(), pb::GetStatusRequest(), &response);
}

grpc::Status RequestSaveWith(Cluster& cluster, const TlsFiles& files, const std::string& path) {
  auto stub = pb::Coordinator::NewStub(cluster.CoordinatorChannel(files));
  pb::RequestOperationRequest request;
  request.set_job("any");
  request.set_kind(pb::OPERATION_SAVE);
  request.set_path(path);
  pb::RequestOperationResponse response;
  return stub->RequestOperation(Ctx().get(), request, &response);
}

grpc::Status RendezvousSet(pb::Rendezvous::Stub* stub, const std::string& key,
                           const std::string& value) {
  pb::KvSetRequest request;
  request.set_key(key);
  request.set_value(value);
  pb::KvSetResponse response;
  return stub->Set(Ctx().get(), request, &response);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---- TLS and roles ------------------------------------------------------------------------

TEST(SecurityTest, ATlsCoordinatorRefusesPlaintextClientsAndCertificatesOfAnotherCa) {
  Cluster cluster;
  cluster.UseTls();
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  const TlsFiles operator_files = cluster.IssueCertificate("operator", "alice");
  EXPECT_TRUE(GetStatusWith(cluster, operator_files).ok());

  grpc::Status plaintext = GetStatusWith(cluster, TlsFiles());
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE) << plaintext.error_message();

  const TlsFiles foreign =
      cluster.IssueCertificate("operator", "mallory", cluster.dir() + "/other-ca");
  grpc::Status other_ca = GetStatusWith(cluster, foreign);
  EXPECT_EQ(other_ca.error_code(), grpc::StatusCode::UNAVAILABLE) << other_ca.error_message();

  std::string out;
  EXPECT_NE(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &out), 0) << out;
  std::vector<std::string> with_foreign = {"status",     "--coordinator", cluster.address(),
                                           "--tls-ca",   foreign.ca,      "--tls-cert",
                                           foreign.cert, "--tls-key",     foreign.key};
  EXPECT_NE(cluster.RunCkptctl(with_foreign, &out), 0) << out;
  std::vector<std::string> with_operator = {"status", "--coordinator", cluster.address()};
  for (const std::string& flag : cluster.OperatorFlags()) with_operator.push_back(flag);
  EXPECT_EQ(cluster.RunCkptctl(with_operator, &out), 0) << out;
}

TEST(SecurityTest, AWorkerCertificateCannotRequestOperationsButAnOperatorCertificateCan) {
  Cluster cluster;
  cluster.UseTls();
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; })) << trainer->Stderr();

  const std::string path = cluster.dir() + "/by-operator";
  grpc::Status by_worker = RequestSaveWith(cluster, cluster.worker_tls(), path);
  EXPECT_EQ(by_worker.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(by_worker.error_message(),
              AllOf(HasSubstr("worker certificate 'host'"), HasSubstr("RequestOperation"),
                    HasSubstr("operator")));
  grpc::Status status_by_worker = GetStatusWith(cluster, cluster.worker_tls());
  EXPECT_EQ(status_by_worker.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(cluster.Status().operations_size(), 0) << "nothing was requested";

  std::vector<std::string> save = {
      "save", "--coordinator", cluster.address(), "--job", "polled", "--timeout", "60s", path};
  for (const std::string& flag : cluster.OperatorFlags()) save.push_back(flag);
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl(save, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("committed at " + path));
  EXPECT_EQ(access((path + "/manifest.pb").c_str(), F_OK), 0);
}

TEST(SecurityTest, SavesAndExchangeLoadsRunOverTls) {
  Cluster cluster;
  cluster.UseTls();
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/tls-ckpt";
  for (Child* t : RunRanks(cluster, "tls", 2, "save", path, {})) {
    ASSERT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
  // The load's Gloo rendezvous goes through the coordinator's Rendezvous service over TLS.
  for (Child* t : RunRanks(cluster, "tls", 2, "load", path, {"--algorithm", "broadcast"})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
}

TEST(SecurityTest, AWorkerCertificateCannotActForAWorkerItDidNotRegister) {
  Cluster cluster;
  cluster.UseTls();
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  cluster.StartWorker(0);
  const std::string victim = cluster.worker_id(0);
  const TlsFiles intruder = cluster.IssueCertificate("worker", "intruder");
  auto stub = pb::Coordinator::NewStub(cluster.CoordinatorChannel(intruder));

  pb::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(victim);
  pb::HeartbeatResponse heartbeat_response;
  grpc::Status s = stub->Heartbeat(Ctx().get(), heartbeat, &heartbeat_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("'intruder'"), HasSubstr(victim), HasSubstr("worker:host")));

  pb::DeregisterWorkerRequest deregister;
  deregister.set_worker_id(victim);
  pb::DeregisterWorkerResponse deregister_response;
  s = stub->DeregisterWorker(Ctx().get(), deregister, &deregister_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // Nor report a result for a rank the victim runs (here: a save gathering its ranks).
  Child* trainer = cluster.StartTrainer(0, "reported", 0, 2, "save");
  std::string op;
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse status = cluster.Status();
    if (status.operations_size() != 1) return false;
    op = status.operations(0).id();
    return true;
  })) << trainer->Stderr();
  pb::ReportResultRequest report;
  report.set_operation_id(op);
  report.set_rank(0);
  report.mutable_result()->set_code(static_cast<int>(absl::StatusCode::kDataLoss));
  report.mutable_result()->set_message("forged");
  pb::ReportResultResponse reported;
  s = stub->ReportResult(Ctx().get(), report, &reported);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  // Nor join a rank as the victim, even among its own joins in one JoinOperations call.
  pb::JoinOperationsRequest joins;
  pb::JoinOperationRequest* forged = joins.add_joins();
  forged->set_job("reported");
  forged->set_world_size(2);
  forged->set_rank(1);
  forged->set_kind(pb::OPERATION_SAVE);
  forged->set_path(cluster.Status().operations(0).path());
  forged->set_worker_id(victim);
  pb::JoinOperationsResponse joined;
  s = stub->JoinOperations(Ctx().get(), joins, &joined);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(joined.results_size(), 1);
  EXPECT_EQ(joined.results(0).status().code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied))
      << joined.results(0).status().message();
  EXPECT_THAT(joined.results(0).status().message(), HasSubstr(victim));

  // Re-registering with the victim's host and pid would take its id over.
  const pb::GetStatusResponse before = cluster.Status();
  const pb::WorkerStatus* record = FindWorker(before, victim);
  ASSERT_NE(record, nullptr);
  pb::RegisterWorkerRequest impersonate;
  *impersonate.mutable_info() = record->info();
  pb::RegisterWorkerResponse registered;
  s = stub->RegisterWorker(Ctx().get(), impersonate, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message() << registered.worker_id();

  // An operator may not pose as a worker either.
  auto operator_stub = pb::Coordinator::NewStub(
      cluster.CoordinatorChannel(cluster.IssueCertificate("operator", "bob")));
  s = operator_stub->Heartbeat(Ctx().get(), heartbeat, &heartbeat_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  s = operator_stub->JoinOperations(Ctx().get(), joins, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("JoinOperations"));

  const pb::GetStatusResponse after = cluster.Status();
  const pb::WorkerStatus* still = FindWorker(after, victim);
  ASSERT_NE(still, nullptr);
  EXPECT_TRUE(still->alive());
  ASSERT_EQ(after.operations_size(), 1);
  EXPECT_EQ(after.operations(0).phase(), pb::PHASE_GATHERING) << "the forged report was ignored";
}

TEST(SecurityTest, WithoutCertificatesACoordinatorRefusesToListenBeyondLoopback) {
  Cluster cluster;
  const std::string root = "--checkpoint_root=" + cluster.dir();
  Child* refused = cluster.Start(
      {Runfile("coordinator/ckpt_coordinator"), "--listen=0.0.0.0:0", root}, "refused");
  ASSERT_TRUE(WaitFor([&] { return !refused->Running(); }));
  EXPECT_EQ(WEXITSTATUS(refused->status), 2);
  EXPECT_THAT(refused->Stderr(), AllOf(HasSubstr("0.0.0.0:0"), HasSubstr("ckptctl certs init"),
                                       HasSubstr("--insecure")));

  const std::string address_file = cluster.dir() + "/insecure.address";
  Child* insecure = cluster.Start({Runfile("coordinator/ckpt_coordinator"), "--listen=0.0.0.0:0",
                                   root, "--insecure", "--address_file=" + address_file},
                                  "insecure");
  ASSERT_TRUE(WaitFor([&] { return !ReadAll(address_file).empty() || !insecure->Running(); }));
  EXPECT_TRUE(insecure->Running()) << insecure->Stderr();
  EXPECT_THAT(insecure->Stderr(), HasSubstr("INSECURE"));

  Child* rootless =
      cluster.Start({Runfile("coordinator/ckpt_coordinator"), "--listen=127.0.0.1:0"}, "rootless");
  ASSERT_TRUE(WaitFor([&] { return !rootless->Running(); }));
  EXPECT_EQ(WEXITSTATUS(rootless->status), 2);
  EXPECT_THAT(rootless->Stderr(), HasSubstr("--checkpoint_root"));
}

// ---- Checkpoint roots ---------------------------------------------------------------------

TEST(SecurityTest, PathsOutsideTheCheckpointRootsAreRefusedNamingTheRoot) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  cluster.StartWorker(0);
  char outside_template[] = "/tmp/ckpt-outside-XXXXXX";
  ASSERT_NE(mkdtemp(outside_template), nullptr);
  const std::string outside = outside_template;

  // An operator's save, a trainer's save and a cluster reshard's destination.
  std::string out;
  EXPECT_EQ(
      cluster.RunCkptctl(
          {"save", "--coordinator", cluster.address(), "--job", "j", outside + "/ckpt"}, &out),
      1);
  EXPECT_THAT(out, AllOf(HasSubstr(outside + "/ckpt"), HasSubstr(cluster.dir()),
                         HasSubstr("outside the checkpoint roots")));
  for (Child* t : RunRanks(cluster, "trainer", 1, "save", outside + "/by-trainer", {})) {
    EXPECT_EQ(Result(*t).first, static_cast<int>(absl::StatusCode::kPermissionDenied));
    EXPECT_THAT(Result(*t).second,
                AllOf(HasSubstr(outside + "/by-trainer"), HasSubstr(cluster.dir())));
  }
  const std::string layout = cluster.dir() + "/layout.json";
  std::ofstream(layout) << "{}";
  EXPECT_EQ(cluster.RunCkptctl({"reshard", cluster.dir() + "/src", outside + "/dst", "--layout",
                                layout, "--coordinator", cluster.address()},
                               &out),
            1);
  EXPECT_THAT(out, AllOf(HasSubstr("reshard destination"), HasSubstr(cluster.dir())));

  // Relative paths would resolve against the daemon's working directory.
  auto stub = pb::Coordinator::NewStub(cluster.CoordinatorChannel({}));
  pb::RequestOperationRequest relative;
  relative.set_job("j");
  relative.set_kind(pb::OPERATION_LOAD);
  relative.set_path("ckpt/step1");
  pb::RequestOperationResponse response;
  grpc::Status s = stub->RequestOperation(Ctx().get(), relative, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("relative"), HasSubstr(cluster.dir())));

  EXPECT_EQ(std::system(("rmdir " + outside).c_str()), 0) << "nothing was created outside";
}

TEST(SecurityTest, DotDotAndSymbolicLinksCannotLeadOutOfTheRoots) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  char outside_template[] = "/tmp/ckpt-outside-XXXXXX";
  ASSERT_NE(mkdtemp(outside_template), nullptr);
  const std::string outside = outside_template;
  ASSERT_EQ(symlink(outside.c_str(), (cluster.dir() + "/escape").c_str()), 0);
  ASSERT_EQ(mkdir((cluster.dir() + "/sub").c_str(), 0700), 0);

  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "j",
                                cluster.dir() + "/escape/ckpt"},
                               &out),
            1);
  EXPECT_THAT(out, AllOf(HasSubstr("resolves to '" + outside + "/ckpt'"),
                         HasSubstr("symbolic link"), HasSubstr(cluster.dir())));
  const std::string dotdot = cluster.dir() + "/sub/../../x";
  EXPECT_EQ(
      cluster.RunCkptctl({"load", "--coordinator", cluster.address(), "--job", "j", dotdot}, &out),
      1);
  EXPECT_THAT(out, AllOf(HasSubstr(dotdot), HasSubstr("'..'")));
  EXPECT_EQ(cluster.Status().operations_size(), 0);
  EXPECT_EQ(std::system(("rmdir " + outside).c_str()), 0) << "nothing was created outside";
}

// ---- Rendezvous store ---------------------------------------------------------------------

TEST(SecurityTest, RendezvousKeysAreLimitedPerJobAndGoWithTheirOperation) {
  Cluster cluster;
  cluster.UseTls();
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(
      {"--rendezvous_max_keys_per_job=4", "--rendezvous_max_value_bytes=1024"}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string path = cluster.dir() + "/limits";
  Child* r0 = cluster.StartTrainer(0, "limited", 0, 2, "save", path);
  std::string op;
  ASSERT_TRUE(WaitFor([&] {
    pb::GetStatusResponse status = cluster.Status();
    if (status.operations_size() != 1) return false;
    op = status.operations(0).id();
    return true;
  })) << r0->Stderr();
  const std::string group = "save/" + op + "/";

  auto owner = pb::Rendezvous::NewStub(cluster.CoordinatorChannel(cluster.worker_tls()));
  for (int i = 0; i < 4; ++i) {
    grpc::Status s = RendezvousSet(owner.get(), group + std::to_string(i), "v");
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  grpc::Status full = RendezvousSet(owner.get(), group + "4", "v");
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(),
              AllOf(HasSubstr("job limited"), HasSubstr("--rendezvous_max_keys_per_job")));
  grpc::Status big = RendezvousSet(owner.get(), group + "0", std::string(2048, 'x'));
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(big.error_message(),
              AllOf(HasSubstr("job limited"), HasSubstr("--rendezvous_max_value_bytes")));
  EXPECT_EQ(RendezvousSet(owner.get(), "save/op-does-not-exist/k", "v").error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(RendezvousSet(owner.get(), "loose-key", "v").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // A worker that serves no rank of the operation may not touch its keys.
  auto stranger = pb::Rendezvous::NewStub(
      cluster.CoordinatorChannel(cluster.IssueCertificate("worker", "stranger")));
  grpc::Status foreign = RendezvousSet(stranger.get(), group + "0", "v");
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED) << foreign.error_message();

  // The save completes; its keys are erased with it and its rendezvous is closed.
  Child* r1 = cluster.StartTrainer(1, "limited", 1, 2, "save", path);
  ASSERT_TRUE(WaitFor([&] { return Result(*r0).first >= 0 && Result(*r1).first >= 0; }));
  EXPECT_EQ(Result(*r0).first, 0) << Result(*r0).second;
  EXPECT_TRUE(WaitFor([&] {
    return cluster.coordinator().Stderr().find("rendezvous_erased op=" + op + " keys=4") !=
           std::string::npos;
  })) << cluster.coordinator().Stderr();
  grpc::Status closed = RendezvousSet(owner.get(), group + "0", "v");
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(closed.error_message(), HasSubstr("has ended"));
}

// ---- The worker's trainer socket ----------------------------------------------------------

TEST(SecurityTest, TheTrainerSocketIsPrivateWhateverTheUmask) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  const mode_t previous = umask(0);
  cluster.StartWorker(0);
  umask(previous);
  struct stat st;
  ASSERT_EQ(lstat(cluster.worker_socket(0).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(SecurityTest, ATrainersPidIsTheKernelsWordNotItsOwn) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  cluster.StartWorker(0);
  Child* victim = cluster.StartTrainer(0, "victim", 0, 1, "hold");
  ASSERT_TRUE(WaitFor([&] { return Shared(*victim); })) << victim->Stderr();
  const std::string segment = LineValue(victim->Stdout(), "segment");
  const std::string segment_name = segment.substr(0, segment.find(' '));

  // This test process says Hello claiming to be the victim's process...
  auto stub = cluster.WorkerStub(0);
  pb::TrainerHello hello;
  hello.set_job("thief");
  hello.set_rank(0);
  hello.set_world_size(1);
  hello.set_pid(victim->pid);
  pb::TrainerHelloResponse session;
  grpc::Status s = stub->Hello(Ctx().get(), hello, &session);
  ASSERT_TRUE(s.ok()) << s.error_message();
  bool judged_by_kernel = false;
  const pb::WorkerStatusResponse sessions = WorkerStatus(cluster, 0);
  for (const pb::TrainerSession& t : sessions.sessions()) {
    if (t.job() == "thief") judged_by_kernel = t.pid() == getpid();
  }
  EXPECT_TRUE(judged_by_kernel) << "the session must carry this process's pid, " << getpid();

  // ...so the victim's shared memory (its segment names carry its pid) is not the thief's.
  pb::RegisterTensorsRequest steal;
  steal.set_session_id(session.session_id());
  pb::SharedTensor* t = steal.add_tensors();
  t->mutable_shard()->mutable_tensor()->set_key("stolen");
  t->mutable_shard()->mutable_tensor()->set_dtype(pb::DTYPE_I32);
  t->mutable_shard()->mutable_tensor()->add_global_shape(1);
  t->mutable_shard()->mutable_tensor()->add_global_shape(1024);
  for (int64_t v : {0, 0}) t->mutable_shard()->mutable_region()->add_offsets(v);
  for (int64_t v : {1, 1024}) t->mutable_shard()->mutable_region()->add_lengths(v);
  t->set_memory_kind(pb::MEMORY_HOST);
  t->set_segment(segment_name);
  t->set_nbytes(4096);
  pb::RegisterTensorsResponse registered;
  s = stub->RegisterTensors(Ctx().get(), steal, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "mapped " << segment_name;
  EXPECT_THAT(s.error_message(), HasSubstr(segment_name));
}

TEST(SecurityTest, ListenNeverRemovesAFileThatIsNotASocket) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  const std::string precious = cluster.dir() + "/precious.txt";
  std::ofstream(precious) << "keep me";
  Child* worker = cluster.Start({Runfile("worker/ckpt_worker"),
                                 "--coordinator=" + cluster.address(), "--listen=unix:" + precious},
                                "worker-on-file");
  ASSERT_TRUE(WaitFor([&] { return !worker->Running(); }));
  EXPECT_EQ(WEXITSTATUS(worker->status), 2);
  EXPECT_THAT(worker->Stderr(), AllOf(HasSubstr(precious), HasSubstr("not a socket")));
  EXPECT_EQ(ReadAll(precious), "keep me");
}

TEST(SecurityTest, ATrainerOfAnotherUidIsRefusedUnlessTheWorkerAllowsIt) {
  if (geteuid() != 0) GTEST_SKIP() << "running a trainer as another uid needs root";
  constexpr int kNobody = 65534;
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({}));
  // The other uid must reach the sockets and run the probe (runfiles live under /root).
  ASSERT_EQ(chmod(cluster.dir().c_str(), 0711), 0);
  const std::string bin = cluster.dir() + "/bin";
  ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
  ASSERT_EQ(std::system(("cp " + Runfile("tests/trainer_probe") + " " + bin + "/").c_str()), 0);
  auto run_as_nobody = [&](int worker, const std::string& job) {
    return cluster.Start(
        {"/usr/bin/setpriv", absl::StrCat("--reuid=", kNobody), absl::StrCat("--regid=", kNobody),
         "--clear-groups", bin + "/trainer_probe", "--worker",
         "unix:" + cluster.worker_socket(worker), "--job", job, "--rank", "0", "--world_size", "1",
         "--mode", "hold"},
        "nobody-" + job);
  };
  cluster.StartWorker(0);
  // Mode 0600 keeps it out; with a permissive mode the kernel's uid still does.
  Child* shut_out = run_as_nobody(0, "shut-out");
  ASSERT_TRUE(WaitFor([&] { return Result(*shut_out).first >= 0; })) << shut_out->Stderr();
  EXPECT_NE(Result(*shut_out).first, 0);
  ASSERT_EQ(chmod(cluster.worker_socket(0).c_str(), 0666), 0);
  Child* refused = run_as_nobody(0, "refused");
  ASSERT_TRUE(WaitFor([&] { return Result(*refused).first >= 0; })) << refused->Stderr();
  EXPECT_EQ(Result(*refused).first, static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(Result(*refused).second,
              AllOf(HasSubstr(absl::StrCat("uid ", kNobody)), HasSubstr("--trainer_uids")));

  cluster.StartWorker(1, {absl::StrCat("--trainer_uids=", kNobody)});
  Child* allowed = run_as_nobody(1, "allowed");
  EXPECT_TRUE(WaitFor([&] { return Shared(*allowed) || Result(*allowed).first >= 0; }));
  EXPECT_TRUE(Shared(*allowed)) << allowed->Stdout() << allowed->Stderr();
  // The other user's trainer dies: its worker releases its segments (they would otherwise
  // stay in /dev/shm, owned by that user, after every run).
  allowed->Kill();
  EXPECT_TRUE(WaitFor([] { return ShmSegmentsStartingWith("ckpt.allowed.").empty(); }))
      << absl::StrJoin(ShmSegmentsStartingWith("ckpt.allowed."), " ");
}

}  // namespace
}  // namespace ckpt::testing
