// Real multi-host runs (issue 16): three hosts as Linux network namespaces joined by veth links
// to a bridge (tests/netns_hosts.h), made by the test itself. hostA runs the coordinator and
// worker 0, hostB worker 1, hostC workers 2 and 3; each trainer runs beside its worker, in its
// host's namespace. The daemons talk over TLS on the hosts' own addresses (10.x.y.z); Gloo's
// data plane binds to each worker's host address, so every exchange between hosts crosses a
// veth link. The checkpoint directory is on the shared file system.
//
// Saves, loads (direct, broadcast, overlap_all_to_all) and reshards across the hosts are
// bit-exact; the `auto` load exchanges within per-node process groups; cutting hostC's link
// mid-load or mid-save gives every rank an error naming hostC within the coordinator's lease and
// commits nothing. The memory tier keeps each file's copies on two hosts and loads from the
// survivors after a host is lost, and a live transfer between jobs on different hosts is
// bit-exact.
//
// Needs root and network namespaces: skipped, with the reason, where it cannot make them.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/netns_hosts.h"
#include "tests/services_cluster.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using testing::Child;
using testing::Cluster;
using ::testing::HasSubstr;
using testing::NetnsHosts;
using testing::Result;
using testing::WaitFor;

constexpr int kWorld = 4;
// The host of each worker (and of the trainer beside it): hostA, hostB, hostC, hostC.
constexpr int kHostOfWorker[kWorld] = {0, 1, 2, 2};
constexpr int kCutHost = 2;  // hostC
// A worker that misses heartbeats this long is declared dead: the bound on how late a rank
// hears of a cut link, besides the RPC deadlines.
constexpr int kLeaseMs = 3000;

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = NetnsHosts::Unavailable(); !why.empty()) {
      GTEST_SKIP() << "multi-host tests need network namespaces: " << why;
    }
    auto hosts = NetnsHosts::Create(3);
    ASSERT_TRUE(hosts.ok()) << hosts.status();
    hosts_ = std::move(*hosts);
    cluster_ = std::make_unique<Cluster>();
    // Daemons refuse non-loopback addresses without TLS: real certificates, as deployed.
    cluster_->UseTls();
    cluster_->set_network_namespace(hosts_->netns(0));
    cluster_->StartCoordinator(
        {"--listen=" + hosts_->address(0) + ":0", absl::StrCat("--lease_ms=", kLeaseMs)});
    for (int w = 0; w < kWorld; ++w) {
      const int h = kHostOfWorker[w];
      const int local_rank = w > 0 && kHostOfWorker[w - 1] == h ? 1 : 0;
      cluster_->set_network_namespace(hosts_->netns(h));
      cluster_->StartWorker(
          local_rank, {"--host=" + hosts_->name(h), "--data_plane_address=" + hosts_->address(h)});
    }
  }

  void TearDown() override {
    cluster_.reset();  // processes first, then their network
    hosts_.reset();
  }

  // Starts the trainer of `rank` beside worker `rank`, in that worker's host.
  Child* StartRank(const std::string& job, int rank, int world, const std::string& mode,
                   const std::string& path, const std::vector<std::string>& extra) {
    cluster_->set_network_namespace(hosts_->netns(kHostOfWorker[rank]));
    return cluster_->StartTrainer(rank, job, rank, world, mode, path, extra);
  }

  // Runs `world` ranks to completion (each printed its result and exited).
  std::vector<Child*> RunRanks(const std::string& job, int world, const std::string& mode,
                               const std::string& path, const std::vector<std::string>& extra) {
    std::vector<Child*> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(StartRank(job, r, world, mode, path, extra));
    EXPECT_TRUE(AllFinished(ranks, absl::Seconds(90))) << job << ": not every rank finished\n"
                                                       << testing::ClusterLogs(*cluster_);
    return ranks;
  }

  static bool AllFinished(std::vector<Child*> ranks, absl::Duration timeout) {
    return WaitFor(
        [&] {
          for (Child* t : ranks) {
            if (Result(*t).first < 0 || t->Running()) return false;
          }
          return true;
        },
        timeout);
  }

  // Every rank succeeded (and, for loads, verified every element).
  void ExpectAllOk(const std::vector<Child*>& ranks, bool load) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_EQ(Result(*ranks[r]).first, 0)
          << "rank " << r << ": " << Result(*ranks[r]).second << "\n"
          << ranks[r]->Stderr();
      if (load) {
        EXPECT_THAT(ranks[r]->Stdout(), HasSubstr("verified")) << "rank " << r;
      }
    }
  }

  // The phase of the newest operation on `path`, as GetStatus reports it.
  pb::OperationPhase Phase(const std::string& path, int* joined = nullptr) {
    pb::GetStatusResponse s = cluster_->Status();
    for (int i = s.operations_size(); i-- > 0;) {
      if (s.operations(i).path() != path) continue;
      if (joined != nullptr) *joined = s.operations(i).joined_ranks();
      return s.operations(i).phase();
    }
    return pb::OperationPhase();
  }

  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<Cluster> cluster_;
};

