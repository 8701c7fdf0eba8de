// The checkpoint store conformance suite: gtest value-parameterised tests of the promises of
// storage/checkpoint_store.h that every store must keep — nothing visible before the commit,
// abort and a dropped write leave nothing, an existing checkpoint is refused unless overwriting
// and then stays readable until the new one commits, reads are byte-exact and bounded, commits
// refuse a manifest that disagrees with what was written, names outside data/ are refused,
// delete removes; a write joined from other processes (JoinWrite) adds objects that count
// only once adopted, cannot commit, and is removed whole by the beginning write's abort; a URL
// that is not a staging URL is refused. The checkpoints it writes are real ones (WriteCheckpoint on
// a local directory, then copied object by object into the store under test).
//
// A store registers the suite in its own test target:
//
//   INSTANTIATE_TEST_SUITE_P(File, CheckpointStoreConformanceTest,
//                            ::testing::Values(FileStoreBackend()), StoreBackendName);
//
// and links :checkpoint_store_conformance (alwayslink, so the TEST_Ps register).
#ifndef CKPT_STORAGE_CHECKPOINT_STORE_CONFORMANCE_H_
#define CKPT_STORAGE_CHECKPOINT_STORE_CONFORMANCE_H_

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

// One store under test.
struct StoreBackend {
  std::string name;
  // The store (set up once per test; it may start a server and keep it for the process).
  std::function<absl::StatusOr<CheckpointStore*>()> store;
  // A URL prefix no other test uses, under which the test writes its checkpoints
  // (`prefix + "/a"`, ...). `test` is the test's name.
  std::function<std::string(const std::string& test)> prefix;
  // Everything the store holds for the checkpoint at `url` besides a committed checkpoint's
  // manifest and data files (staging areas, objects of aborted writes), listed by the store's
  // own means (a directory listing; an object listing with the client).
  std::function<std::vector<std::string>(const std::string& url)> leftovers;
  // Why the store cannot run on this machine ("" when it can); every test then fails with it
  // (a store the project ships must be tested, never skipped).
  std::function<std::string()> unavailable_reason = [] { return std::string(); };
};

// The filesystem store, under $TEST_TMPDIR.
StoreBackend FileStoreBackend();

// gtest prints a backend by its name.
void PrintTo(const StoreBackend& backend, std::ostream* os);

std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info);

// A checkpoint as the objects a store holds: its manifest and each data file's bytes.
struct StoreSource {
  pb::Manifest manifest;
  std::map<std::string, std::string> files;
};

// The suite's fixture: the store under test and the test's URL prefix.
class CheckpointStoreConformanceTest : public ::testing::TestWithParam<StoreBackend> {
 protected:
  void SetUp() override;
  // BeginWrite at `url` (a test failure and null on error).
  std::unique_ptr<CheckpointWrite> Begin(const std::string& url, bool overwrite = false);
  // Writes and commits `source` at `url`.
  void Commit(const std::string& url, const StoreSource& source, bool overwrite = false);
  // The checkpoint at `url` has `source`'s manifest and data bytes.
  void ExpectHolds(const std::string& url, const StoreSource& source);
  // Nothing is committed at `url` (Open is NotFound).
  void ExpectNothingAt(const std::string& url);
  // JoinWrite of `staging_url` (a test failure and null on error).
  std::unique_ptr<CheckpointWrite> Join(const std::string& staging_url);
  // The store holds nothing for `url` but a committed checkpoint (StoreBackend::leftovers).
  void ExpectNoLeftovers(const std::string& url);

  CheckpointStore* store_ = nullptr;
  std::string prefix_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKPOINT_STORE_CONFORMANCE_H_
