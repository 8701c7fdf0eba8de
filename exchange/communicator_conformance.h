// The Communicator conformance suite: gtest value-parameterised tests of every Communicator
// operation (broadcast, all-gather(-v), gather-v, scatter-v, all-to-all-v, its buffer and
// indexed forms, send/recv, barrier), with zero-size and uneven contributions, argument errors,
// and the deadline/abort promises of exchange/communicator.h (a stalled peer becomes
// DeadlineExceeded naming the operation within the deadline, and the communicator is broken
// afterwards). Each case runs N ranks as threads of this process over real loopback.
//
// A backend registers the suite in its own test target:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
//                            ::testing::ValuesIn(ConformanceCases(GlooBackend(), {1, 2, 3, 4})),
//                            ConformanceCaseName);
//
// and links :communicator_conformance (alwayslink, so the TEST_Ps register).
#ifndef CKPT_EXCHANGE_COMMUNICATOR_CONFORMANCE_H_
#define CKPT_EXCHANGE_COMMUNICATOR_CONFORMANCE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "exchange/communicator.h"
#include "exchange/thread_group.h"
#include "gtest/gtest.h"

namespace ckpt {

// Buffers in a backend's memory (host memory for Gloo, device memory for NCCL), filled from and
// read back into host bytes by the tests. Called from the rank threads.
class ConformanceMemory {
 public:
  virtual ~ConformanceMemory() = default;
  // A buffer of `bytes` bytes (bytes may be 0; the result may then be null).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* buffer) = 0;
  virtual absl::Status CopyIn(void* buffer, const std::string& host) = 0;
  virtual absl::StatusOr<std::string> CopyOut(const void* buffer, size_t bytes) = 0;
};

// Host memory (new[]/memcpy).
std::shared_ptr<ConformanceMemory> HostConformanceMemory();

// One backend under test.
struct ConformanceBackend {
  std::string name;
  // The maker of a group named `group_name` (unique per test case).
  std::function<CommunicatorMaker(const std::string& group_name)> maker;
  std::shared_ptr<ConformanceMemory> memory;
  // Whether a peer that left is named in the error (NCCL collectives may only say "a peer").
  bool names_stalled_peer = true;
  // Why the backend cannot run on this machine ("" when it can); the suite then skips with it.
  std::function<std::string()> unavailable_reason = [] { return std::string(); };
};

// One case: a backend at N ranks.
struct ConformanceCase {
  ConformanceBackend backend;
  int ranks = 1;
};

// Gloo over 127.0.0.1 with host memory.
ConformanceBackend GlooBackend();

// The cases of `backend` at each group size in `ranks`.
std::vector<ConformanceCase> ConformanceCases(const ConformanceBackend& backend,
                                              const std::vector<int>& ranks);

// "<backend>_N<ranks>", for INSTANTIATE_TEST_SUITE_P.
std::string ConformanceCaseName(const ::testing::TestParamInfo<ConformanceCase>& info);

// The suite; its TEST_Ps are in communicator_conformance.cc.
class CommunicatorConformanceTest : public ::testing::TestWithParam<ConformanceCase> {
 protected:
  void SetUp() override;
  int N() const { return GetParam().ranks; }
  ConformanceMemory& Memory() const { return *GetParam().backend.memory; }
  // Runs body on N rank threads, each with a communicator of a group unique to this test.
  std::vector<absl::Status> RunRanks(
      const std::function<absl::Status(int rank, Communicator& comm)>& body) const;
};

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_COMMUNICATOR_CONFORMANCE_H_
