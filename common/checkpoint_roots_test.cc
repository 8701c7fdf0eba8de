#include "common/checkpoint_roots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class CheckpointRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    base_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/roots-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::system(("rm -rf " + base_).c_str());
    ASSERT_EQ(mkdir(base_.c_str(), 0700), 0);
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(mkdir(root_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0700), 0);
    auto roots = CheckpointRoots::Create({root_});
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = *roots;
  }

  std::string base_, root_, outside_;
  std::optional<CheckpointRoots> roots_;
};

TEST_F(CheckpointRootsTest, AcceptsANewPathUnderARootAndReturnsItCanonical) {
  auto resolved = roots_->Resolve(root_ + "//runs/./step1/", "save path");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_ + "/runs/step1");
}

TEST_F(CheckpointRootsTest, RefusesARelativePathNamingTheRoots) {
  auto resolved = roots_->Resolve("step1", "save path");
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resolved.status().message(),
              AllOf(HasSubstr("'step1' is relative"), HasSubstr(root_)));
}

TEST_F(CheckpointRootsTest, RefusesDotDotEvenWhenItStaysInsideTheRoot) {
  ASSERT_EQ(mkdir((root_ + "/a").c_str(), 0700), 0);
  for (const std::string& path : {root_ + "/a/../b", root_ + "/../outside/x"}) {
    auto resolved = roots_->Resolve(path, "load path");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(resolved.status().message(), AllOf(HasSubstr("'..'"), HasSubstr(path)));
  }
}

TEST_F(CheckpointRootsTest, RefusesAPathOutsideEveryRootNamingThePathAndTheRoots) {
  for (const std::string& path : {outside_ + "/ckpt", std::string("/etc/passwd"), root_}) {
    auto resolved = roots_->Resolve(path, "reshard destination");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(resolved.status().message(),
                AllOf(HasSubstr("reshard destination '" + path + "'"), HasSubstr(root_)));
  }
}

TEST_F(CheckpointRootsTest, RefusesASymbolicLinkInsideTheRootThatLeadsOut) {
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/escape").c_str()), 0);
  for (const std::string& path : {root_ + "/escape", root_ + "/escape/new/ckpt"}) {
    auto resolved = roots_->Resolve(path, "save path");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(resolved.status().message(),
                AllOf(HasSubstr("resolves to '" + outside_), HasSubstr("symbolic link")));
  }
}

TEST_F(CheckpointRootsTest, RefusesASymbolicLinkToAMissingTarget) {
  ASSERT_EQ(symlink((outside_ + "/not-yet").c_str(), (root_ + "/dangling").c_str()), 0);
  for (const std::string& path : {root_ + "/dangling", root_ + "/dangling/ckpt"}) {
    auto resolved = roots_->Resolve(path, "save path");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(resolved.status().message(), HasSubstr("missing target"));
  }
}

TEST_F(CheckpointRootsTest, AcceptsASymbolicLinkThatStaysInsideAndReturnsItsTarget) {
  ASSERT_EQ(mkdir((root_ + "/real").c_str(), 0700), 0);
  ASSERT_EQ(symlink((root_ + "/real").c_str(), (root_ + "/alias").c_str()), 0);
  auto resolved = roots_->Resolve(root_ + "/alias/ckpt", "load path");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_ + "/real/ckpt");
}

TEST_F(CheckpointRootsTest, AcceptsAPathUnderAnyOfSeveralRootsGivenThroughASymlink) {
  ASSERT_EQ(symlink(outside_.c_str(), (base_ + "/outside-link").c_str()), 0);
  auto roots = CheckpointRoots::Create({root_, base_ + "/outside-link"});
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(roots->roots()[1], outside_);
  auto resolved = roots->Resolve(base_ + "/outside-link/ckpt", "load path");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, outside_ + "/ckpt");
}

TEST_F(CheckpointRootsTest, ARootMustBeAnExistingAbsoluteDirectory) {
  std::ofstream(base_ + "/file") << "x";
  for (const std::string& root : {std::string("relative"), base_ + "/missing", base_ + "/file"}) {
    auto roots = CheckpointRoots::Create({root});
    EXPECT_EQ(roots.status().code(), absl::StatusCode::kInvalidArgument) << root;
    EXPECT_THAT(roots.status().message(), HasSubstr(root));
  }
  EXPECT_THAT(CheckpointRoots::Create({}).status().message(), HasSubstr("--checkpoint_root"));
}

