// Background persistence of memory checkpoints end to end (issue 17): real ckpt_coordinator and
// ckpt_worker processes on loopback (workers announcing two hosts), trainer processes saving to
// mem://<name> with persist_to through the client library.
// - the persisted checkpoint equals a direct storage save of the same state: every data file
//   byte for byte, and the manifest field for field except created_unix_micros (the commit
//   time); `ckptctl verify` passes on it; an operator-requested save (`ckptctl save
//   --persist-to`) persists the same way;
// - the writing worker killed (SIGKILL) mid-persist: the replica's worker writes its file and
//   the checkpoint commits; with no holder left the persistence fails naming the file, nothing
//   partial is left, and the earlier checkpoint at the path is intact;
// - a memory save that would evict a checkpoint still being persisted is refused; it commits
//   once the persistence ended (and the persisted one is evicted then);
// - a load of a checkpoint that the workers evicted for their memory budget is refused at
//   planning, naming it (the catalog learnt of the eviction by heartbeat);
// - refusals naming what is wrong: a mem:// persist_to, a persist_to on a storage save,
//   negative replicas, mem:// reshard sources and destinations (coordinator and ckptctl), and
//   ckptctl's storage-only commands on a mem:// path.
// Events are ordered by the workers' --persist_gate_file (a worker announces that a persist
// item waits, and writes once the test creates the file), never by timing: a hook of the
// testonly daemon //worker:ckpt_worker_testing (worker/test_hooks_on.cc).
#include <csignal>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "tests/services_cluster.h"

namespace ckpt::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kLeaseMs = 600;
const std::vector<std::string> kShape = {"--global_rows", "2", "--elements", "4096"};

// The catalog's record of memory checkpoint `name`, if listed.
std::optional<pb::MemoryCheckpointStatus> Find(Cluster& cluster, const std::string& name) {
  const pb::GetStatusResponse status = cluster.Status();
  for (const pb::MemoryCheckpointStatus& m : status.memory_checkpoints()) {
    if (m.name() == name) return m;
  }
  return std::nullopt;
}

// The catalog's persistence line for `name` ("" when not listed).
std::string PersistOf(Cluster& cluster, const std::string& name) {
  std::optional<pb::MemoryCheckpointStatus> m = Find(cluster, name);
  return m.has_value() ? m->persist() : "";
}

bool Listed(Cluster& cluster, const std::string& name) { return Find(cluster, name).has_value(); }

// Rank r on worker r (two ranks), run to the end; returns the trainers.
std::vector<Child*> RunPair(Cluster& cluster, const std::string& job, const std::string& mode,
                            const std::string& path, std::vector<std::string> extra) {
  extra.insert(extra.end(), kShape.begin(), kShape.end());
  return RunRanks(cluster, job, 2, mode, path, extra);
}

void ExpectAllOk(const std::vector<Child*>& ranks, Cluster& cluster) {
  for (Child* t : ranks) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second << ClusterLogs(cluster);
  }
}

// Coordinator plus worker 0 on hostA and worker 1 on hostB; `gates[i]` is worker i's
// --persist_gate_file ("" = none).
void StartCluster(Cluster& cluster, const std::vector<std::string>& gates,
                  const std::vector<std::string>& coordinator_flags = {}) {
  std::vector<std::string> flags = {absl::StrCat("--lease_ms=", kLeaseMs)};
  flags.insert(flags.end(), coordinator_flags.begin(), coordinator_flags.end());
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator(flags));
  cluster.set_worker_binary("worker/ckpt_worker_testing");  // --persist_gate_file
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> w = {i == 0 ? "--host=hostA" : "--host=hostB",
                                  "--data_plane_address=127.0.0.1"};
    if (!gates[i].empty()) w.push_back("--persist_gate_file=" + gates[i]);
    cluster.StartWorker(i, w);
  }
}

