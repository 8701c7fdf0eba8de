#ifndef CKPT_PROTO_STATE_DIGEST_H_
#define CKPT_PROTO_STATE_DIGEST_H_

#include <string>

#include "absl/strings/string_view.h"
#include "proto/coordinator.pb.h"

namespace ckpt {

// SHA-256 (32 raw bytes) of a rank's state description: the deterministic protobuf
// serialization of `state`, so the same description gives the same digest in every process
// of the same build (map entries sorted; repeated fields keep the order the rank sent, which
// is part of the description). SHA-256 is collision-resistant: a rank cannot make a different
// description match a kept one, by accident or on purpose.
std::string RankStateDigest(const pb::RankState& state);

// The same over an already deterministic serialization of a RankState.
std::string RankStateDigestOfBytes(const std::string& serialized_state);

// SHA-256 (32 raw bytes) of any bytes.
std::string Sha256(absl::string_view bytes);

// The first 8 bytes of a digest in hex, for logs.
std::string ShortDigest(const std::string& digest);

}  // namespace ckpt

#endif  // CKPT_PROTO_STATE_DIGEST_H_