// Four ranks on three hosts save row blocks; loads into column blocks need a quarter of every
// saved file on every rank, so each algorithm moves bytes between the hosts.
TEST_F(MultiHostTest, SaveAndLoadAcrossHostsAreBitExactWithEveryAlgorithm) {
  const std::string path = cluster_->dir() + "/ck";
  const std::vector<std::string> size = {"--elements", "16384"};
  ExpectAllOk(RunRanks("mh", kWorld, "save", path, size), false);
  for (const char* algorithm : {"direct", "broadcast", "overlap_all_to_all"}) {
    SCOPED_TRACE(algorithm);
    std::vector<std::string> extra = size;
    for (const char* a : {"--layout", "cols", "--algorithm", algorithm}) extra.push_back(a);
    ExpectAllOk(RunRanks("mh", kWorld, "load", path, extra), true);
  }
}

// The coordinator's `auto` load across hosts exchanges within per-node process groups: every
// rank needs the whole tensor; hostA's and hostB's ranks each form a group of one, hostC's two
// ranks one group of two with its own communicator; each node reads the tensor from storage
// once and nothing is exchanged between hosts. Bit-exact.
TEST_F(MultiHostTest, AutoLoadAcrossHostsExchangesWithinPerNodeGroups) {
  const std::string path = cluster_->dir() + "/ck";
  const std::vector<std::string> size = {"--elements", "16384"};
  ExpectAllOk(RunRanks("mh", kWorld, "save", path, size), false);
  std::vector<std::string> extra = size;
  for (const char* a : {"--layout", "tpdp", "--tp", "1", "--algorithm", "auto"}) {
    extra.push_back(a);
  }
  ExpectAllOk(RunRanks("auto", kWorld, "load", path, extra), true);
  pb::GetStatusResponse s = cluster_->Status();
  std::string op;
  int64_t bytes_read = 0;
  for (const pb::OperationStatus& o : s.operations()) {
    if (o.job() == "auto" && o.kind() == pb::OPERATION_LOAD)
      op = o.id(), bytes_read = o.bytes_read();
  }
  ASSERT_FALSE(op.empty());
  EXPECT_EQ(bytes_read, 3 * kWorld * 16384 * 4);  // the 4 x 16384 int32 tensor once per host
  const std::string groups[kWorld] = {
      "g0\" group_rank=0 group_world=1", "g1\" group_rank=0 group_world=1",
      "g2\" group_rank=0 group_world=2", "g2\" group_rank=1 group_world=2"};
  for (int w = 0; w < kWorld; ++w) {
    const std::string log = cluster_->worker(w).Stderr();
    EXPECT_THAT(
        log, HasSubstr(absl::StrCat("op=", op, " rank=", w, " group=\"load/", op, "/", groups[w])))
        << log;
    EXPECT_THAT(log, HasSubstr("span 3 hosts")) << log;
  }
}

// The cluster reshards a checkpoint the hosts saved (4 row blocks) into 2 column blocks on its
// workers across the hosts; two ranks load the result, and four load it back into rows with
// the exchange: both bit-exact.
TEST_F(MultiHostTest, ReshardOnTheHostsIntoAnotherLayoutIsBitExact) {
  const std::string src = cluster_->dir() + "/ck", dst = cluster_->dir() + "/cols2";
  const std::vector<std::string> size = {"--elements", "16384"};
  ExpectAllOk(RunRanks("mh", kWorld, "save", src, size), false);
  const std::string layout = cluster_->dir() + "/cols2.json";
  testing::WriteFile(layout, R"json({"world_size": 2, "mesh": {"tp": 2},
      "rules": [{"match": "*", "placements": ["Shard(1)"]}]})json");
  std::string out;
  cluster_->set_network_namespace(hosts_->netns(1));  // the operator works on hostB
  std::vector<std::string> args = {
      "reshard", src, dst, "--layout", layout, "--coordinator", cluster_->address(), "--json"};
  for (const std::string& flag : cluster_->OperatorFlags()) args.push_back(flag);
  ASSERT_EQ(cluster_->RunCkptctl(args, &out), 0) << out << testing::ClusterLogs(*cluster_);
  EXPECT_THAT(out, HasSubstr("\"workers\":4")) << out;
  std::vector<std::string> two = size;
  for (const char* a : {"--layout", "cols", "--global_rows", "4", "--algorithm", "direct"}) {
    two.push_back(a);
  }
  ExpectAllOk(RunRanks("mh2", 2, "load", dst, two), true);
  std::vector<std::string> rows = size;
  for (const char* a : {"--algorithm", "overlap_all_to_all"}) rows.push_back(a);
  ExpectAllOk(RunRanks("mh", kWorld, "load", dst, rows), true);
}

