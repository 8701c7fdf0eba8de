// An S3 client on libcurl: requests signed by libcurl's SigV4 (CURLOPT_AWS_SIGV4), responses
// parsed with expat, retries with exponential backoff and full jitter within each call's
// deadline. Every error names the bucket and object key; none ever holds the secret key.
#ifndef CKPT_STORAGE_S3_S3_CLIENT_H_
#define CKPT_STORAGE_S3_S3_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "storage/s3/s3_credentials.h"
#include "storage/s3/s3_url.h"

namespace ckpt {

// One failed attempt about to be retried, as S3RetryPolicy::on_retry sees it.
struct S3RetryEvent {
  const char* op = "";       // the S3 operation ("PutObject", "UploadPart", "GetObject", ...)
  absl::string_view bucket;  // valid during the callback only
  absl::string_view key;     // empty for a bucket operation
  int attempt = 0;           // the attempt that failed, from 1
  int http_status = 0;       // its HTTP status (503, ...); 0 when no answer came
  int curl_code = 0;         // its CURLcode when no answer came (CURLE_COULDNT_CONNECT, ...)
  absl::string_view error;   // the attempt's error message (names the op, bucket and key)
  absl::Duration backoff;    // the sleep that follows, before attempt + 1
};

// When and how often a failed request is tried again: 5xx, SlowDown and connection errors
// are retried up to `max_attempts` in all, sleeping uniform(0, min(max_backoff,
// initial_backoff * 2^retry)) between tries, never past the call's deadline. A call ends
// early when its deadline passes or leaves no room for the next backoff: with the last
// attempt's Unavailable (saying the deadline cut the retries) once any attempt failed so,
// DeadlineExceeded when none was made.
struct S3RetryPolicy {
  int max_attempts = 8;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  // When set, called before each backoff sleep (never when the call gives up instead), on the
  // calling thread: for retry logging or metrics. Calls of one client may run it concurrently,
  // so it must be thread-safe, quick, and not call the client. Unset costs nothing.
  std::function<void(const S3RetryEvent&)> on_retry;
};

// Where the server is, who we are and how to talk to it.
struct S3ClientOptions {
  std::string endpoint;  // "http[s]://host[:port]"
  std::string region = "us-east-1";
  S3Credentials credentials;
  S3Addressing addressing = S3Addressing::kPath;
  std::string ca_file;  // PEM CA bundle for https (CURLOPT_CAINFO); empty: the system's
  S3RetryPolicy retry;
  absl::Duration connect_timeout = absl::Seconds(10);  // capped by each call's deadline
};

// The client options for `settings` (credentials, region and endpoint as the AWS tools find
// them; storage/s3/s3_credentials.h), with path-style addressing and the default retries.
S3ClientOptions S3ClientOptionsFrom(const S3Settings& settings);

// A part uploaded to a multipart upload.
struct S3CompletedPart {
  int part_number = 0;
  std::string etag;
};

// An upload begun and neither completed nor aborted (a crashed writer's, say).
struct S3MultipartUpload {
  std::string key;
  std::string upload_id;
  absl::Time initiated = absl::InfinitePast();  // when it was begun (the listing's Initiated)
};

// One object in a listing.
struct S3ObjectInfo {
  std::string key;
  int64_t size = 0;
  absl::Time last_modified = absl::InfinitePast();  // the listing's LastModified
};

// One page of ListObjectsV2; `next_continuation_token` is empty on the last page.
struct S3ListPage {
  std::vector<S3ObjectInfo> objects;
  std::string next_continuation_token;
};

// Thread-safe: concurrent calls use separate libcurl handles from a pool (connections kept).
// Errors: PermissionDenied (403, naming the access key id), NotFound (missing bucket, key or
// upload), Unavailable (5xx, SlowDown or connection failures after the retries), DeadlineExceeded,
// DataLoss (a GET whose body has not the requested size), InvalidArgument (names refused before
// any request is sent).
class S3Client {
 public:
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3ClientOptions& options() const { return options_; }

  // Creates `bucket`; OK when this account already owns it.
  absl::Status CreateBucket(absl::string_view bucket, absl::Time deadline);
  // The object's size in bytes.
  absl::StatusOr<int64_t> HeadObject(absl::string_view bucket, absl::string_view key,
                                     absl::Time deadline);
  // Writes the whole object in one PUT with Content-MD5 (the server refuses a corrupted body).
  absl::Status PutObject(absl::string_view bucket, absl::string_view key, absl::string_view data,
                         absl::Time deadline);
  // Reads bytes [offset, offset + out.size()) into `out`; DataLoss naming the object and the
  // byte counts when the server sends fewer or more (the object is shorter than expected).
  absl::Status GetObjectRange(absl::string_view bucket, absl::string_view key, int64_t offset,
                              absl::Span<char> out, absl::Time deadline);

  // Multipart uploads. Parts are numbered from 1; every part but the last must be at least
  // the server's minimum (5 MiB on S3 and on Swift's s3api by default).
  absl::StatusOr<std::string> CreateMultipartUpload(absl::string_view bucket, absl::string_view key,
                                                    absl::Time deadline);
  // Uploads one part with Content-MD5; returns its ETag.
  absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                         absl::string_view upload_id, int part_number,
                                         absl::string_view data, absl::Time deadline);
  absl::Status CompleteMultipartUpload(absl::string_view bucket, absl::string_view key,
                                       absl::string_view upload_id,
                                       const std::vector<S3CompletedPart>& parts,
                                       absl::Time deadline);
  absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                    absl::string_view upload_id, absl::Time deadline);
  // Every upload in progress under `prefix` (all pages).
  absl::StatusOr<std::vector<S3MultipartUpload>> ListMultipartUploads(absl::string_view bucket,
                                                                      absl::string_view prefix,
                                                                      absl::Time deadline);

  // One page of the keys under `prefix`, at most `max_keys` (1-1000); pass the previous page's
  // next_continuation_token to get the next.
  absl::StatusOr<S3ListPage> ListObjectsV2(absl::string_view bucket, absl::string_view prefix,
                                           absl::string_view continuation_token, int max_keys,
                                           absl::Time deadline);
  // Deletes one object; OK when it does not exist (S3's semantics).
  absl::Status DeleteObject(absl::string_view bucket, absl::string_view key, absl::Time deadline);
  // Deletes `keys` in batches of 1000 (POST ?delete with Content-MD5); the first key the
  // server could not delete is named in the error.
  absl::Status DeleteObjects(absl::string_view bucket, const std::vector<std::string>& keys,
                             absl::Time deadline);

 private:
  struct Impl;
  explicit S3Client(S3ClientOptions options);

  S3ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_S3_CLIENT_H_
