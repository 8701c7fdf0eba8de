#include "coordinator/staging_journal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_util.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

class StagingJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = absl::StrCat(tmp ? tmp : "/tmp", "/staging-", ::getpid(), "-",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_TRUE(RemoveTree(root_).ok() || !PathExists(root_));
    ASSERT_TRUE(MakeDir(root_).ok());
  }
  void TearDown() override { (void)RemoveTree(root_); }

  // A staging directory as a ckpt write leaves it: data/ with `files` files of `bytes` bytes.
  std::string Staging(const std::string& name, int files, int bytes, bool manifest = false) {
    const std::string dir = JoinPath(root_, name);
    EXPECT_TRUE(MakeDir(dir).ok());
    EXPECT_TRUE(MakeDir(JoinPath(dir, "data")).ok());
    for (int i = 0; i < files; ++i) {
      WriteFile(JoinPath(dir, absl::StrCat("data/r", i, "_0.safetensors")),
                std::string(bytes, 'x'));
    }
    if (manifest) WriteFile(JoinPath(dir, "manifest.pb"), "m");
    return dir;
  }

  std::string root_;
};

TEST(StagingNameTest, RecognisesStagingAndDiscardNamesOnly) {
  pid_t pid = 0;
  EXPECT_TRUE(IsStagingName(".step5.tmp-123-0", &pid));
  EXPECT_EQ(pid, 123);
  EXPECT_TRUE(IsStagingName("..step5.tmp-123-0.discard-77-4", &pid));
  EXPECT_EQ(pid, 123);  // the staging directory's writer
  for (const char* other :
       {"step5", ".step5", "step5.tmp-1-0", ".tmp-1-0", ".x.tmp-1", ".x.tmp-a-0", ".x.tmp-1-0-2",
        ".x.tmp--1-0", ".x.old-1-0", ".x.tmp-0-0", "..x.tmp-1-0.discard-2", ".x.discard-1-0"}) {
    EXPECT_FALSE(IsStagingName(other)) << other;
  }
}

TEST_F(StagingJournalTest, InspectTellsIncompleteFromCompleteFromForeignDirectories) {
  StagingLeftover incomplete = InspectStagingDir(Staging(".a.tmp-11-0", 2, 1000));
  EXPECT_EQ(incomplete.kind, LeftoverKind::kIncomplete);
  EXPECT_EQ(incomplete.bytes, 2000);
  EXPECT_EQ(incomplete.writer_pid, 11);
  StagingLeftover complete = InspectStagingDir(Staging(".b.tmp-11-0", 1, 10, /*manifest=*/true));
  EXPECT_EQ(complete.kind, LeftoverKind::kComplete);
  EXPECT_THAT(complete.detail, HasSubstr("complete checkpoint under a staging name"));
  const std::string foreign = Staging(".c.tmp-11-0", 1, 10);
  WriteFile(JoinPath(foreign, "notes.txt"), "mine");
  StagingLeftover refused = InspectStagingDir(foreign);
  EXPECT_EQ(refused.kind, LeftoverKind::kNotStaging);
  EXPECT_THAT(refused.detail, HasSubstr("holds notes.txt"));
  const std::string odd_data = Staging(".d.tmp-11-0", 0, 0);
  WriteFile(JoinPath(odd_data, "data/thesis.pdf"), "x");
  EXPECT_EQ(InspectStagingDir(odd_data).kind, LeftoverKind::kNotStaging);
  WriteFile(JoinPath(root_, ".e.tmp-11-0"), "a file");
  EXPECT_THAT(InspectStagingDir(JoinPath(root_, ".e.tmp-11-0")).detail,
              HasSubstr("is not a directory"));
  ASSERT_EQ(::symlink(foreign.c_str(), JoinPath(root_, ".f.tmp-11-0").c_str()), 0);
  EXPECT_THAT(InspectStagingDir(JoinPath(root_, ".f.tmp-11-0")).detail, HasSubstr("symbolic link"));

  absl::StatusOr<std::vector<StagingLeftover>> all = FindStagingLeftovers(root_);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 6u);
  // Only the incomplete one may be removed; the others are refused and stay.
  EXPECT_TRUE(RemoveStagingLeftover(incomplete).ok());
  EXPECT_FALSE(PathExists(incomplete.path));
  for (const StagingLeftover& kept : {complete, refused}) {
    StagingLeftover forced = kept;
    forced.kind = LeftoverKind::kIncomplete;  // a stale verdict is checked again
    EXPECT_EQ(RemoveStagingLeftover(forced).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(PathExists(kept.path));
  }
}

