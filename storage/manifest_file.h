// Writing a checkpoint manifest into its file without holding its bytes: the deterministic
// serialization (SerializeManifest's bytes, exactly) is streamed through a small buffer into
// the file, which is then fsynced. A manifest of millions of pieces is never one string.
#ifndef CKPT_STORAGE_MANIFEST_FILE_H_
#define CKPT_STORAGE_MANIFEST_FILE_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/manifest.pb.h"

namespace ckpt {

// Creates (or truncates) `path`, writes SerializeManifest(manifest) into it through a bounded
// buffer, fsyncs and closes it. Errors name the path; on error the file may be partial (the
// caller writes a temporary name and renames it only after success).
absl::Status WriteManifestDurably(const std::string& path, const pb::Manifest& manifest);

// Writes a manifest's bytes, in parts, into a coded stream set to serialize deterministically
// (e.g. the fields before the pieces, the pieces a few at a time, the fields after them: a
// message's bytes are its fields' bytes in field-number order). An error ends the write.
using ManifestSerializer =
    absl::FunctionRef<absl::Status(google::protobuf::io::CodedOutputStream* out)>;

// WriteManifestDurably with the bytes `serialize` writes; its error is returned (the file is
// then partial).
absl::Status WriteManifestDurably(const std::string& path, ManifestSerializer serialize);

}  // namespace ckpt

#endif  // CKPT_STORAGE_MANIFEST_FILE_H_
