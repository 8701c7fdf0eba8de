// Reshards executed on a cluster's workers (ckptctl reshard --coordinator) with real
// ckpt_coordinator and ckpt_worker processes on loopback: a GPT-style state saved TP=2 x DP=2
// with ZeRO-1 flat optimizer shards is rewritten into TP=4 and a 3-rank uneven layout spread
// over two workers, and every element is checked; a corrupt source, an existing destination,
// a missing source, no workers and a worker killed mid-reshard each give a clear error and
// leave an earlier checkpoint at the destination intact (no half-written directory).
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "examples/gpt_checkpoint.h"
#include "examples/gpt_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/operation_phase.h"
#include "storage/checkpoint_reader.h"
#include "storage/file_util.h"
#include "tests/services_cluster.h"

namespace ckpt {
namespace {

using testing::Cluster;
using ::testing::HasSubstr;

// Names in `dir` (no "." / "..").
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

class ClusterReshardTest : public ::testing::Test {
 protected:
  // A TP=2 x DP=2 checkpoint of a small GPT state at `path` (about `bytes` bytes).
  void WriteSource(const std::string& path, int64_t bytes = 0) {
    GptConfig c;
    if (bytes > 0) {
      c = GptConfigForBytes(bytes);
    } else {
      c.layers = 2;
      c.hidden = 64;
      c.vocab = 500;
    }
    auto tensors = GptTensors(c);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    tensors_ = *tensors;
    auto layout = LayoutSpec::Parse(GptLayoutJson(2, 2));
    ASSERT_TRUE(layout.ok()) << layout.status();
    auto written = WriteGptCheckpoint(path, tensors_, *layout, int64_t{512} << 10, WriteOptions{},
                                      700, {{"model", "gpt-cluster-test"}});
    ASSERT_TRUE(written.ok()) << written.status();
  }

  std::string LayoutFile(const std::string& name, const std::string& json) {
    const std::string path = JoinPath(cluster_.dir(), name + ".json");
    EXPECT_TRUE(WriteFileDurably(path, json).ok());
    return path;
  }

  void ExpectHolds(const std::string& path, const std::string& layout_json) {
    auto layout = LayoutSpec::Parse(layout_json);
    ASSERT_TRUE(layout.ok());
    auto report = CheckGptCheckpoint(path, tensors_, *layout);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->bytes, TotalBytes(tensors_));
  }

  int Reshard(const std::string& src, const std::string& dst, const std::string& layout_file,
              const std::vector<std::string>& extra, std::string* out) {
    std::vector<std::string> args = {
        "reshard", src, dst, "--layout", layout_file, "--coordinator", cluster_.address()};
    args.insert(args.end(), extra.begin(), extra.end());
    const int code = cluster_.RunCkptctl(args, out);
    std::printf("ckptctl reshard -> %d: %s", code, out->c_str());  // the diagnosis, for the log
    return code;
  }

  Cluster cluster_;
  std::vector<TensorMeta> tensors_;
};

TEST_F(ClusterReshardTest, TwoWorkersRewriteIntoTpFourAndUnevenThreeBitExact) {
  cluster_.StartCoordinator({});
  cluster_.StartWorker(0);
  cluster_.StartWorker(1);
  const std::string src = JoinPath(cluster_.dir(), "src");
  WriteSource(src);

  const std::string tp4 = GptLayoutJson(4, 1);
  const std::string dst = JoinPath(cluster_.dir(), "tp4");
  std::string out;
  ASSERT_EQ(Reshard(src, dst, LayoutFile("tp4", tp4), {"--memory-budget", "1M", "--json"}, &out), 0)
      << out;
  const nlohmann::json summary = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << out;
  EXPECT_EQ(summary["world_size"], 4);
  EXPECT_EQ(summary["workers"], 2);
  EXPECT_EQ(summary["bytes_written"].get<int64_t>(), TotalBytes(tensors_));
  ExpectHolds(dst, tp4);
  auto reader = CheckpointReader::Open(dst);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->manifest().step(), 700);
  EXPECT_EQ((*reader)->manifest().user_metadata().at("model"), "gpt-cluster-test");
  EXPECT_EQ((*reader)->manifest().saved_layout().world_size(), 4);
  // With a 1 MiB budget every rank wrote several files of at most a third of it.
  EXPECT_GT((*reader)->manifest().files_size(), 4);
  for (const auto& f : (*reader)->manifest().files()) {
    EXPECT_LE(f.size_bytes(), (int64_t{1} << 20) / 3 + (int64_t{64} << 10)) << f.name();
  }

