#include "client/options.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::client {

using Launcher = LauncherVariables;

absl::StatusOr<ResolvedOptions> ResolveOptions(const Options& options, const EnvLookup& env) {
  ResolvedOptions out;
  out.rpc_timeout = options.rpc_timeout;
  const Launcher* launcher = DetectLauncher(env);
  out.launcher = options.rank.has_value() || launcher == nullptr ? "explicit" : launcher->name;
  std::vector<std::string> missing;

  auto resolve = [&](std::optional<int> explicit_value, const char* what,
                     const char* Launcher::*field, int* dest) -> absl::Status {
    if (explicit_value.has_value()) {
      *dest = *explicit_value;
      return absl::OkStatus();
    }
    if (launcher != nullptr) {
      absl::StatusOr<std::optional<int>> v = ReadIntVariable(env, launcher->*field);
      if (!v.ok()) return v.status();
      if (v->has_value()) {
        *dest = **v;
        return absl::OkStatus();
      }
      missing.push_back(absl::StrCat(what, " (", launcher->name, " sets rank through ",
                                     launcher->rank, " but not ", launcher->*field, ")"));
      return absl::OkStatus();
    }
    std::vector<std::string> vars;
    for (const Launcher& l : KnownLaunchers()) vars.push_back(l.*field);
    missing.push_back(
        absl::StrCat(what, " (pass Options::", what, " or set ", absl::StrJoin(vars, ", "), ")"));
    return absl::OkStatus();
  };
  if (absl::Status s = resolve(options.rank, "rank", &Launcher::rank, &out.rank); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          resolve(options.world_size, "world_size", &Launcher::world_size, &out.world_size);
      !s.ok()) {
    return s;
  }
  if (options.local_rank.has_value()) {
    out.local_rank = *options.local_rank;
  } else if (launcher != nullptr) {
    absl::StatusOr<std::optional<int>> v = ReadIntVariable(env, launcher->local_rank);
    if (!v.ok()) return v.status();
    // A launcher without a local rank (one process per node): 0.
    out.local_rank = v->value_or(0);
  } else {
    absl::StatusOr<int> v = ResolveLocalRank(std::nullopt, env);
    if (!v.ok()) return v.status();
    out.local_rank = *v;
  }

  if (options.job.has_value()) {
    out.job = *options.job;
  } else {
    out.job = JobFromEnvironment(env).value_or("");
    if (out.job.empty()) {
      missing.push_back(
          "job (pass Options::job or set CKPT_JOB, TORCHELASTIC_RUN_ID or SLURM_JOB_ID)");
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt client: missing ", absl::StrJoin(missing, "; ")));
  }
  if (out.world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt client: world size ", out.world_size, " must be positive"));
  }
  if (out.rank < 0 || out.rank >= out.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt client: rank ", out.rank, " is outside [0, ", out.world_size, ")"));
  }
  if (out.local_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt client: local rank ", out.local_rank, " is negative"));
  }
  if (options.worker_address.has_value()) {
    out.worker_address = *options.worker_address;
  } else if (std::optional<std::string> v = env("CKPT_WORKER_ADDRESS"); v.has_value()) {
    out.worker_address = *v;
  } else {
    out.worker_address = DefaultWorkerAddress(out.local_rank);
  }
  return out;
}

}  // namespace ckpt::client
