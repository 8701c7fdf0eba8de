// Checkpoint locations that are object-store URLs ("s3://bucket/prefix") rather than paths.
// The registry of stores lives in storage/checkpoint_store.h; this is the part every layer
// needs without depending on storage: telling a URL from a path (so a client never makes
// "s3://b/p" absolute against its working directory) and checking a URL's syntax.
//
// Pure: string handling only.
#ifndef CKPT_COMMON_STORE_URL_H_
#define CKPT_COMMON_STORE_URL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// The scheme of `location`: the part before "://" ("s3" for "s3://b/p") when it is one (a
// letter, then letters, digits, '+', '-', '.'), else "file" (a plain path, "/a/s3://b" too).
std::string LocationScheme(absl::string_view location);

// True when `location` names an object store: a "scheme://..." URL whose scheme is not "file".
// Such a location is passed on as given, never made absolute or looked up on a filesystem.
bool IsObjectStoreLocation(absl::string_view location);

// What a client sends for a checkpoint location: a "scheme://..." location (s3://, mem://,
// xfer://, file://) or an empty one unchanged; a plain path made absolute against this
// process's working directory (the coordinator accepts only absolute paths). Nothing else is
// rewritten (the coordinator judges "..").
std::string AbsoluteLocation(const std::string& location);

// `url` ("scheme://bucket[/prefix]", the scheme in lower case) in
// normal form: without a trailing '/'. InvalidArgument naming `what` and the URL when the
// scheme is malformed or "file", the bucket is missing, or the path has an empty ("//"), "."
// or ".." component, a control character or a backslash.
absl::StatusOr<std::string> NormalizeObjectStoreUrl(absl::string_view url, absl::string_view what);

}  // namespace ckpt

#endif  // CKPT_COMMON_STORE_URL_H_
