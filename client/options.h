// Who a trainer process is (job, rank, world size, local rank) and where its worker daemon
// listens, from explicit options first and the launcher's environment second (read by
// common/launcher_env, which the worker daemon shares). Pure: no gRPC, threads or logging.
#ifndef CKPT_CLIENT_OPTIONS_H_
#define CKPT_CLIENT_OPTIONS_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/launcher_env.h"

namespace ckpt::client {

// The environment readers of common/launcher_env, under the names the client always had.
using ::ckpt::EnvLookup;
using ::ckpt::ProcessEnv;

// What the trainer says about itself; unset fields come from the environment.
struct Options {
  std::optional<std::string> job;  // else CKPT_JOB, TORCHELASTIC_RUN_ID, SLURM_JOB_ID
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  // The worker's address, e.g. "unix:/tmp/ckpt-worker-1000-0.sock"; else CKPT_WORKER_ADDRESS,
  // else DefaultWorkerAddress(local_rank).
  std::optional<std::string> worker_address;
  // Deadline of each call to the worker that does not wait for other ranks.
  absl::Duration rpc_timeout = absl::Seconds(10);
};

// Options with every field known.
struct ResolvedOptions {
  std::string job;
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  std::string worker_address;
  std::string launcher;  // "explicit", "torchrun", "slurm" or "openmpi": where rank came from
  absl::Duration rpc_timeout;
};

// Fills unset fields from the environment. The launcher is the first whose rank variable is
// set (torchrun, then SLURM, then Open MPI); world size and local rank come from the same
// launcher. InvalidArgument naming every missing value and the variables that could supply
// it, or a malformed/inconsistent value (rank outside the world size, ...).
absl::StatusOr<ResolvedOptions> ResolveOptions(const Options& options, const EnvLookup& env);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_OPTIONS_H_