// The two checkpoints hold the same data files, byte for byte, and the same manifest but for
// its commit time.
void ExpectSameCheckpoint(const std::string& persisted, const std::string& direct) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> a = CheckpointReader::Open(persisted);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> b = CheckpointReader::Open(direct);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  pb::Manifest ma = (*a)->manifest(), mb = (*b)->manifest();
  ASSERT_GT(ma.files_size(), 0);
  for (const pb::DataFile& f : ma.files()) {
    absl::StatusOr<std::string> x = ReadWholeFile(JoinPath(persisted, f.name()), 1 << 24);
    absl::StatusOr<std::string> y = ReadWholeFile(JoinPath(direct, f.name()), 1 << 24);
    ASSERT_TRUE(x.ok() && y.ok()) << f.name();
    EXPECT_TRUE(*x == *y) << f.name() << " differs";
  }
  ma.clear_created_unix_micros();
  mb.clear_created_unix_micros();
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differ.Compare(ma, mb)) << diff;
}

// Waits until memory checkpoint `name` is persisted to `persisted`, then saves the same state
// directly (once both workers are registered: after a coordinator restart the persistence
// needs only one holder, and a rank attaching through the other would be refused) and checks
// that the two are the same checkpoint and that `persisted` verifies.
void ExpectPersistedAsADirectSave(Cluster& cluster, const std::string& name,
                                  const std::string& persisted) {
  ASSERT_TRUE(WaitFor([&] { return PersistOf(cluster, name) == "persisted to " + persisted; }))
      << PersistOf(cluster, name) << ClusterLogs(cluster);
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers(cluster.Status()) == 2; })) << ClusterLogs(cluster);
  const std::string direct = cluster.dir() + "/direct";
  ExpectAllOk(RunPair(cluster, "train", "save", direct, {}), cluster);
  ExpectSameCheckpoint(persisted, direct);
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", persisted}, &out), 0) << out;
}

TEST(MemoryPersistE2eTest, PersistedCheckpointIsTheDirectSaveByteForByteAndVerifies) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, {"", ""}));
  const std::string persisted = cluster.dir() + "/persisted";
  ExpectAllOk(RunPair(cluster, "train", "save", "mem://step1", {"--persist_to", persisted}),
              cluster);
  ASSERT_NO_FATAL_FAILURE(ExpectPersistedAsADirectSave(cluster, "step1", persisted));
  std::string status;
  ASSERT_EQ(cluster.RunCkptctl({"status", "--coordinator", cluster.address()}, &status), 0);
  EXPECT_THAT(status, HasSubstr("persisted to " + persisted));
  // The persisted checkpoint loads like any other.
  for (Child* t : RunPair(cluster, "serve", "load", persisted, {"--layout", "cols"})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
    EXPECT_THAT(t->Stdout(), HasSubstr("verified"));
  }
}

TEST(MemoryPersistE2eTest, AnOperatorRequestedMemorySavePersistsWhereCkptctlSaid) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(
      cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs), "--memory_replicas=0"}));
  cluster.StartWorker(0);
  Child* trainer = cluster.StartTrainer(0, "polled", 0, 1, "poll");
  ASSERT_TRUE(WaitFor([&] { return cluster.Status().jobs_size() == 1; }))
      << trainer->Stdout() << trainer->Stderr();
  const std::string persisted = cluster.dir() + "/operator-persisted";
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "polled",
                                "--timeout", "60s", "--persist-to", persisted, "mem://op1"},
                               &out),
            0)
      << out << ClusterLogs(cluster);
  ASSERT_TRUE(WaitFor([&] { return PersistOf(cluster, "op1") == "persisted to " + persisted; }))
      << PersistOf(cluster, "op1") << ClusterLogs(cluster);
  EXPECT_EQ(cluster.RunCkptctl({"verify", persisted}, &out), 0) << out;
  ASSERT_TRUE(WaitFor([&] { return Result(*trainer).first >= 0; }));
  EXPECT_EQ(Result(*trainer).first, 0) << Result(*trainer).second;
}