// hostC's link goes down while a load exchanges bytes between the hosts (the link is shaped and
// every rank needs every saved row, so the exchange takes seconds, and cut once the coordinator
// reports the load executing): every rank's error names hostC, within a bound of the lease, and the
// checkpoint stays loadable.
TEST_F(MultiHostTest, LinkCutMidLoadNamesTheHostOnEveryRankAndKeepsTheCheckpoint) {
  const std::string path = cluster_->dir() + "/ck";
  const std::vector<std::string> size = {"--elements", "262144"};  // 1 MiB per rank
  ExpectAllOk(RunRanks("mh", kWorld, "save", path, size), false);
  absl::Status shaped = hosts_->Shape(kCutHost, "8mbit");
  ASSERT_TRUE(shaped.ok()) << shaped;
  std::vector<Child*> ranks;
  std::vector<std::string> extra = size;
  // Every rank loads the whole tensor (a (4, 1) mesh replicated over its first dimension), so
  // each saved row is read once and broadcast to every other rank: hostC's ranks must receive
  // 3 MiB each through the 8 Mbit/s link, seconds of exchange. (Column blocks would not do: each
  // block of a saved row is needed by one rank only, which reads it itself, and the load can end
  // within the poll interval below.)
  for (const char* a : {"--layout", "tpdp", "--tp", "1", "--algorithm", "broadcast"}) {
    extra.push_back(a);
  }
  for (int r = 0; r < kWorld; ++r) ranks.push_back(StartRank("mh", r, kWorld, "load", path, extra));
  // The exchange has begun once hostC holds a data-plane (Gloo) connection to hostB (which
  // runs no coordinator): the plan executes and the ranks' communicator spans the hosts.
  const std::string gloo_peer = hosts_->address(1) + ":";
  ASSERT_TRUE(WaitFor([&] {
    if (Phase(path) != pb::PHASE_EXECUTING) return false;
    absl::StatusOr<std::vector<std::string>> peers = hosts_->TcpPeers(kCutHost);
    if (!peers.ok()) return false;
    for (const std::string& p : *peers) {
      if (absl::StartsWith(p, gloo_peer)) return true;
    }
    return false;
  })) << testing::ClusterLogs(*cluster_);
  ASSERT_TRUE(hosts_->CutLink(kCutHost).ok());
  const absl::Time cut = absl::Now();
  ASSERT_TRUE(AllFinished(ranks, absl::Seconds(60))) << testing::ClusterLogs(*cluster_);
  const absl::Duration took = absl::Now() - cut;
  std::printf("every rank had its error %s after the cut\n", absl::FormatDuration(took).c_str());
  // A functional bound, not a speed target: the coordinator declares hostC's workers dead
  // after a lease and tells the other ranks; hostC's workers give up after the WaitOperation
  // call in flight at the cut (at most a lease plus the 5 s RPC deadline) and one more begun
  // after their lease ran out (5 s): about 16 s. Generous for CI's shared cores; the hang
  // guard above is 60 s.
  EXPECT_LT(took, absl::Seconds(40));
  // Where the load was when the link went down (each worker's account), for the log.
  for (int w = 0; w < kWorld; ++w) {
    const std::string log = cluster_->worker(w).Stderr();
    const size_t at = log.find("load_part_exchanged");
    std::printf("worker %d: %s\n", w,
                at == std::string::npos ? "(no exchange finished)"
                                        : log.substr(at, log.find('\n', at) - at).c_str());
  }
  for (int r = 0; r < kWorld; ++r) {
    std::printf("rank %d: %s\n", r, Result(*ranks[r]).second.c_str());
    EXPECT_NE(Result(*ranks[r]).first, 0) << "rank " << r;
    EXPECT_THAT(Result(*ranks[r]).second, HasSubstr(hosts_->name(kCutHost))) << "rank " << r;
  }
  // The checkpoint is intact: ranks on the hosts still linked load it bit-exact.
  std::vector<std::string> two = size;
  for (const char* a : {"--layout", "cols", "--global_rows", "4", "--algorithm", "broadcast"}) {
    two.push_back(a);
  }
  ExpectAllOk(RunRanks("after", 2, "load", path, two), true);
}

