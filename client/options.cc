#include "client/options.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::client {

using Launcher = LauncherVariables;

namespace {

// Resolves one of rank / world size: the explicit value, else the launcher's variable. A value
// that is nowhere to be found is added to *missing with where it could come from.
absl::Status ResolveRankField(std::optional<int> explicit_value, const char* what,
                              const char* Launcher::*field, const Launcher* launcher,
                              const EnvLookup& env, int* dest, std::vector<std::string>* missing) {
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
    missing->push_back(absl::StrCat(what, " (", launcher->name, " sets rank through ",
                                    launcher->rank, " but not ", launcher->*field, ")"));
    return absl::OkStatus();
  }
  std::vector<std::string> vars;
  for (const Launcher& l : KnownLaunchers()) vars.push_back(l.*field);
  missing->push_back(
      absl::StrCat(what, " (pass Options::", what, " or set ", absl::StrJoin(vars, ", "), ")"));
  return absl::OkStatus();
}

// The local rank: explicit, else the launcher's (0 for a launcher without one: one process per
// node), else the generic environment lookup.
absl::StatusOr<int> ResolveLocalRankOption(const Options& options, const Launcher* launcher,
                                           const EnvLookup& env) {
  if (options.local_rank.has_value()) return *options.local_rank;
  if (launcher != nullptr) {
    absl::StatusOr<std::optional<int>> v = ReadIntVariable(env, launcher->local_rank);
    if (!v.ok()) return v.status();
    return v->value_or(0);
  }
  return ResolveLocalRank(std::nullopt, env);
}

// Refuses a world size, rank or local rank out of range.
absl::Status CheckRanks(const ResolvedOptions& out) {
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
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedOptions> ResolveOptions(const Options& options, const EnvLookup& env) {
  ResolvedOptions out;
  out.rpc_timeout = options.rpc_timeout;
  const Launcher* launcher = DetectLauncher(env);
  out.launcher = options.rank.has_value() || launcher == nullptr ? "explicit" : launcher->name;
  std::vector<std::string> missing;
  if (absl::Status s = ResolveRankField(options.rank, "rank", &Launcher::rank, launcher, env,
                                        &out.rank, &missing);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ResolveRankField(options.world_size, "world_size", &Launcher::world_size,
                                        launcher, env, &out.world_size, &missing);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<int> local_rank = ResolveLocalRankOption(options, launcher, env);
  if (!local_rank.ok()) return local_rank.status();
  out.local_rank = *local_rank;

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
  if (absl::Status s = CheckRanks(out); !s.ok()) return s;
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