TEST(MemoryPersistE2eTest, AWriterKilledMidPersistIsReplacedByTheReplicasWorker) {
  Cluster cluster;
  const std::string gate = cluster.dir() + "/gate0";  // never created: worker 0 never writes
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, {gate, ""}));
  const std::string persisted = cluster.dir() + "/persisted";
  ExpectAllOk(RunPair(cluster, "train", "save", "mem://step1", {"--persist_to", persisted}),
              cluster);
  ASSERT_TRUE(WaitFor([&] { return Exists(gate + ".waiting"); })) << ClusterLogs(cluster);
  EXPECT_EQ(PersistOf(cluster, "step1"), "persisting to " + persisted);
  cluster.worker(0).Kill(SIGKILL);  // holds rank 0's file and was asked to write it
  ASSERT_TRUE(WaitFor([&] { return PersistOf(cluster, "step1") == "persisted to " + persisted; }))
      << PersistOf(cluster, "step1") << ClusterLogs(cluster);
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", persisted}, &out), 0) << out;
  EXPECT_THAT(cluster.worker(1).Stderr() + cluster.worker(1).Stdout(),
              HasSubstr("persist_written checkpoint=mem://step1"));
}

TEST(MemoryPersistE2eTest, NoHolderLeftFailsNamingTheFileAndKeepsTheEarlierCheckpoint) {
  Cluster cluster;
  const std::string gate = cluster.dir() + "/gate0";
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, {gate, ""}));
  const std::string target = cluster.dir() + "/target";
  ExpectAllOk(RunPair(cluster, "train", "save", target, {}), cluster);  // the earlier checkpoint
  const std::string before = ReadFile(target + "/manifest.pb");
  ExpectAllOk(RunPair(cluster, "train", "save", "mem://step2",
                      {"--replicas", "0", "--persist_to", target, "--persist_overwrite", "1"}),
              cluster);
  ASSERT_TRUE(WaitFor([&] { return Exists(gate + ".waiting"); })) << ClusterLogs(cluster);
  cluster.worker(0).Kill(SIGKILL);  // the only holder of rank 0's file
  ASSERT_TRUE(WaitFor([&] {
    return PersistOf(cluster, "step2").rfind("persist to " + target + " failed", 0) == 0;
  })) << PersistOf(cluster, "step2")
      << ClusterLogs(cluster);
  const std::string failed = PersistOf(cluster, "step2");
  EXPECT_THAT(failed, HasSubstr("data/r0_0.safetensors"));
  EXPECT_THAT(failed, HasSubstr(cluster.worker_id(0)));
  // Nothing partial: only the earlier checkpoint (and the cluster's own files) in the root.
  absl::StatusOr<std::vector<std::string>> entries = ListDir(cluster.dir());
  ASSERT_TRUE(entries.ok());
  for (const std::string& e : *entries) {
    if (e != "target") {
      EXPECT_EQ(e.find("target"), std::string::npos) << "left behind: " << e;
    }
  }
  EXPECT_EQ(ReadFile(target + "/manifest.pb"), before);
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", target}, &out), 0) << out;
}

