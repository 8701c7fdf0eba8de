// The one place where the wire enums meet the names users type and read: the load algorithm
// ("auto", "direct", "broadcast", ...) of ckptctl flags, coordinator flags and client options,
// the memory kind ("host", "device"), and the operation kind and phase as status lines and
// the client API print them ("save", "executing"). Everything inside ckpt compares enums.
#ifndef CKPT_PROTO_WIRE_NAMES_H_
#define CKPT_PROTO_WIRE_NAMES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/types.pb.h"

namespace ckpt {

// "auto", "direct", "broadcast", "overlap_all_to_all", "gather_rounds", "gather_object"; ""
// for LOAD_ALGORITHM_UNSPECIFIED (the coordinator decides).
std::string LoadAlgorithmName(pb::LoadAlgorithm algorithm);
// The names LoadAlgorithmName gives, in the order help texts list them (without "").
const std::vector<std::string>& LoadAlgorithmNames();
// The algorithm a user named; "" is LOAD_ALGORITHM_UNSPECIFIED. InvalidArgument listing the
// valid names for anything else.
absl::StatusOr<pb::LoadAlgorithm> ParseLoadAlgorithm(absl::string_view name);

// "host", "device"; "unspecified" for MEMORY_KIND_UNSPECIFIED.
std::string MemoryKindName(pb::MemoryKind kind);

// "save", "load", "reshard"; "unspecified" for OPERATION_KIND_UNSPECIFIED.
std::string OperationKindName(pb::OperationKind kind);

// "gathering", "planning", "executing", "committing", "done", "aborted"; "unspecified".
std::string OperationPhaseName(pb::OperationPhase phase);

}  // namespace ckpt

#endif  // CKPT_PROTO_WIRE_NAMES_H_
