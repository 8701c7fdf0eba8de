// The filesystem store against the checkpoint store conformance suite, plus what only a
// filesystem has: plain paths and file:// URLs, and a refusal to delete what is not a checkpoint.
#include "storage/file_store.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_store_conformance.h"
#include "storage/file_util.h"
#include "storage/test_dir.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(File, CheckpointStoreConformanceTest,
                         ::testing::Values(FileStoreBackend()), StoreBackendName);

TEST(FileStoreTest, PlainPathsAndFileUrlsNameTheSameDirectory) {
  EXPECT_EQ(*FileStorePath("/ckpts/a"), "/ckpts/a");
  EXPECT_EQ(*FileStorePath("relative/a"), "relative/a");
  EXPECT_EQ(*FileStorePath("file:///ckpts/a"), "/ckpts/a");
  EXPECT_EQ(FileStorePath("file://host/ckpts/a").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FileStorePath("s3://bucket/a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FileStorePath("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileStoreTest, TheRegistryServesPlainPathsAndFileUrlsAndNamesUnknownSchemes) {
  absl::StatusOr<CheckpointStore*> plain = StoreForUrl("/ckpts/a");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->scheme(), "file");
  EXPECT_EQ(*StoreForUrl("file:///ckpts/a"), *plain);
  absl::StatusOr<CheckpointStore*> unknown = StoreForUrl("gopher://x/y");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("gopher://x/y"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("registered: file"));
}

// A plain path that holds "://" further on is a path (LocationScheme, common/store_url.h), not a
// URL of a scheme "/ckpts/s3": the registry serves it with the file store.
TEST(FileStoreTest, APlainPathHoldingSchemeSeparatorIsTheFileStores) {
  for (const std::string path : {"/ckpts/s3://bucket/a", "runs/s3://bucket/a", "./x://y"}) {
    absl::StatusOr<CheckpointStore*> store = StoreForUrl(path);
    ASSERT_TRUE(store.ok()) << path << ": " << store.status();
    EXPECT_EQ((*store)->scheme(), "file") << path;
    absl::StatusOr<std::string> local = FileStorePath(path);
    ASSERT_TRUE(local.ok()) << path << ": " << local.status();
    EXPECT_EQ(*local, path);
  }
}

TEST(FileStoreTest, DeleteRefusesADirectoryThatIsNotACheckpointAndKeepsIt) {
  const std::string dir = JoinPath(TestDir("file-store-delete-other"), "notes");
  ASSERT_TRUE(MakeDir(dir).ok());
  ASSERT_TRUE(WriteFileDurably(JoinPath(dir, "todo.txt"), "keep me").ok());
  CheckpointStore* store = *StoreForUrl(dir);
  absl::Status deleted = store->Delete(dir, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition) << deleted;
  EXPECT_TRUE(PathExists(JoinPath(dir, "todo.txt")));
}

}  // namespace
}  // namespace ckpt
