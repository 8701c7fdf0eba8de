// RemoveTree removes by file descriptor: a directory swapped for a symlink (or for another
// directory) between the listing and the removal never redirects it outside the tree, symlinks
// are removed as links, and errors name the path. The swaps are made deterministically by the
// testonly hook that runs between a directory's listing and the removal of its entries. And
// ListDirNoFollow, which lists without following a symlink.
#include "storage/file_util.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/remove_tree_test_hook.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr int kFiles = 50;

void WriteSmallFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

std::string FileName(int i) { return absl::StrCat("r0_", i, ".safetensors"); }

// `dir` (made) holding kFiles files named FileName(i), each holding `contents`.
void MakeFilledDir(const std::string& dir, const std::string& contents) {
  ASSERT_TRUE(MakeDir(dir).ok()) << dir;
  for (int i = 0; i < kFiles; ++i) {
    WriteSmallFile(JoinPath(dir, FileName(i)), contents);
  }
}

int CountFiles(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDir(dir);
  return names.ok() ? static_cast<int>(names->size()) : -1;
}

void Symlink(const std::string& target, const std::string& link) {
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link;
}

// Replaces the directory `dir` by a symlink to `target`, moving `dir` to `moved_to`: what an
// attacker who can write in `dir`'s parent does.
void SwapForSymlink(const std::string& dir, const std::string& target,
                    const std::string& moved_to) {
  ASSERT_EQ(::rename(dir.c_str(), moved_to.c_str()), 0) << dir;
  Symlink(target, dir);
}

// root/staging/data/{files} and root/victim/{the same names}.
struct SwapFixture {
  std::string root, staging, data, victim, moved;
  explicit SwapFixture(const std::string& name) : root(TestDir(name)) {
    staging = JoinPath(root, ".step5.tmp-1-0.discard-1-1");
    data = JoinPath(staging, "data");
    victim = JoinPath(root, "victim");
    moved = JoinPath(root, "moved");
    EXPECT_TRUE(MakeDir(staging).ok());
    MakeFilledDir(data, "staging");
    MakeFilledDir(victim, "victim");
  }
};

TEST(RemoveTreeTest, DirectorySwappedForSymlinkAfterItsListingLeavesTheTargetsFilesAlone) {
  SwapFixture f("remove_tree_swap_after_listing");
  bool swapped = false;
  ScopedRemoveTreeHook hook([&](const std::string& dir) {
    if (dir != f.data || swapped) return;
    swapped = true;
    SwapForSymlink(f.data, f.victim, f.moved);
  });
  absl::Status s = RemoveTree(f.staging);
  ASSERT_TRUE(swapped);
  EXPECT_EQ(CountFiles(f.victim), kFiles) << s;
  for (int i = 0; i < kFiles; ++i) {
    absl::StatusOr<std::string> text = ReadWholeFile(JoinPath(f.victim, FileName(i)), 100);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, "victim");
  }
  // The swap is reported, naming the directory; what was removed was the staging's own files.
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(f.data));
  EXPECT_THAT(s.message(), HasSubstr("replaced while being removed"));
  EXPECT_EQ(CountFiles(f.moved), 0);
}

TEST(RemoveTreeTest, DirectorySwappedForSymlinkAfterItsParentsListingIsRefused) {
  SwapFixture f("remove_tree_swap_after_parent_listing");
  bool swapped = false;
  ScopedRemoveTreeHook hook([&](const std::string& dir) {
    if (dir != f.staging || swapped) return;
    swapped = true;
    SwapForSymlink(f.data, f.victim, f.moved);
  });
  absl::Status s = RemoveTree(f.staging);
  ASSERT_TRUE(swapped);
  EXPECT_EQ(CountFiles(f.victim), kFiles) << s;
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(f.data));
  // A second pass finds the symlink in the listing and removes only the link.
  ASSERT_TRUE(RemoveTree(f.staging).ok());
  EXPECT_FALSE(PathExists(f.staging));
  EXPECT_EQ(CountFiles(f.victim), kFiles);
}