TEST(MemoryPersistE2eTest, APersistenceInFlightWhenTheCoordinatorIsKilledCompletesAfterItsRestart) {
  Cluster cluster;
  const std::string gate = cluster.dir() + "/gate";  // both workers wait for it
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, {gate, gate}));
  const std::string persisted = cluster.dir() + "/persisted";
  ExpectAllOk(RunPair(cluster, "train", "save", "mem://step1", {"--persist_to", persisted}),
              cluster);
  // The persistence is in flight (a worker's item waits at the gate) and both workers kept the
  // coordinator's record of the commit.
  ASSERT_TRUE(WaitFor([&] { return Exists(gate + ".waiting"); })) << ClusterLogs(cluster);
  const std::string kept = "memory_record checkpoint=mem://step1 kept=true";
  ASSERT_TRUE(WaitFor([&] {
    return absl::StrContains(cluster.worker(0).Stderr(), kept) &&
           absl::StrContains(cluster.worker(1).Stderr(), kept);
  })) << ClusterLogs(cluster);
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs)}));
  // The workers report the pinned checkpoint; the new coordinator persists it again.
  ASSERT_TRUE(WaitFor([&] {
    return absl::StrContains(cluster.coordinator().Stderr(),
                             "persist_started checkpoint=mem://step1");
  })) << ClusterLogs(cluster);
  EXPECT_EQ(PersistOf(cluster, "step1"), "persisting to " + persisted);
  WriteFile(gate, "go\n");
  ASSERT_NO_FATAL_FAILURE(ExpectPersistedAsADirectSave(cluster, "step1", persisted));
  // The first process's staging directory was journaled: the restarted coordinator removed it.
  EXPECT_THAT(cluster.coordinator().Stderr(), HasSubstr("staging_removed path="));
  absl::StatusOr<std::vector<std::string>> entries = ListDir(cluster.dir());
  ASSERT_TRUE(entries.ok());
  for (const std::string& e : *entries) {
    if (e != "persisted") {
      EXPECT_EQ(e.find("persisted"), std::string::npos) << "left behind: " << e;
    }
  }
}

TEST(MemoryPersistE2eTest, EvictionWaitsUntilTheCheckpointIsPersisted) {
  Cluster cluster;
  const std::string gate = cluster.dir() + "/gate";  // both workers wait for it
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, {gate, gate}, {"--memory_keep=1"}));
  const std::string persisted = cluster.dir() + "/a";
  ExpectAllOk(RunPair(cluster, "train", "save", "mem://a", {"--persist_to", persisted}), cluster);
  ASSERT_TRUE(WaitFor([&] { return Exists(gate + ".waiting"); })) << ClusterLogs(cluster);
  // Keeping one, mem://b would evict mem://a before it is on storage: refused.
  for (Child* t : RunPair(cluster, "train", "save", "mem://b", {})) {
    auto [code, message] = Result(*t);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kResourceExhausted)) << message;
    EXPECT_THAT(message, HasSubstr("mem://a"));
    EXPECT_THAT(message, HasSubstr(persisted));
  }
  EXPECT_TRUE(Listed(cluster, "a"));
  WriteFile(gate, "");
  ASSERT_TRUE(WaitFor([&] { return PersistOf(cluster, "a") == "persisted to " + persisted; }))
      << PersistOf(cluster, "a") << ClusterLogs(cluster);
  ExpectAllOk(RunPair(cluster, "train", "save", "mem://b", {}), cluster);
  EXPECT_TRUE(Listed(cluster, "b"));
  EXPECT_FALSE(Listed(cluster, "a"));  // evicted once persisted
  std::string out;
  EXPECT_EQ(cluster.RunCkptctl({"verify", persisted}, &out), 0) << out;
}

TEST(MemoryPersistE2eTest, ALoadOfACheckpointTheWorkersEvictedIsRefusedAtPlanningNamingIt) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(
      cluster.StartCoordinator({absl::StrCat("--lease_ms=", kLeaseMs), "--memory_keep=5"}));
  // Each rank's file is 20 KiB (16 KiB and its header); the budget holds two, no replicas.
  for (int i = 0; i < 2; ++i) {
    cluster.StartWorker(i, {i == 0 ? "--host=hostA" : "--host=hostB",
                            "--data_plane_address=127.0.0.1", "--memory_tier_bytes=50000"});
  }
  for (const char* name : {"mem://e1", "mem://e2", "mem://e3"}) {
    ExpectAllOk(RunPair(cluster, "train", "save", name, {"--replicas", "0"}), cluster);
  }
  // The workers evicted e1 for e3 and said so in a heartbeat: the catalog lists no copy.
  auto copies = [&](const std::string& name) {
    std::optional<pb::MemoryCheckpointStatus> m = Find(cluster, name);
    return m.has_value() ? m->replicas_size() : -1;
  };
  ASSERT_TRUE(WaitFor([&] { return copies("e1") == 0; })) << ClusterLogs(cluster);
  for (Child* t : RunPair(cluster, "serve", "load", "mem://e1", {})) {
    auto [code, message] = Result(*t);
    EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kFailedPrecondition)) << message;
    EXPECT_THAT(message, HasSubstr("mem://e1"));
    EXPECT_THAT(message, HasSubstr("evicted it from its memory tier"));
  }
  for (Child* t : RunPair(cluster, "serve", "load", "mem://e3", {})) {
    EXPECT_EQ(Result(*t).first, 0) << Result(*t).second;
  }
}