TEST_F(CheckpointRootsTest, AcceptsAUrlStrictlyUnderAUrlRootAndReturnsItWithoutTrailingSlash) {
  auto roots = CheckpointRoots::Create({root_, "s3://bucket/ckpts/"});
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(roots->roots()[1], "s3://bucket/ckpts");
  auto resolved = roots->Resolve("s3://bucket/ckpts/run/step1/", "save path");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, "s3://bucket/ckpts/run/step1");
  auto bucket_root = CheckpointRoots::Create({"s3://bucket"});
  ASSERT_TRUE(bucket_root.ok()) << bucket_root.status();
  resolved = bucket_root->Resolve("s3://bucket/step1", "load path");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, "s3://bucket/step1");
}

TEST_F(CheckpointRootsTest, RefusesAUrlNotStrictlyUnderAUrlRootOfTheSameSchemeAndBucket) {
  auto roots = CheckpointRoots::Create({root_, "s3://bucket/ckpts"});
  ASSERT_TRUE(roots.ok()) << roots.status();
  for (const std::string& url :
       {std::string("s3://bucket/ckpts"), std::string("s3://bucket/ckpts/"),
        std::string("s3://bucket/ckptsX/a"), std::string("s3://bucketX/ckpts/a"),
        std::string("s3://other/ckpts/a"), std::string("gs://bucket/ckpts/a"),
        std::string("s3://bucket/a")}) {
    auto resolved = roots->Resolve(url, "save path");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied) << url;
    EXPECT_THAT(resolved.status().message(),
                AllOf(HasSubstr("save path '" + url + "'"), HasSubstr("s3://bucket/ckpts"),
                      HasSubstr(root_)));
  }
}

TEST_F(CheckpointRootsTest, RefusesAUrlWithAnEmptyDotOrDotDotComponent) {
  auto roots = CheckpointRoots::Create({"s3://bucket/ckpts"});
  ASSERT_TRUE(roots.ok()) << roots.status();
  for (const std::string& url :
       {std::string("s3://bucket/ckpts//a"), std::string("s3://bucket/ckpts/./a"),
        std::string("s3://bucket/ckpts/../x"), std::string("s3://bucket/ckpts/a/.."),
        std::string("s3://bucket/ckpts/a//"), std::string("s3:///bucket/ckpts/a"),
        std::string("s3://bucket/ckpts/a\\b"), std::string("S3://bucket/ckpts/a")}) {
    auto resolved = roots->Resolve(url, "load path");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_THAT(resolved.status().message(), HasSubstr("load path '" + url + "'"));
  }
}

TEST_F(CheckpointRootsTest, APathNeverMatchesAUrlRootNorAUrlADirectoryRoot) {
  auto url_only = CheckpointRoots::Create({"s3://bucket"});
  ASSERT_TRUE(url_only.ok()) << url_only.status();
  for (const std::string& path : {std::string("/bucket/x"), root_ + "/x"}) {
    auto resolved = url_only->Resolve(path, "save path");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(resolved.status().message(), HasSubstr("s3://bucket"));
  }
  auto everything = CheckpointRoots::Create({"/"});
  ASSERT_TRUE(everything.ok()) << everything.status();
  auto resolved = everything->Resolve("s3://bucket/x", "save path");
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(resolved.status().message(), HasSubstr("'s3://bucket/x' is outside"));
}

TEST_F(CheckpointRootsTest, AUrlRootIsNotLookedUpOnTheFilesystemButMustBeValid) {
  auto good = CheckpointRoots::Create({"s3://no-such-dir-here/p"});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->Describe(), "s3://no-such-dir-here/p");
  for (const std::string& root : {std::string("s3://"), std::string("s3:///p"),
                                  std::string("s3://bucket//p"), std::string("s3://bucket/./p"),
                                  std::string("s3://bucket/../p"), std::string("S3://bucket")}) {
    auto roots = CheckpointRoots::Create({root});
    EXPECT_EQ(roots.status().code(), absl::StatusCode::kInvalidArgument) << root;
    EXPECT_THAT(roots.status().message(), HasSubstr("checkpoint root '" + root + "'"));
  }
}

}  // namespace
}  // namespace ckpt
