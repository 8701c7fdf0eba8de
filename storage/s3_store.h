// The s3:// checkpoint store (storage/checkpoint_store.h) on an S3-compatible object store,
// through storage/s3/s3_client.h. An object store has no rename and no directory fsync, so:
//
//   s3://bucket/ckpts/step5/manifest.pb              the commit point, PUT last (a PUT is atomic)
//   s3://bucket/ckpts/step5/<generation>/data/r0_0.safetensors   data objects of one write
//
// Each write puts its data objects under a fresh generation (a random name); the manifest
// object, PUT once every data object is complete, names that generation
// (Manifest.object_generation), so a reader never sees a checkpoint without its manifest as
// committed, and an overwrite leaves the checkpoint it replaces readable, whole, until its own
// manifest is PUT; the replaced generation's objects are deleted after that. Abort deletes the
// objects of the write (multipart uploads in flight are aborted by their writers). Objects
// smaller than one part go up in one PUT, larger ones as multipart uploads with parts in
// flight; every PUT and part carries Content-MD5, so the server refuses a corrupted body, and
// every GET is checked for its size. A manifest over 2 GiB (format 2) is refused.
//
// A write spread over processes: BeginWrite PUTs an empty marker object <generation>/staging;
// staging_url is "s3://bucket/ckpts/step5/<generation>", which JoinWrite takes only spelled
// exactly so (a valid bucket and key, a generation "g" + 16 lowercase hex digits), and is
// NotFound when the marker is gone. Joined writes store objects under that generation; Adopt
// HEADs them. Commit deletes the marker after the manifest PUT. The beginning write's abort
// deletes the marker first, then lists the generation prefix and deletes everything there,
// whoever stored it, and aborts multipart uploads still open under it. A joined writer's
// Close HEADs the marker after storing its object: gone (the write aborted, or committed
// without that object), the object is deleted again and the Close fails NotFound, so nothing a
// joined writer stores outlives an aborted write.
//
// Registered under "s3" by s3_store.cc, with credentials, region and endpoint from the AWS
// environment (storage/s3/s3_credentials.h).
#ifndef CKPT_STORAGE_S3_STORE_H_
#define CKPT_STORAGE_S3_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_multipart_writer.h"

namespace ckpt {

struct S3StoreOptions {
  S3ClientOptions client;
  // Part size and parts in flight of each object's multipart upload; also the size under
  // which an object goes up in one PUT.
  S3MultipartWriterOptions multipart;
};

// The options the registry's "s3" store is made with: credentials, region and endpoint as the
// AWS CLI finds them (storage/s3/s3_credentials.h), AWS_CA_BUNDLE (a PEM CA bundle for https),
// and ckpt's own CKPT_S3_ADDRESSING (path, the default, or virtual), CKPT_S3_PART_SIZE (bytes
// per multipart part, at least 5 MiB; 8 MiB by default) and CKPT_S3_PARTS_IN_FLIGHT (per
// object, 1-64; 4 by default). InvalidArgument naming the variable for a value that does not
// parse; the credentials' errors otherwise (never holding the secret).
absl::StatusOr<S3StoreOptions> S3StoreOptionsFromEnvironment();

// The store over a client made from `options`.
absl::StatusOr<std::unique_ptr<CheckpointStore>> MakeS3Store(S3StoreOptions options);

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_STORE_H_