// A commit interrupted after writing manifest piece files (format 2) but before manifest.pb
// leaves an incomplete staging directory; a piece-file-like name of another form is foreign.
TEST_F(StagingJournalTest, ManifestPieceFilesBelongToAStagingDirectory) {
  const std::string interrupted = Staging(".a.tmp-11-0", 1, 100);
  WriteFile(JoinPath(interrupted, "manifest-pieces-00000.pb"), std::string(30, 'p'));
  WriteFile(JoinPath(interrupted, "manifest-pieces-00001.pb"), std::string(20, 'p'));
  WriteFile(JoinPath(interrupted, "manifest.pb.tmp"), "t");
  StagingLeftover leftover = InspectStagingDir(interrupted);
  EXPECT_EQ(leftover.kind, LeftoverKind::kIncomplete) << leftover.detail;
  EXPECT_EQ(leftover.bytes, 151);
  const std::string odd = Staging(".b.tmp-11-0", 1, 100);
  WriteFile(JoinPath(odd, "manifest-pieces-1.pb"), "p");
  EXPECT_EQ(InspectStagingDir(odd).kind, LeftoverKind::kNotStaging);
  EXPECT_TRUE(RemoveStagingLeftover(leftover).ok());
  EXPECT_FALSE(PathExists(interrupted));
}

TEST_F(StagingJournalTest, ANewCoordinatorRemovesTheStagingItsCrashedPredecessorRecorded) {
  const std::string state = JoinPath(root_, "state");
  const std::string final_path = JoinPath(root_, "ckpt");
  // The crashed coordinator was pid 4242: its record, its incomplete staging directory, one it
  // had begun discarding, and the complete staging directory of an interrupted commit.
  {
    auto journal = StagingJournal::Open(state);
    ASSERT_TRUE(journal.ok()) << journal.status();
  }
  WriteFile(JoinPath(state, "staging/op-aa-1"), absl::StrCat("4242\n", final_path, "\n"));
  WriteFile(JoinPath(state, "staging/op-aa-2.tmp"), "42");  // torn: its write never began
  const std::string left = Staging(".ckpt.tmp-4242-0", 3, 100);
  const std::string discarding = Staging("..ckpt.tmp-4242-1.discard-4242-2", 1, 100);
  const std::string committed = Staging(".ckpt.tmp-4242-3", 1, 100, /*manifest=*/true);
  // Another writer's staging directory of the same checkpoint name stays.
  const std::string other = Staging(".ckpt.tmp-777-0", 1, 100);

  auto journal = StagingJournal::Open(state);
  ASSERT_TRUE(journal.ok()) << journal.status();
  std::vector<StagingLeftover> found = (*journal)->Recover();
  ASSERT_EQ(found.size(), 3u);
  int removed = 0;
  for (const StagingLeftover& l : found) {
    removed += l.removed;
    EXPECT_EQ(l.removed, l.path != committed) << l.path << ": " << l.detail;
  }
  EXPECT_EQ(removed, 2);
  EXPECT_FALSE(PathExists(left));
  EXPECT_FALSE(PathExists(discarding));
  EXPECT_TRUE(PathExists(committed));
  EXPECT_TRUE(PathExists(other));
  EXPECT_FALSE(PathExists(JoinPath(state, "staging/op-aa-1")));
  EXPECT_FALSE(PathExists(JoinPath(state, "staging/op-aa-2.tmp")));
  EXPECT_TRUE((*journal)->Recover().empty());
}

TEST_F(StagingJournalTest, RecordsLiveFromBeginToEndAndOneCoordinatorHoldsTheStateDir) {
  const std::string state = JoinPath(root_, "state");
  auto journal = StagingJournal::Open(state);
  ASSERT_TRUE(journal.ok()) << journal.status();
  ASSERT_TRUE((*journal)->Begin("op-bb-7", JoinPath(root_, "x")).ok());
  EXPECT_TRUE(PathExists(JoinPath(state, "staging/op-bb-7")));
  EXPECT_EQ((*journal)->Begin("../escape", "/x").code(), absl::StatusCode::kInvalidArgument);
  auto second = StagingJournal::Open(state);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("pid ", ::getpid())));
  ASSERT_TRUE((*journal)->End("op-bb-7").ok());
  EXPECT_FALSE(PathExists(JoinPath(state, "staging/op-bb-7")));
  EXPECT_TRUE((*journal)->End("op-bb-7").ok());
}

}  // namespace
}  // namespace ckpt::coordinator
