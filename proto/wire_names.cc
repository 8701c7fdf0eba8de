#include "proto/wire_names.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {
namespace {

// Every named load algorithm, in help-text order.
const std::vector<std::pair<pb::LoadAlgorithm, std::string>>& LoadAlgorithmTable() {
  static const auto* table = new std::vector<std::pair<pb::LoadAlgorithm, std::string>>{
      {pb::LOAD_BROADCAST, "broadcast"},
      {pb::LOAD_OVERLAP_ALL_TO_ALL, "overlap_all_to_all"},
      {pb::LOAD_GATHER_ROUNDS, "gather_rounds"},
      {pb::LOAD_GATHER_OBJECT, "gather_object"},
      {pb::LOAD_DIRECT, "direct"},
      {pb::LOAD_AUTO, "auto"},
  };
  return *table;
}

}  // namespace

std::string LoadAlgorithmName(pb::LoadAlgorithm algorithm) {
  for (const auto& [value, name] : LoadAlgorithmTable()) {
    if (value == algorithm) return name;
  }
  return "";
}

const std::vector<std::string>& LoadAlgorithmNames() {
  static const auto* names = [] {
    auto* out = new std::vector<std::string>;
    for (const auto& entry : LoadAlgorithmTable()) out->push_back(entry.second);
    return out;
  }();
  return *names;
}

absl::StatusOr<pb::LoadAlgorithm> ParseLoadAlgorithm(absl::string_view name) {
  if (name.empty()) return pb::LOAD_ALGORITHM_UNSPECIFIED;
  for (const auto& [value, known] : LoadAlgorithmTable()) {
    if (known == name) return value;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown load algorithm '", name, "'; valid: ", absl::StrJoin(LoadAlgorithmNames(), ", ")));
}

std::string MemoryKindName(pb::MemoryKind kind) {
  switch (kind) {
    case pb::MEMORY_HOST:
      return "host";
    case pb::MEMORY_DEVICE:
      return "device";
    default:
      return "unspecified";
  }
}

std::string OperationKindName(pb::OperationKind kind) {
  switch (kind) {
    case pb::OPERATION_SAVE:
      return "save";
    case pb::OPERATION_LOAD:
      return "load";
    case pb::OPERATION_RESHARD:
      return "reshard";
    case pb::OPERATION_RECEIVE:
      return "receive";
    default:
      return "unspecified";
  }
}

std::string OperationPhaseName(pb::OperationPhase phase) {
  switch (phase) {
    case pb::PHASE_GATHERING:
      return "gathering";
    case pb::PHASE_PLANNING:
      return "planning";
    case pb::PHASE_EXECUTING:
      return "executing";
    case pb::PHASE_COMMITTING:
      return "committing";
    case pb::PHASE_DONE:
      return "done";
    case pb::PHASE_ABORTED:
      return "aborted";
    default:
      return "unspecified";
  }
}

}  // namespace ckpt