TEST(RemoveTreeTest, DirectorySwappedForAnotherDirectoryIsRefusedByItsInode) {
  SwapFixture f("remove_tree_swap_for_directory");
  bool swapped = false;
  ScopedRemoveTreeHook hook([&](const std::string& dir) {
    if (dir != f.staging || swapped) return;
    swapped = true;
    ASSERT_EQ(::rename(f.data.c_str(), f.moved.c_str()), 0);
    ASSERT_EQ(::rename(f.victim.c_str(), f.data.c_str()), 0);
  });
  absl::Status s = RemoveTree(f.staging);
  ASSERT_TRUE(swapped);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(f.data));
  EXPECT_EQ(CountFiles(f.data), kFiles);  // the swapped-in directory, untouched
}

TEST(RemoveTreeTest, SymlinksInTheTreeAreRemovedAsLinksAndTheirTargetsStay) {
  const std::string root = TestDir("remove_tree_symlinks");
  const std::string outside = JoinPath(root, "outside");
  MakeFilledDir(outside, "keep");
  const std::string tree = JoinPath(root, "tree");
  MakeFilledDir(tree, "go");
  ASSERT_TRUE(MakeDir(JoinPath(tree, "sub")).ok());
  Symlink(outside, JoinPath(tree, "to_dir"));
  Symlink(JoinPath(outside, FileName(0)), JoinPath(tree, "sub/to_file"));
  Symlink("/nonexistent/dangling", JoinPath(tree, "dangling"));
  ASSERT_TRUE(RemoveTree(tree).ok());
  EXPECT_FALSE(PathExists(tree));
  EXPECT_EQ(CountFiles(outside), kFiles);
}

TEST(RemoveTreeTest, TopThatIsASymlinkRemovesOnlyTheLinkEvenWithATrailingSlash) {
  const std::string root = TestDir("remove_tree_top_symlink");
  const std::string target = JoinPath(root, "target");
  MakeFilledDir(target, "keep");
  for (const std::string suffix : {"", "/"}) {
    const std::string link = JoinPath(root, "link");
    Symlink(target, link);
    ASSERT_TRUE(RemoveTree(link + suffix).ok()) << suffix;
    EXPECT_FALSE(PathExists(link));
    EXPECT_EQ(CountFiles(target), kFiles) << "suffix \"" << suffix << "\"";
  }
}

TEST(RemoveTreeTest, RemovesFilesDeepTreesAndMissingPathsButRefusesMoreThan256Levels) {
  const std::string root = TestDir("remove_tree_deep");
  const std::string file = JoinPath(root, "file");
  WriteSmallFile(file, "x");
  ASSERT_TRUE(RemoveTree(file).ok());
  EXPECT_FALSE(PathExists(file));
  EXPECT_TRUE(RemoveTree(JoinPath(root, "missing")).ok());
  EXPECT_TRUE(RemoveTree(JoinPath(root, "missing/below")).ok());

  auto make_deep = [&](const std::string& top, int levels) {
    std::string p = top;
    for (int i = 0; i < levels; ++i) {
      EXPECT_TRUE(MakeDir(p).ok()) << p;
      WriteSmallFile(JoinPath(p, "f"), "x");
      p = JoinPath(p, "d");
    }
    return p;
  };
  const std::string deep = JoinPath(root, "deep");
  make_deep(deep, 200);
  ASSERT_TRUE(RemoveTree(deep).ok());
  EXPECT_FALSE(PathExists(deep));

  const std::string too_deep = JoinPath(root, "too_deep");
  make_deep(too_deep, 300);
  absl::Status s = RemoveTree(too_deep);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(too_deep + "/d/d/"));
  EXPECT_THAT(s.message(), HasSubstr("more than 256 directory levels deep"));
  std::string middle = too_deep;
  for (int i = 0; i < 150; ++i) middle = JoinPath(middle, "d");
  ASSERT_TRUE(RemoveTree(middle).ok());  // then the rest, each part within the limit
  ASSERT_TRUE(RemoveTree(too_deep).ok());
}

TEST(RemoveTreeTest, EntriesRemovedByOthersMeanwhileAreNoError) {
  SwapFixture f("remove_tree_vanishing");
  ScopedRemoveTreeHook hook([&](const std::string& dir) {
    if (dir == f.data) {
      ASSERT_EQ(::unlink(JoinPath(f.data, FileName(3)).c_str()), 0);
    }
  });
  ASSERT_TRUE(RemoveTree(f.staging).ok());
  EXPECT_FALSE(PathExists(f.staging));
}

