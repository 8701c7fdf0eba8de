// The worker refuses hostile values of its host pool flags (--host_pool_bytes,
// --host_pool_prefault) and its --communicator_cache_entries at start with a message naming the
// flag, and exits without crashing.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Runs the worker with `flags` (it never gets as far as its coordinator, which is not there).
CommandResult Worker(const std::string& flags) {
  return RunBinary(Runfile("worker/ckpt_worker"),
                   "--coordinator=127.0.0.1:1 --local_rank=0 " + flags);
}

// Exited with a usage error (absl's flag parsing: 1; the worker's own checks: 2), not a signal.
void ExpectRefused(const CommandResult& r, const std::string& flag, const std::string& value) {
  EXPECT_TRUE(r.code == 1 || r.code == 2) << "exit " << r.code << "\n" << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr(flag), HasSubstr(value))) << r.err;
}

TEST(WorkerFlagsTest, ANegativeHostPoolSizeIsRefusedNamingTheFlag) {
  const CommandResult r = Worker("--host_pool_bytes=-5");
  ExpectRefused(r, "--host_pool_bytes", "-5");
  EXPECT_EQ(r.code, 2);
}

TEST(WorkerFlagsTest, AHostPoolLargerThanTheMachinesMemoryIsRefusedBeforeAnythingIsMapped) {
  for (const std::string value : {"9223372036854775807", "1125899906842624"}) {
    SCOPED_TRACE(value);
    const CommandResult r = Worker("--host_pool_prefault --host_pool_bytes=" + value);
    ExpectRefused(r, "--host_pool_bytes", value);
    EXPECT_THAT(r.err, HasSubstr("exceeds this machine's memory"));
    EXPECT_EQ(r.code, 2);
  }
}

TEST(WorkerFlagsTest, NonNumericOrOverflowingHostPoolSizesAreRefusedNamingTheFlag) {
  for (const std::string value : {"lots", "1e12", "8GiB", "99999999999999999999", ""}) {
    SCOPED_TRACE(value);
    ExpectRefused(Worker("--host_pool_bytes=" + value), "host_pool_bytes", "");
  }
}

TEST(WorkerFlagsTest, ANegativeOrNonNumericCommunicatorCacheSizeIsRefusedNamingTheFlag) {
  const CommandResult negative = Worker("--communicator_cache_entries=-1");
  ExpectRefused(negative, "--communicator_cache_entries", "-1");
  EXPECT_EQ(negative.code, 2);
  for (const std::string value : {"many", "99999999999", ""}) {
    SCOPED_TRACE(value);
    ExpectRefused(Worker("--communicator_cache_entries=" + value), "communicator_cache_entries",
                  "");
  }
}

TEST(WorkerFlagsTest, ANonBooleanPrefaultIsRefusedNamingTheFlag) {
  ExpectRefused(Worker("--host_pool_prefault=maybe"), "host_pool_prefault", "maybe");
}

}  // namespace
}  // namespace ckpt::testing