TEST(MemoryPersistE2eTest, PersistToAndMemoryPathsAreRefusedWhereTheyDoNotBelong) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartCluster(cluster, {"", ""}));
  const std::string storage = cluster.dir() + "/plain";
  struct Case {
    std::string path;
    std::vector<std::string> flags;
    std::string named;
  };
  for (const Case& c : {Case{"mem://x", {"--persist_to", "mem://y"}, "mem://y"},
                        Case{storage, {"--persist_to", cluster.dir() + "/p"}, cluster.dir() + "/p"},
                        Case{"mem://x", {"--replicas", "-3"}, "-3"}}) {
    for (Child* t : RunPair(cluster, "train", "save", c.path, c.flags)) {
      auto [code, message] = Result(*t);
      EXPECT_EQ(code, static_cast<int>(absl::StatusCode::kInvalidArgument)) << message;
      EXPECT_THAT(message, HasSubstr(c.named));
    }
  }
  EXPECT_FALSE(Exists(storage));
  // The coordinator refuses the same on the wire (a worker that does not check).
  auto join = [&](const std::string& path, const std::string& persist_to, int replicas) {
    pb::JoinOperationRequest request;
    request.set_job("wire");
    request.set_world_size(1);
    request.set_rank(0);
    request.set_kind(pb::OPERATION_SAVE);
    request.set_path(path);
    request.set_worker_id(cluster.worker_id(0));
    request.set_persist_to(persist_to);
    if (replicas != -1) request.set_memory_replicas(replicas);
    pb::JoinOperationResponse response;
    grpc::ClientContext context;
    return cluster.coordinator_stub()->JoinOperation(&context, request, &response);
  };
  grpc::Status s = join("mem://w", "", -2);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("rank 0"));
  EXPECT_THAT(s.error_message(), HasSubstr("-2"));
  s = join("mem://w", "mem://v", -1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("mem://v"));
  s = join(storage, cluster.dir() + "/q", -1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(cluster.dir() + "/q"));
  // A cluster reshard reads and writes storage checkpoints only.
  for (const auto& [source, destination, named] :
       {std::tuple<std::string, std::string, std::string>{"mem://m", storage, "mem://m"},
        {storage, "mem://n", "mem://n"}}) {
    pb::StartReshardRequest request;
    request.set_source(source);
    request.set_destination(destination);
    request.set_layout_json("{}");
    pb::StartReshardResponse response;
    grpc::ClientContext context;
    s = cluster.coordinator_stub()->StartReshard(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(named));
  }
  // ckptctl's storage-only commands refuse a memory checkpoint before touching anything.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"verify", "mem://m"},
        {"inspect", "mem://m"},
        {"reshard", "mem://m", storage, "--layout", "{}"},
        {"reshard", "--coordinator", cluster.address(), storage, "mem://n", "--layout", "{}"}}) {
    std::string refused;
    EXPECT_EQ(cluster.RunCkptctl(args, &refused), 2) << refused;
    EXPECT_THAT(refused, HasSubstr("is a memory checkpoint")) << args[0];
  }
  // ckptctl's operator-requested save carries persist_to; the coordinator refuses a mem:// one.
  std::string out;
  EXPECT_NE(cluster.RunCkptctl({"save", "--coordinator", cluster.address(), "--job", "train",
                                "--persist-to", "mem://z", "mem://x"},
                               &out),
            0);
  EXPECT_THAT(out, HasSubstr("mem://z"));
}

}  // namespace
}  // namespace ckpt::testing
