// Internals of S3Client: one signed HTTP exchange over a pool of libcurl handles, retried
// with backoff within a deadline, and S3's errors mapped to absl::Status. Not a public API.
#ifndef CKPT_STORAGE_S3_S3_CLIENT_INTERNAL_H_
#define CKPT_STORAGE_S3_S3_CLIENT_INTERNAL_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "storage/s3/s3_client.h"

namespace ckpt::s3_internal {

// One request. `key` may be empty (a bucket operation); `query` is canonical (S3CanonicalQuery).
struct HttpRequest {
  const char* op = "";         // the S3 operation, for errors ("PutObject")
  const char* method = "GET";  // GET, HEAD, PUT, POST or DELETE
  std::string bucket;
  std::string key;
  std::string query;
  std::vector<std::string> headers;  // "Name: value"
  absl::string_view body;            // sent for PUT and POST
  bool body_to_sink = false;         // a 2xx body goes to `sink`, its size checked by the caller
  absl::Span<char> sink;
};

// A 2xx response.
struct HttpResponse {
  long status = 0;
  std::string body;            // the body unless it went to the sink (at most 16 MiB kept)
  int64_t sink_bytes = 0;      // bytes written to the sink
  bool sink_overflow = false;  // the server sent more than the sink holds
  std::string etag;            // the ETag header, quotes kept
  int64_t content_length = -1;
};

// The base64 MD5 of `data` (a Content-MD5 header's value) and the hex SHA-256.
std::string ContentMd5(absl::string_view data);
std::string Sha256Hex(absl::string_view data);

// "s3://bucket/key" (or "s3://bucket"), for messages.
std::string ObjectName(absl::string_view bucket, absl::string_view key);

// Sends requests; thread-safe (a handle per concurrent request, reused afterwards).
class HttpPool {
 public:
  explicit HttpPool(const S3ClientOptions& options);
  ~HttpPool();
  HttpPool(const HttpPool&) = delete;
  HttpPool& operator=(const HttpPool&) = delete;

  // Sends `req`, retrying as options.retry says within `deadline`. A non-2xx answer or a
  // transport failure comes back as the mapped status naming req.op, the bucket and the key.
  absl::StatusOr<HttpResponse> Send(const HttpRequest& req, absl::Time deadline);

 private:
  struct Attempt;
  void* Acquire();
  void Release(void* handle);
  // What a failed attempt was: whether to retry it, and its HTTP status or CURLcode.
  struct Outcome {
    bool retryable = false;
    int http_status = 0;
    int curl_code = 0;
  };
  absl::StatusOr<HttpResponse> SendOnce(const HttpRequest& req, absl::Time deadline,
                                        Outcome* outcome);

  const S3ClientOptions& options_;
  std::mutex mu_;
  std::vector<void*> free_;  // CURL* handles not in use
};

}  // namespace ckpt::s3_internal

#endif  // CKPT_STORAGE_S3_S3_CLIENT_INTERNAL_H_
