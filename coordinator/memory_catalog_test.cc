#include "coordinator/memory_catalog.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A committed checkpoint of two files, r0 held by w-1 and w-2, r1 by w-2.
MemoryCheckpoint TwoFiles(const std::string& name) {
  MemoryCheckpoint c;
  c.name = name;
  c.committed = absl::FromUnixMillis(1000);
  for (const char* file : {"data/r0_0.safetensors", "data/r1_0.safetensors"}) {
    pb::DataFile* f = c.manifest.add_files();
    f->set_name(file);
    f->set_size_bytes(64);
  }
  c.holders["data/r0_0.safetensors"] = {{"w-1", "a"}, {"w-2", "b"}};
  c.holders["data/r1_0.safetensors"] = {{"w-2", "b"}};
  c.bytes = 128;
  return c;
}

// What a worker reports holding of `checkpoint` (its record, as RecordsFor delivered it).
pb::HeldMemoryCheckpoint Held(const MemoryCheckpoint& checkpoint,
                              const std::vector<std::string>& files, bool pinned = false) {
  pb::HeldMemoryCheckpoint h;
  h.set_name(checkpoint.name);
  for (const std::string& f : files) h.add_files(f);
  h.set_complete(true);
  h.set_pinned(pinned);
  *h.mutable_record() = RecordOf(checkpoint);
  return h;
}

google::protobuf::RepeatedPtrField<pb::HeldMemoryCheckpoint> Reports(
    std::vector<pb::HeldMemoryCheckpoint> held) {
  google::protobuf::RepeatedPtrField<pb::HeldMemoryCheckpoint> out;
  for (pb::HeldMemoryCheckpoint& h : held) *out.Add() = std::move(h);
  return out;
}

TEST(MemoryCatalogTest, EveryHolderIsSentTheRecordOnceAndNoneAfterItReportedIt) {
  MemoryCatalog catalog;
  ASSERT_TRUE(catalog.Claim("s", "op-1").ok());
  ASSERT_TRUE(catalog.Commit("op-1", TwoFiles("s")).ok());
  std::vector<RecordItem> for_w1 = catalog.RecordsFor("w-1", {});
  ASSERT_EQ(for_w1.size(), 1u);
  EXPECT_EQ(for_w1[0].record.name(), "s");
  EXPECT_TRUE(catalog.RecordsFor("w-1", {for_w1[0].key}).empty());  // sent on this stream
  EXPECT_EQ(catalog.RecordsFor("w-2", {}).size(), 1u);
  EXPECT_TRUE(catalog.RecordsFor("w-3", {}).empty());  // holds nothing
  // w-2 registers again reporting its copies with the record: nothing more to send it.
  catalog.Adopt("w-2", "b",
                Reports({Held(TwoFiles("s"), {"data/r0_0.safetensors", "data/r1_0.safetensors"})}));
  EXPECT_TRUE(catalog.RecordsFor("w-2", {}).empty());
}

TEST(MemoryCatalogTest, ARestartedCoordinatorRebuildsCheckpointsFromTheWorkersReports) {
  MemoryCheckpoint before = TwoFiles("s");
  before.published_name = "policy";
  before.published_version = 3;
  before.persist_to = "/p";
  before.persist_overwrite = true;
  MemoryCatalog catalog;  // the new process: empty
  std::vector<std::string> lines =
      catalog.Adopt("w-9", "b", Reports({Held(before, {"data/r0_0.safetensors"}, true)}));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("memory_copy_adopted checkpoint=mem://s"));
  absl::StatusOr<MemoryCheckpoint> s = catalog.Find("s");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->rebuilt);
  EXPECT_EQ(s->bytes, 128);
  EXPECT_EQ(s->published_name, "policy");
  EXPECT_EQ(s->published_version, 3);
  EXPECT_EQ(s->persist_state, PersistState::kPersisting);
  EXPECT_TRUE(s->persist_overwrite);
  ASSERT_EQ(s->holders.at("data/r0_0.safetensors").size(), 1u);
  EXPECT_EQ(s->holders.at("data/r0_0.safetensors")[0].worker_id, "w-9");
  // r1 has no holder yet: the persistence waits for one (or for the end of the wait).
  EXPECT_TRUE(catalog.TakeRecoveredPersists(false).empty());
  catalog.Adopt("w-8", "a", Reports({Held(before, {"data/r1_0.safetensors"}, true)}));
  EXPECT_EQ(catalog.TakeRecoveredPersists(false), std::vector<std::string>{"s"});
  EXPECT_TRUE(catalog.TakeRecoveredPersists(true).empty());  // taken once
}