// A save in flight when hostC's link goes down: ranks 0 and 1 (hostA, hostB) have joined, then
// the link is cut and hostC's ranks ask to save. Every rank's error names hostC, no checkpoint
// directory appears, and the earlier checkpoint loads bit-exact.
TEST_F(MultiHostTest, LinkCutMidSaveNamesTheHostCommitsNothingAndKeepsTheEarlierCheckpoint) {
  const std::string first = cluster_->dir() + "/first", second = cluster_->dir() + "/second";
  const std::vector<std::string> size = {"--elements", "16384"};
  ExpectAllOk(RunRanks("mh", kWorld, "save", first, size), false);
  const std::string go = cluster_->dir() + "/go";
  std::vector<Child*> ranks;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> extra = size;
    if (kHostOfWorker[r] == kCutHost) {
      extra.push_back("--start_file");
      extra.push_back(go);
    }
    ranks.push_back(StartRank("mh", r, kWorld, "save", second, extra));
  }
  int joined = 0;
  ASSERT_TRUE(WaitFor([&] {
    Phase(second, &joined);
    return joined == 2;
  })) << testing::ClusterLogs(*cluster_);
  ASSERT_TRUE(hosts_->CutLink(kCutHost).ok());
  const absl::Time cut = absl::Now();
  testing::WriteFile(go, "go");
  ASSERT_TRUE(AllFinished(ranks, absl::Seconds(60))) << testing::ClusterLogs(*cluster_);
  std::printf("every rank had its error %s after the cut\n",
              absl::FormatDuration(absl::Now() - cut).c_str());
  for (int r = 0; r < kWorld; ++r) {
    std::printf("rank %d: %s\n", r, Result(*ranks[r]).second.c_str());
    EXPECT_NE(Result(*ranks[r]).first, 0) << "rank " << r;
    EXPECT_THAT(Result(*ranks[r]).second, HasSubstr(hosts_->name(kCutHost))) << "rank " << r;
  }
  EXPECT_FALSE(testing::Exists(second)) << "a checkpoint was committed";
  std::vector<std::string> two = size;
  for (const char* a : {"--layout", "cols", "--global_rows", "4", "--algorithm", "broadcast"}) {
    two.push_back(a);
  }
  ExpectAllOk(RunRanks("after", 2, "load", first, two), true);
}

// The memory tier across real hosts (issue 17): a memory save keeps each rank's file on its
// worker and one copy on a worker of another host, as the coordinator places replicas away from
// the source's host. hostC's link goes down, taking both of its workers and every copy they
// held; once their leases are gone, two ranks on hostA and hostB load the checkpoint into column
// blocks from the surviving copies, over the veth links, bit-exact.
TEST_F(MultiHostTest, MemorySaveSurvivesLosingAHostAndLoadsFromTheOtherHostsCopies) {
  const std::vector<std::string> shape = {"--global_rows", "4", "--elements", "16384"};
  ExpectAllOk(RunRanks("mh", kWorld, "save", "mem://mh", shape), false);
  pb::GetStatusResponse s = cluster_->Status();
  ASSERT_EQ(s.memory_checkpoints_size(), 1) << s.DebugString();
  std::map<std::string, std::set<std::string>> hosts_of_file;
  for (const pb::MemoryReplicaStatus& r : s.memory_checkpoints(0).replicas()) {
    hosts_of_file[r.file()].insert(r.host());
  }
  ASSERT_EQ(hosts_of_file.size(), static_cast<size_t>(kWorld)) << s.DebugString();
  for (const auto& [file, hosts] : hosts_of_file) {
    EXPECT_EQ(hosts.size(), 2u) << file << " is not held on two hosts";
  }
  ASSERT_TRUE(hosts_->CutLink(kCutHost).ok());
  const std::string lost = hosts_->name(kCutHost);
  ASSERT_TRUE(WaitFor([&] {
    const pb::GetStatusResponse now = cluster_->Status();
    for (const pb::MemoryCheckpointStatus& m : now.memory_checkpoints()) {
      for (const pb::MemoryReplicaStatus& r : m.replicas()) {
        if (r.host() == lost) return false;
      }
    }
    return true;
  })) << testing::ClusterLogs(*cluster_);
  std::vector<std::string> cols = shape;
  for (const char* a : {"--layout", "cols"}) cols.push_back(a);
  ExpectAllOk(RunRanks("serve", 2, "load", "mem://mh", cols), true);
}

