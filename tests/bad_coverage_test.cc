// A checkpoint whose checksums are all valid but whose pieces overlap or leave a hole is
// refused by every command and path that assembles tensors, with a message naming the tensor
// and the region: ckptctl inspect, verify, export and reshard (offline and on the cluster's
// workers), and loads by trainers through real daemons (direct reads and an exchange). Two
// crafted checkpoints of "probe.weight" I32 (4, 1024) saved as rows 0:2 and rows 2:4:
//   relabelled: rows 2:4 relabelled rows 1:3 in the manifest and in the safetensors entry name
//               (the same 8192 elements in all, so a count of elements sees nothing wrong);
//   holed:      the data file of rows 2:4 dropped from the manifest and the disk.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/manifest_codec.h"
#include "tests/services_cluster.h"

namespace ckpt {
namespace {

using testing::Child;
using testing::Cluster;
using ::testing::HasSubstr;

constexpr int64_t kRows = 4, kCols = 1024;

struct Crafted {
  std::string path;
  std::vector<std::string> says;  // what every refusal must name
};

// Writes the sound checkpoint (element values are their flat index, as trainer_probe checks).
pb::Manifest WriteSound(const std::string& path, std::vector<int32_t>* values) {
  values->resize(kRows * kCols);
  for (int64_t i = 0; i < kRows * kCols; ++i) (*values)[i] = static_cast<int32_t>(i);
  CheckpointContents c;
  c.tensors = {{"probe.weight", DType::kI32, {kRows, kCols}}};
  c.files = {
      {0,
       {{"probe.weight", Region{{0, 0}, {2, kCols}, std::nullopt}, values->data(), 2 * kCols * 4}}},
      {1,
       {{"probe.weight", Region{{2, 0}, {2, kCols}, std::nullopt}, values->data() + 2 * kCols,
         2 * kCols * 4}}}};
  auto m = WriteCheckpoint(path, c, WriteOptions{});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : pb::Manifest();
}

void Copy(const std::string& from, const std::string& to) {
  ASSERT_EQ(std::system(absl::StrCat("cp -r ", from, " ", to).c_str()), 0);
}

Crafted Relabelled(const std::string& sound, const pb::Manifest& m, const std::string& path) {
  Copy(sound, path);
  pb::Manifest r = m;
  pb::StoredPiece* moved = r.mutable_pieces(1);
  EXPECT_EQ(moved->entry_name(), "probe.weight|2:4,0:1024");
  moved->mutable_region()->set_offsets(0, 1);
  moved->set_entry_name("probe.weight|1:3,0:1024");
  EXPECT_TRUE(WriteFileDurably(JoinPath(path, "manifest.pb"), SerializeManifest(r)).ok());
  const std::string data = JoinPath(path, moved->file());
  std::string bytes = *ReadWholeFile(data, 1 << 26);
  const size_t at = bytes.find("probe.weight|2:4,0:1024");
  EXPECT_NE(at, std::string::npos);
  bytes.replace(at, 23, "probe.weight|1:3,0:1024");
  EXPECT_TRUE(WriteFileDurably(data, bytes).ok());
  return {path,
          {"tensor \"probe.weight\" (4, 1024): element (1, 0) is stored by 2 pieces (an overlap)",
           "region [0:2, 0:1024] in data/r0_0.safetensors",
           "region [1:3, 0:1024] in data/r1_0.safetensors"}};
}

Crafted Holed(const std::string& sound, const pb::Manifest& m, const std::string& path) {
  Copy(sound, path);
  pb::Manifest h = m;
  h.mutable_pieces()->RemoveLast();
  h.mutable_files()->RemoveLast();
  EXPECT_TRUE(WriteFileDurably(JoinPath(path, "manifest.pb"), SerializeManifest(h)).ok());
  EXPECT_EQ(std::remove(JoinPath(path, "data/r1_0.safetensors").c_str()), 0);
  return {path,
          {"tensor \"probe.weight\" (4, 1024): elements [2048, 4096) in row-major order are "
           "stored by no piece (a hole from (2, 0) to (3, 1023))"}};
}

void ExpectNames(const std::string& text, const Crafted& c, const std::string& what) {
  for (const std::string& s : c.says) EXPECT_THAT(text, HasSubstr(s)) << what << " of " << c.path;
}

TEST(BadCoverageTest, EveryCommandAndPathRefusesPiecesThatDoNotTileATensor) {
  Cluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.StartCoordinator({"--lease_ms=600"}));
  cluster.StartWorker(0);
  cluster.StartWorker(1);
  const std::string sound = JoinPath(cluster.dir(), "sound");
  std::vector<int32_t> values;
  const pb::Manifest m = WriteSound(sound, &values);
  const std::vector<Crafted> crafted = {Relabelled(sound, m, JoinPath(cluster.dir(), "relabel")),
                                        Holed(sound, m, JoinPath(cluster.dir(), "holed"))};
  const std::string layout = JoinPath(cluster.dir(), "tp2.json");
  ASSERT_TRUE(WriteFileDurably(layout, R"json({"world_size": 2, "mesh": {"tp": 2},
      "rules": [{"match": "*", "placements": ["Shard(1)"]}]})json")
                  .ok());
  // The sound checkpoint passes all of them (the crafted ones fail for their coverage only).
  std::string out;
  ASSERT_EQ(cluster.RunCkptctl({"verify", sound}, &out), 0) << out;

  for (const Crafted& c : crafted) {
    for (const char* cmd : {"inspect", "verify"}) {
      EXPECT_EQ(cluster.RunCkptctl({cmd, c.path}, &out), 1) << cmd << ": " << out;
      ExpectNames(out, c, cmd);
    }
    const std::string exported = c.path + ".safetensors";
    EXPECT_EQ(cluster.RunCkptctl({"export", c.path, exported}, &out), 1) << out;
    ExpectNames(out, c, "export");
    EXPECT_FALSE(PathExists(exported));

    const std::string offline = c.path + "-offline";
    EXPECT_EQ(cluster.RunCkptctl({"reshard", c.path, offline, "--layout", layout}, &out), 1) << out;
    ExpectNames(out, c, "reshard");
    EXPECT_FALSE(PathExists(offline));
    const std::string on_cluster = c.path + "-cluster";
    EXPECT_EQ(cluster.RunCkptctl({"reshard", c.path, on_cluster, "--layout", layout,
                                  "--coordinator", cluster.address()},
                                 &out),
              1)
        << out;
    ExpectNames(out, c, "reshard --coordinator");
    EXPECT_FALSE(PathExists(on_cluster));

    // Trainers loading it, by direct reads and by an exchange between the workers.
    for (const char* algorithm : {"direct", "broadcast"}) {
      const std::string job = absl::StrCat("load-", algorithm, "-", BaseName(c.path));
      for (Child* t : RunRanks(cluster, job, 2, "load", c.path,
                               {"--layout", "dtensor", "--global_rows", "4", "--elements", "1024",
                                "--algorithm", algorithm})) {
        EXPECT_NE(testing::Result(*t).first, 0) << algorithm << " " << t->Stdout();
        ExpectNames(testing::Result(*t).second, c, algorithm);
        EXPECT_THAT(t->Stdout(), ::testing::Not(HasSubstr("verified")));
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