TEST(MemoryCatalogTest, CopiesWithoutARecordOrWithAnotherManifestAreNotAdopted) {
  MemoryCatalog catalog;
  ASSERT_TRUE(catalog.Claim("s", "op-1").ok());
  ASSERT_TRUE(catalog.Commit("op-1", TwoFiles("s")).ok());
  pb::HeldMemoryCheckpoint unrecorded = Held(TwoFiles("t"), {"data/r0_0.safetensors"});
  unrecorded.clear_record();
  pb::HeldMemoryCheckpoint incomplete = Held(TwoFiles("u"), {"data/r0_0.safetensors"});
  incomplete.set_complete(false);
  MemoryCheckpoint other = TwoFiles("s");
  other.manifest.mutable_files(0)->set_size_bytes(65);
  pb::HeldMemoryCheckpoint differs = Held(other, {"data/r0_0.safetensors"});
  pb::HeldMemoryCheckpoint garbage = Held(TwoFiles("v"), {"data/r0_0.safetensors"});
  garbage.mutable_record()->set_manifest("\xff\xff not a manifest");
  std::vector<std::string> lines =
      catalog.Adopt("w-3", "c", Reports({unrecorded, incomplete, differs, garbage}));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr("never recorded"));
  EXPECT_THAT(lines[1], HasSubstr("incomplete"));
  EXPECT_THAT(lines[2], HasSubstr("differs"));
  EXPECT_THAT(lines[3], HasSubstr("does not parse"));
  for (const char* name : {"t", "u", "v"}) EXPECT_FALSE(catalog.Find(name).ok()) << name;
  EXPECT_EQ(catalog.Find("s")->holders.at("data/r0_0.safetensors").size(), 2u);  // no w-3
}

TEST(MemoryCatalogTest, ReportedCopiesUnderHostileNamesAreNotAdopted) {
  MemoryCatalog catalog;  // a restarted coordinator: a worker's report is all it has
  std::vector<pb::HeldMemoryCheckpoint> held;
  for (const char* name : {"", "../../etc", "a/b", "x\ny", "mem://nested"}) {
    held.push_back(Held(TwoFiles(name), {"data/r0_0.safetensors"}));
  }
  held.push_back(Held(TwoFiles(std::string(100000, 'n')), {"data/r0_0.safetensors"}));
  std::vector<std::string> lines = catalog.Adopt("w-3", "c", Reports(held));
  ASSERT_EQ(lines.size(), held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_THAT(lines[i], HasSubstr("not a valid memory checkpoint name")) << i;
    EXPECT_FALSE(catalog.Find(held[i].name()).ok()) << i;
  }
}

TEST(MemoryCatalogTest, ReportedCopiesWhoseSizesOverflowOrAreNegativeAreNotAdopted) {
  MemoryCatalog catalog;
  MemoryCheckpoint overflowing = TwoFiles("big");
  for (pb::DataFile& f : *overflowing.manifest.mutable_files()) f.set_size_bytes(INT64_MAX);
  MemoryCheckpoint negative = TwoFiles("neg");
  negative.manifest.mutable_files(0)->set_size_bytes(-64);
  MemoryCheckpoint unpublished = TwoFiles("p.v1");
  unpublished.published_name = "p";
  unpublished.published_version = -1;
  const std::vector<std::string> files = {"data/r0_0.safetensors", "data/r1_0.safetensors"};
  const std::vector<std::string> lines = catalog.Adopt(
      "w-1", "a",
      Reports({Held(overflowing, files), Held(negative, files), Held(unpublished, files)}));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("memory_copy_not_adopted checkpoint=mem://big"));
  EXPECT_THAT(lines[0], HasSubstr("sizes are negative or overflow"));
  EXPECT_THAT(lines[1], HasSubstr("memory_copy_not_adopted checkpoint=mem://neg"));
  EXPECT_THAT(lines[2], HasSubstr("published version is negative"));
  for (const char* name : {"big", "neg", "p.v1"}) EXPECT_FALSE(catalog.Find(name).ok()) << name;
  // Sizes that add up to exactly the largest int64 are taken.
  MemoryCheckpoint largest = TwoFiles("largest");
  largest.manifest.mutable_files(0)->set_size_bytes(INT64_MAX - 64);
  catalog.Adopt("w-1", "a", Reports({Held(largest, files)}));
  ASSERT_TRUE(catalog.Find("largest").ok());
  EXPECT_EQ(catalog.Find("largest")->bytes, INT64_MAX);
}

TEST(MemoryCatalogTest, AWorkerDeclaredDeadThatRegistersAgainGetsItsCopiesBack) {
  MemoryCatalog catalog;
  ASSERT_TRUE(catalog.Claim("s", "op-1").ok());
  ASSERT_TRUE(catalog.Commit("op-1", TwoFiles("s")).ok());
  catalog.DropWorker("w-2");
  EXPECT_TRUE(catalog.Find("s")->holders.at("data/r1_0.safetensors").empty());
  catalog.Adopt("w-2", "b", Reports({Held(TwoFiles("s"), {"data/r1_0.safetensors"})}));
  absl::StatusOr<MemoryCheckpoint> s = catalog.Find("s");
  EXPECT_EQ(s->holders.at("data/r1_0.safetensors").size(), 1u);
  EXPECT_TRUE(s->lost.at("data/r1_0.safetensors").empty());
  EXPECT_FALSE(s->rebuilt);
}