  // Megatron TP=3 (sizes that do not divide by 3), in the human-readable output mode.
  const std::string tp3 = GptLayoutJson(3, 1);
  const std::string dst3 = JoinPath(cluster_.dir(), "tp3");
  ASSERT_EQ(Reshard(dst, dst3, LayoutFile("tp3", tp3), {}, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("on the cluster"));
  EXPECT_THAT(out, HasSubstr("3 ranks on 2 worker(s)"));
  ExpectHolds(dst3, tp3);
}

TEST_F(ClusterReshardTest, BadSourcesAndDestinationsLoseNothing) {
  cluster_.StartCoordinator({});
  cluster_.StartWorker(0);
  // Checkpoints in a directory of their own (the cluster's holds the processes' logs).
  const std::string ck = JoinPath(cluster_.dir(), "ckpt");
  ASSERT_TRUE(MakeDir(ck).ok());
  const std::string src = JoinPath(ck, "src");
  WriteSource(src);
  const std::string tp4 = GptLayoutJson(4, 1);
  const std::string layout = LayoutFile("tp4", tp4);
  const std::string dst = JoinPath(ck, "dst");
  std::string out;
  ASSERT_EQ(Reshard(src, dst, layout, {}, &out), 0) << out;
  const std::vector<std::string> before = Entries(ck);

  // An existing destination without --overwrite.
  EXPECT_EQ(Reshard(src, dst, layout, {}, &out), 1);
  EXPECT_THAT(out, HasSubstr("exists"));
  EXPECT_THAT(out, HasSubstr(dst));

  // A missing source names it.
  const std::string missing = JoinPath(ck, "no-such-checkpoint");
  EXPECT_EQ(Reshard(missing, JoinPath(ck, "x"), layout, {}, &out), 1);
  EXPECT_THAT(out, HasSubstr(missing));

  // Resharding onto itself is refused.
  EXPECT_EQ(Reshard(src, src, layout, {"--overwrite"}, &out), 1);
  EXPECT_THAT(out, HasSubstr("onto itself"));

  // A corrupt source (one flipped byte in a data file) is caught by the checksums while the
  // workers read it: the error names the file, and the earlier checkpoint at dst survives
  // the --overwrite attempt.
  const std::string bad = JoinPath(cluster_.dir(), "bad");  // outside ck
  ASSERT_EQ(std::system(absl::StrCat("cp -r ", src, " ", bad).c_str()), 0);
  const std::string victim = JoinPath(bad, "data/r1_0.safetensors");
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekp(size - 100);
    char c = 0;
    f.seekg(size - 100);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(size - 100);
    f.write(&c, 1);
  }
  EXPECT_EQ(Reshard(bad, dst, layout, {"--overwrite"}, &out), 1);
  EXPECT_THAT(out, HasSubstr("r1_0.safetensors"));
  EXPECT_THAT(out, HasSubstr("reshard rank"));
  ExpectHolds(dst, tp4);

  // Nothing half-written was left next to the destination.
  EXPECT_EQ(Entries(ck), before);
}