// Live transfer across real hosts (issue 17): a source job of 4 ranks (TP=2 x DP=2, on hostA's
// and hostB's workers) publishes two versions; a destination job of 2 ranks with another layout
// (whole tensor, 2 replicas) on hostC receives each straight into its tensors, every byte crossing
// a veth link from the source's workers. Both versions arrive whole and bit-exact, and the second
// receive reuses the first one's plan.
TEST_F(MultiHostTest, TransferFromJobsOnTwoHostsIntoAJobOnTheThirdIsBitExact) {
  const std::string dir = cluster_->dir() + "/steps";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  auto start_probe = [&](int worker, const std::string& job, int rank, int world, int tp,
                         std::vector<std::string> extra) {
    for (const std::string& flag :
         {std::string("--tp"), absl::StrCat(tp), std::string("--global_rows"), std::string("4"),
          std::string("--elements"), std::string("16384"), std::string("--name"),
          std::string("policy"), std::string("--step_dir"), dir}) {
      extra.push_back(flag);
    }
    cluster_->set_network_namespace(hosts_->netns(kHostOfWorker[worker]));
    return testing::StartTransferProbe(*cluster_, worker, job, rank, world, extra);
  };
  std::vector<Child*> source, dest;
  for (int r = 0; r < 4; ++r) {  // ranks 0, 1 on worker 0 (hostA); 2, 3 on worker 1 (hostB)
    source.push_back(
        start_probe(r / 2, "trainer", r, 4, 2, {"--mode", "publish", "--versions", "2"}));
  }
  for (int r = 0; r < 2; ++r) {  // workers 2 and 3, both on hostC
    dest.push_back(start_probe(2 + r, "infer", r, 2, 1, {"--mode", "receive", "--receives", "2"}));
  }
  auto all_said = [](const std::vector<Child*>& children, const std::string& line) {
    for (Child* c : children) {
      if (!absl::StrContains(c->Stdout(), line)) return false;
    }
    return true;
  };
  for (int v = 1; v <= 2; ++v) {
    SCOPED_TRACE(absl::StrCat("version ", v));
    if (v > 1) testing::WriteFile(absl::StrCat(dir, "/publish.", v), "go\n");
    ASSERT_TRUE(WaitFor([&] { return all_said(source, absl::StrCat("durable ", v, " ")); }))
        << testing::ClusterLogs(*cluster_);
    for (Child* c : source)
      EXPECT_THAT(c->Stdout(), HasSubstr(absl::StrCat("durable ", v, " 0 \n")));
    testing::WriteFile(absl::StrCat(dir, "/receive.", v), "go\n");
    ASSERT_TRUE(WaitFor([&] { return testing::ReceivesJudged(dest, v); }))
        << testing::ClusterLogs(*cluster_);
    for (Child* c : dest) {
      EXPECT_THAT(c->Stdout(), HasSubstr(absl::StrCat("received ", v, " 0 \n")))
          << c->Stdout() << testing::ClusterLogs(*cluster_);
      EXPECT_THAT(c->Stdout(), HasSubstr(absl::StrCat("holds ", v, "\n"))) << c->Stdout();
      EXPECT_THAT(c->Stdout(), HasSubstr(absl::StrCat("version policy ", v, "\n"))) << c->Stdout();
    }
  }
  std::vector<pb::OperationStatus> receives;
  const pb::GetStatusResponse status = cluster_->Status();
  for (const pb::OperationStatus& op : status.operations()) {
    if (op.job() == "infer" && absl::StartsWith(op.path(), "xfer://")) receives.push_back(op);
  }
  ASSERT_EQ(receives.size(), 2u);
  EXPECT_GT(receives[0].transfer_serving_ranks(), 0);
  EXPECT_TRUE(receives[1].transfer_plan_reused());
}

}  // namespace
}  // namespace ckpt