// RemoveTree(path), as the user "nobody" in a child process when this test runs as root
// (whom permissions do not stop); nullopt when "nobody" cannot reach `path`.
std::optional<absl::Status> RemoveTreeUnprivileged(const std::string& path) {
  if (::geteuid() != 0) return RemoveTree(path);
  int fds[2];
  if (::pipe(fds) != 0) return absl::InternalError("pipe");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    constexpr uid_t kNobody = 65534;
    if (::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0 ||
        ::access(ParentDir(path).c_str(), X_OK) != 0) {
      _exit(100);
    }
    const absl::Status s = RemoveTree(path);
    const std::string message(s.message());
    (void)!::write(fds[1], message.data(), message.size());
    _exit(static_cast<int>(s.code()));
  }
  ::close(fds[1]);
  std::string message;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) message.append(buf, n);
  ::close(fds[0]);
  int wstatus = 0;
  if (pid < 0 || ::waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) {
    return absl::InternalError("child");
  }
  if (WEXITSTATUS(wstatus) == 100) return std::nullopt;
  return absl::Status(static_cast<absl::StatusCode>(WEXITSTATUS(wstatus)), message);
}

TEST(RemoveTreeTest, ErrorsNameThePath) {
  const std::string root = TestDir("remove_tree_errors");
  const std::string file = JoinPath(root, "file");
  WriteSmallFile(file, "x");
  absl::Status s = RemoveTree(JoinPath(file, "below"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(file));
  // A path ending in ".." names no entry of its parent (kept inside this test's directory: a
  // path-based removal would remove all of root).
  const std::string sub = JoinPath(root, "sub");
  ASSERT_TRUE(MakeDir(sub).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(RemoveTree(JoinPath(sub, ".."))));
  EXPECT_TRUE(PathExists(sub));
}

TEST(RemoveTreeTest, PermissionDeniedIsReportedWithThePathAndRemovesNothing) {
  const std::string root = TestDir("remove_tree_permissions");
  ASSERT_EQ(::chmod(root.c_str(), 0777), 0);
  const std::string locked = JoinPath(root, "locked");
  MakeFilledDir(locked, "x");
  ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
  const std::optional<absl::Status> s = RemoveTreeUnprivileged(locked);
  ASSERT_EQ(::chmod(locked.c_str(), 0755), 0);
  if (!s.has_value()) GTEST_SKIP() << "the user nobody cannot reach " << root;
  EXPECT_TRUE(absl::IsPermissionDenied(*s)) << *s;
  EXPECT_THAT(s->message(), HasSubstr(JoinPath(locked, FileName(0))));
  EXPECT_EQ(CountFiles(locked), kFiles);
}

TEST(ListDirNoFollowTest, ListsEntriesAsLstatSeesThemAndRefusesASymlinkedDirectory) {
  const std::string root = TestDir("list_dir_no_follow");
  const std::string dir = JoinPath(root, "dir");
  ASSERT_TRUE(MakeDir(dir).ok());
  WriteSmallFile(JoinPath(dir, "b_file"), "12345");
  ASSERT_TRUE(MakeDir(JoinPath(dir, "a_dir")).ok());
  Symlink(JoinPath(dir, "b_file"), JoinPath(dir, "c_link"));
  absl::StatusOr<DirListing> listing = ListDirNoFollow(dir);
  ASSERT_TRUE(listing.ok()) << listing.status();
  struct stat st;
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(listing->self.ino, st.st_ino);
  EXPECT_EQ(listing->self.dev, st.st_dev);
  ASSERT_EQ(listing->entries.size(), 3u);
  EXPECT_EQ(listing->entries[0].name, "a_dir");
  EXPECT_TRUE(S_ISDIR(listing->entries[0].mode));
  EXPECT_EQ(listing->entries[1].name, "b_file");
  EXPECT_TRUE(S_ISREG(listing->entries[1].mode));
  EXPECT_EQ(listing->entries[1].size, 5);
  EXPECT_EQ(listing->entries[2].name, "c_link");
  EXPECT_TRUE(S_ISLNK(listing->entries[2].mode));

  const std::string link = JoinPath(root, "link");
  Symlink(dir, link);
  for (const std::string suffix : {"", "/"}) {
    absl::StatusOr<DirListing> through_link = ListDirNoFollow(link + suffix);
    EXPECT_FALSE(through_link.ok()) << "suffix \"" << suffix << "\"";
    EXPECT_THAT(through_link.status().message(), HasSubstr(link));
  }
}

}  // namespace
}  // namespace ckpt
