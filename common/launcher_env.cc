#include "common/launcher_env.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr LauncherVariables kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NPROCS", "SLURM_LOCALID"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::Span<const LauncherVariables> KnownLaunchers() { return kLaunchers; }

const LauncherVariables* DetectLauncher(const EnvLookup& env) {
  for (const LauncherVariables& l : kLaunchers) {
    if (env(l.rank).has_value()) return &l;
  }
  return nullptr;
}

absl::StatusOr<std::optional<int>> ReadIntVariable(const EnvLookup& env, const std::string& name) {
  std::optional<std::string> value = env(name);
  if (!value.has_value()) return std::optional<int>();
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "=\"", *value, "\" is not an integer"));
  }
  return std::optional<int>(parsed);
}

std::optional<std::string> JobFromEnvironment(const EnvLookup& env) {
  for (const char* var : {"CKPT_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    if (std::optional<std::string> v = env(var); v.has_value() && !v->empty()) return v;
  }
  return std::nullopt;
}

absl::StatusOr<int> ResolveLocalRank(std::optional<int> explicit_local_rank, const EnvLookup& env) {
  if (explicit_local_rank.has_value()) return *explicit_local_rank;
  for (const LauncherVariables& l : kLaunchers) {
    absl::StatusOr<std::optional<int>> v = ReadIntVariable(env, l.local_rank);
    if (!v.ok()) return v.status();
    if (v->has_value()) return **v;
  }
  return 0;
}

std::string DefaultWorkerAddress(int local_rank) {
  return absl::StrCat("unix:/tmp/ckpt-worker-", getuid(), "-", local_rank, ".sock");
}

}  // namespace ckpt