// --overwrite through the coordinator replaces only a committed checkpoint: a directory of
// someone's files and a regular file are refused before any worker writes, named in the
// error, and survive; nothing is left next to them.
TEST_F(ClusterReshardTest, OverwriteRefusesWhatIsNotACheckpoint) {
  cluster_.StartCoordinator({});
  cluster_.StartWorker(0);
  const std::string ck = JoinPath(cluster_.dir(), "ckpt");
  ASSERT_TRUE(MakeDir(ck).ok());
  const std::string src = JoinPath(ck, "src");
  WriteSource(src);
  const std::string layout = LayoutFile("tp4", GptLayoutJson(4, 1));
  const std::string home = JoinPath(ck, "home");
  ASSERT_TRUE(MakeDir(home).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(home, "thesis.tex"), "chapter 1").ok());
  const std::string file = JoinPath(ck, "file");
  ASSERT_TRUE(WriteFileDurably(file, "plain text").ok());
  const std::vector<std::string> before = Entries(ck);

  std::string out;
  EXPECT_EQ(Reshard(src, home, layout, {"--overwrite"}, &out), 1);
  EXPECT_THAT(out, HasSubstr(home));
  EXPECT_THAT(out, HasSubstr("not a ckpt checkpoint (no manifest.pb)"));
  EXPECT_EQ(Reshard(src, file, layout, {"--overwrite"}, &out), 1);
  EXPECT_THAT(out, HasSubstr(file));
  EXPECT_THAT(out, HasSubstr("a regular file"));

  EXPECT_EQ(ReadWholeFile(JoinPath(home, "thesis.tex"), 1 << 20).value_or(""), "chapter 1");
  EXPECT_EQ(Entries(home), std::vector<std::string>{"thesis.tex"});
  EXPECT_EQ(ReadWholeFile(file, 1 << 20).value_or(""), "plain text");
  EXPECT_EQ(Entries(ck), before);

  // A committed checkpoint there is replaced.
  const std::string dst = JoinPath(ck, "dst");
  ASSERT_EQ(Reshard(src, dst, layout, {}, &out), 0) << out;
  ASSERT_EQ(Reshard(src, dst, LayoutFile("tp3", GptLayoutJson(3, 1)), {"--overwrite"}, &out), 0)
      << out;
  ExpectHolds(dst, GptLayoutJson(3, 1));
}

TEST_F(ClusterReshardTest, NoLiveWorkerIsAClearError) {
  cluster_.StartCoordinator({});
  const std::string src = JoinPath(cluster_.dir(), "src");
  WriteSource(src);
  std::string out;
  EXPECT_EQ(Reshard(src, JoinPath(cluster_.dir(), "dst"), LayoutFile("tp4", GptLayoutJson(4, 1)),
                    {}, &out),
            1);
  EXPECT_THAT(out, HasSubstr("no live worker"));
  EXPECT_FALSE(PathExists(JoinPath(cluster_.dir(), "dst")));
}

TEST_F(ClusterReshardTest, WorkerKilledMidReshardAbortsWithoutCommit) {
  cluster_.StartCoordinator({"--lease_ms=600"});
  cluster_.StartWorker(0);
  cluster_.StartWorker(1);
  const std::string ck = JoinPath(cluster_.dir(), "ckpt");
  ASSERT_TRUE(MakeDir(ck).ok());
  const std::string src = JoinPath(ck, "src");
  WriteSource(src, int64_t{96} << 20);
  const std::string dst = JoinPath(ck, "dst");
  std::ifstream in(LayoutFile("tp4", GptLayoutJson(4, 1)));
  std::stringstream layout;
  layout << in.rdbuf();
  pb::StartReshardRequest request;
  request.set_source(src);
  request.set_destination(dst);
  request.set_layout_json(layout.str());
  request.set_memory_budget_bytes(int64_t{3} << 20);  // 1 MiB waves: many of them
  pb::StartReshardResponse started;
  {
    grpc::ClientContext context;
    grpc::Status s = cluster_.coordinator_stub()->StartReshard(&context, request, &started);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  cluster_.worker(1).Kill();
  pb::OperationStatus op;
  ASSERT_TRUE(testing::WaitFor([&] {
    grpc::ClientContext context;
    pb::WaitOperationRequest w;
    w.set_operation_id(started.operation_id());
    w.set_timeout_ms(200);
    return cluster_.coordinator_stub()->WaitOperation(&context, w, &op).ok() && IsFinal(op.phase());
  }));
  ASSERT_EQ(op.phase(), pb::PHASE_ABORTED) << "the reshard finished before the kill";
  std::printf("aborted: %s\n", op.status().message().c_str());
  EXPECT_THAT(op.status().message(), HasSubstr(cluster_.worker_id(1)));
  EXPECT_FALSE(PathExists(dst));
  // The staging directory is gone too (the surviving worker may still have been writing
  // into it when the abort came).
  EXPECT_TRUE(testing::WaitFor([&] { return Entries(ck) == std::vector<std::string>{"src"}; }))
      << absl::StrJoin(Entries(ck), ", ");
}

}  // namespace
}  // namespace ckpt
