#include "common/daemon.h"

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Debian's Abseil is built in debug mode, where absl::Mutex records every lock order and aborts
// the process on a potential cycle; a daemon turns that off and must survive lock orders that
// only look inverted (gRPC's locks are absl mutexes).
TEST(DaemonTest, LocksTakenInBothOrdersDoNotAbortOnceDeadlockDetectionIsOff) {
  TurnOffMutexDeadlockDetection();
  absl::Mutex first, second;
  {
    absl::MutexLock a(&first);
    absl::MutexLock b(&second);
  }
  {
    absl::MutexLock b(&second);
    absl::MutexLock a(&first);
  }
  SUCCEED();
}

TEST(DaemonTest, RepeatedFlagValuesKeepsEveryOccurrenceInOrder) {
  const char* argv[] = {"prog", "--root=/a", "--other", "x",        "--root",
                        "/b",   "-root=/c",  "--",      "--root=/d"};
  EXPECT_EQ(RepeatedFlagValues(9, const_cast<char**>(argv), "root"),
            (std::vector<std::string>{"/a", "/b", "/c"}));
}

}  // namespace
}  // namespace ckpt
