#ifndef CKPT_PROTO_DETERMINISTIC_H_
#define CKPT_PROTO_DETERMINISTIC_H_

#include <string>

#include "google/protobuf/message_lite.h"

namespace ckpt {

// The deterministic protobuf serialization of `message` (map entries sorted by key), so the
// same message gives the same bytes in every process of the same build: what is hashed or
// checksummed (manifests, rank state digests) must be serialized this way.
std::string SerializeDeterministically(const google::protobuf::MessageLite& message);

// Appends to `out` the bytes `message` adds to its parent's serialization as one element of
// the message field `field_number` (tag, length, message), so that records appended one by one
// (a repeated field built or written in parts) parse as the parent's field. Deterministic.
void AppendMessageField(int field_number, const google::protobuf::MessageLite& message,
                        std::string* out);

// The same for bytes already serialized (a message, a string or bytes field's value): tag,
// length, `bytes`.
void AppendBytesField(int field_number, const std::string& bytes, std::string* out);

}  // namespace ckpt

#endif  // CKPT_PROTO_DETERMINISTIC_H_
