#include "proto/state_digest.h"

#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "proto/deterministic.h"

namespace ckpt {

std::string Sha256(absl::string_view bytes) {
  std::string digest(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
         reinterpret_cast<unsigned char*>(digest.data()));
  return digest;
}

std::string RankStateDigestOfBytes(const std::string& serialized_state) {
  return Sha256(serialized_state);
}

std::string RankStateDigest(const pb::RankState& state) {
  return RankStateDigestOfBytes(SerializeDeterministically(state));
}

std::string ShortDigest(const std::string& digest) {
  return absl::BytesToHexString(digest.substr(0, 8));
}

}  // namespace ckpt
