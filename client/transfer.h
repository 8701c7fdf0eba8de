// Live transfer between jobs (issue 17), the client side: a source job (a trainer) publishes
// its state under a name and a version, and a destination job with another layout, world size
// and host set receives it straight into its tensors.
//
//   // trainer, every K steps (collective over its ranks):
//   auto published = client->Publish("policy", *state, {.version = step});
//   ... training continues at once (snapshot semantics) ...
//   // inference job, when it wants fresh weights (collective over its ranks):
//   absl::StatusOr<ReceivedVersion> got = client->Receive("policy", *state, {});  // newest
//
// Publish is a memory save to xfer://<name>@<version>: each source worker keeps its rank's
// files in its memory tier (no replicas by default), and Publish returns once the bytes left
// the trainer's memory. Receive reads them from those workers (serving participants of the
// receive's exchange) over the data plane, in any layout. Receive is all-or-nothing: it
// receives into shadow tensors in shared memory (one extra copy of this rank's state, kept
// between receives of the same name) and copies them into `state` only once the whole transfer
// ended OK on every rank; a failed receive leaves `state` on the version it held before.
#ifndef CKPT_CLIENT_TRANSFER_H_
#define CKPT_CLIENT_TRANSFER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ckpt::client {

class SaveHandle;

// Options of Publish.
struct PublishOptions {
  // The version (e.g. the training step); it must be newer than every version of the name
  // published so far (FailedPrecondition naming the newest otherwise). 0: one more than this
  // client's previous publish of the name (1 at first; pass it explicitly after a restart).
  // InvalidArgument naming the name and version when negative, or 0 after version 2^63-1.
  int64_t version = 0;
  std::map<std::string, std::string> metadata;
  absl::Duration arrival_timeout = absl::Minutes(5);
  // Extra copies of each file on workers of other hosts (0: the source's own workers only).
  int memory_replicas = 0;
};

// Options of Receive.
struct ReceiveOptions {
  int64_t version = 0;  // 0: the newest published version (negative: InvalidArgument)
  // Check every received byte against checksums its reader computed from verified stored
  // bytes (DataLoss naming the tensor, version and source worker on a mismatch).
  bool verify = false;
  absl::Duration arrival_timeout = absl::Minutes(5);
  absl::Duration deadline = absl::Hours(1);  // the whole receive must finish by then
  int64_t memory_budget_bytes = 0;           // bytes in flight per rank and wave (0: default)
  // How the source's workers exchange with the destination's: "broadcast" (also when empty,
  // and always with verify, which checks whole units as they were read), "overlap_all_to_all"
  // (each byte is sent only to the ranks that need it), "gather_rounds" or "gather_object"
  // (LoadOptions::exchange_algorithm). InvalidArgument names an unknown one.
  std::string exchange_algorithm;
};

// What a Receive delivered: the name and the published version (the newest when the caller
// asked for none).
struct ReceivedVersion {
  std::string name;
  int64_t version = 0;
};

// A publish in flight: the version and, through WaitPublished, when receivers can read it.
class PublishHandle {
 public:
  PublishHandle(std::unique_ptr<SaveHandle> save, std::string name, int64_t version);
  ~PublishHandle();
  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  const std::string& operation_id() const;
  // OK once the version is published (every source worker holds its files; receivers see it),
  // else the abort diagnosis, or DeadlineExceeded after `timeout`.
  absl::Status WaitPublished(absl::Duration timeout);

 private:
  std::unique_ptr<SaveHandle> save_;
  std::string name_;
  int64_t version_;
};

// The transfer path vocabulary (xfer://<name>@<version>[?verify]) is common/transfer_path.h.

class StateDict;
// Copies every tensor of `from` into the same tensor of `to` (same declarations, in order; one
// side host memory: a receive's shadow into the caller's state, a publish's device tensors into
// their host shadow), host <-> device by cudaMemcpy. The CUDA error naming the tensor when one
// fails.
absl::Status CopyTensors(const StateDict& from, StateDict& to);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_TRANSFER_H_
