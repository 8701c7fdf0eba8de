// Who this process is according to its launcher's environment, shared by the trainer's client
// (rank, world size, local rank, job) and the worker daemon (its local rank and default
// address), as PhysicsNeMo's DistributedManager reads it: torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK), SLURM (SLURM_PROCID, SLURM_NPROCS, SLURM_LOCALID) or Open MPI
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK). Pure: no gRPC,
// threads or logging; the environment is injectable.
#ifndef CKPT_COMMON_LAUNCHER_ENV_H_
#define CKPT_COMMON_LAUNCHER_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckpt {

// Reads an environment variable; nullopt when unset. Injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup ProcessEnv();

// The variables one launcher sets for a process.
struct LauncherVariables {
  const char* name;  // "torchrun", "slurm" or "openmpi"
  const char* rank;
  const char* world_size;
  const char* local_rank;
};

// torchrun, SLURM, Open MPI: the launchers known, in the order they are tried.
absl::Span<const LauncherVariables> KnownLaunchers();

// The first known launcher whose rank variable is set, or nullptr when none is.
const LauncherVariables* DetectLauncher(const EnvLookup& env);

// An integer variable: nullopt when unset; InvalidArgument naming the variable and its value
// when it is not an integer.
absl::StatusOr<std::optional<int>> ReadIntVariable(const EnvLookup& env, const std::string& name);

// The job from CKPT_JOB, TORCHELASTIC_RUN_ID or SLURM_JOB_ID (the first set and non-empty).
std::optional<std::string> JobFromEnvironment(const EnvLookup& env);

// The local rank alone (for the worker daemon choosing its GPU): explicit, else LOCAL_RANK,
// SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, else 0.
absl::StatusOr<int> ResolveLocalRank(std::optional<int> explicit_local_rank, const EnvLookup& env);

// "unix:/tmp/ckpt-worker-<uid>-<local_rank>.sock": where ckpt_worker listens by default and
// where a trainer of that local rank looks for it.
std::string DefaultWorkerAddress(int local_rank);

}  // namespace ckpt

#endif  // CKPT_COMMON_LAUNCHER_ENV_H_