TEST(MemoryCatalogTest, KeepNewestCountsEachRetentionGroupApart) {
  MemoryCatalog catalog;
  int op = 0;
  auto commit = [&](const std::string& name, const std::string& published) {
    const std::string id = absl::StrCat("op-", ++op);
    MemoryCheckpoint c = TwoFiles(name);
    c.committed = absl::FromUnixMillis(op);
    c.published_name = published;
    EXPECT_TRUE(catalog.Claim(name, id).ok());
    return *catalog.Commit(id, c, /*keep_newest=*/2);
  };
  EXPECT_TRUE(commit("a1", "").empty());
  EXPECT_TRUE(commit("p.v1", "p").empty());
  EXPECT_TRUE(commit("a2", "").empty());
  EXPECT_TRUE(commit("p.v2", "p").empty());
  EXPECT_EQ(commit("p.v3", "p"), std::vector<std::string>{"p.v1"});  // not a1
  EXPECT_EQ(commit("a3", ""), std::vector<std::string>{"a1"});       // not p.v2
  EXPECT_TRUE(catalog.Find("p.v2").ok());
  EXPECT_EQ(RetentionGroup(*catalog.Find("p.v2")), "xfer:p");
  // A checkpoint of one group being persisted does not block a save of another group.
  MemoryCheckpoint persisting = TwoFiles("a4");
  persisting.committed = absl::FromUnixMillis(100);
  persisting.persist_state = PersistState::kPersisting;
  persisting.persist_to = "/p";
  ASSERT_TRUE(catalog.Claim("a4", "op-x").ok());
  ASSERT_TRUE(catalog.Commit("op-x", persisting, 1).ok());
  EXPECT_EQ(catalog.CheckRoomForOneMore(1, "").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(catalog.CheckRoomForOneMore(1, "xfer:p").ok());
}

TEST(MemoryCatalogTest, ACheckpointEvictedByKeepNewestIsNamedAsEvictedNotAsNeverCommitted) {
  MemoryCatalog catalog;
  int op = 0;
  auto commit = [&](const std::string& name, const std::string& published,
                    PersistState persist = PersistState::kNotAsked) {
    const std::string id = absl::StrCat("op-", ++op);
    MemoryCheckpoint c = TwoFiles(name);
    c.committed = absl::FromUnixMillis(op);
    c.published_name = published;
    c.persist_state = persist;
    if (persist != PersistState::kNotAsked) c.persist_to = "/ckpt/" + name;
    EXPECT_TRUE(catalog.Claim(name, id).ok());
    return *catalog.Commit(id, c, /*keep_newest=*/1);
  };
  commit("a1", "", PersistState::kPersisted);
  commit("a2", "");
  commit("a3", "");
  commit("p.v1", "p");
  commit("p.v2", "p");
  absl::Status never = catalog.Find("zz").status();
  EXPECT_EQ(never.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(never.message(), HasSubstr("mem://zz (never committed by a memory save)"));
  absl::Status a2 = catalog.Find("a2").status();
  EXPECT_EQ(a2.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(a2.message(), HasSubstr("mem://a2: it was evicted by --memory_keep=1"));
  EXPECT_THAT(a2.message(), HasSubstr("mem://a3 was the newest; save it again"));
  EXPECT_THAT(a2.message(), Not(HasSubstr("never committed")));
  EXPECT_THAT(catalog.Find("a1").status().message(), HasSubstr("persisted to /ckpt/a1"));
  EXPECT_THAT(catalog.Find("p.v1").status().message(),
              HasSubstr("evicted by --transfer_keep_versions=1 (retention: the newest 1 "
                        "versions of xfer://p are kept)"));
  // Saved again under the same name: found, and once forgotten again, evicted again.
  commit("a2", "");
  EXPECT_TRUE(catalog.Find("a2").ok());
  commit("a4", "");
  EXPECT_THAT(catalog.Find("a2").status().message(), HasSubstr("mem://a4 was the newest"));
  // The record is bounded: the oldest evictions are forgotten past the limit.
  for (size_t i = 0; i <= MemoryCatalog::kMaxEvictionsRemembered; ++i) {
    commit(absl::StrCat("b", i), "");
  }
  EXPECT_THAT(catalog.Find("a3").status().message(), HasSubstr("never committed"));
  EXPECT_THAT(catalog.Find("b0").status().message(), HasSubstr("evicted"));
}

}  // namespace
}  // namespace ckpt::coordinator
