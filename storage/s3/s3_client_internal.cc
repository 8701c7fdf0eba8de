#include "storage/s3/s3_client_internal.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "storage/s3/s3_xml.h"

namespace ckpt::s3_internal {
namespace {

constexpr size_t kMaxKeptBody = size_t{16} << 20;
constexpr char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Digest(const EVP_MD* md, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out, &len, md, nullptr);
  return std::string(reinterpret_cast<char*>(out), len);
}

void InitCurlOnce() {
  static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)rc;
}

// Per-attempt state the libcurl callbacks see.
struct Transfer {
  CURL* curl = nullptr;
  const HttpRequest* req = nullptr;
  HttpResponse resp;
  size_t read_pos = 0;
};

size_t OnRead(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t left = t->req->body.size() - t->read_pos;
  const size_t len = std::min(left, size * n);
  std::memcpy(buf, t->req->body.data() + t->read_pos, len);
  t->read_pos += len;
  return len;
}

size_t OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  long code = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
  if (t->req->body_to_sink && code / 100 == 2) {
    const size_t room = t->req->sink.size() - static_cast<size_t>(t->resp.sink_bytes);
    if (len > room) {
      t->resp.sink_overflow = true;
      return 0;  // stops the transfer: CURLE_WRITE_ERROR
    }
    std::memcpy(t->req->sink.data() + t->resp.sink_bytes, data, len);
    t->resp.sink_bytes += static_cast<int64_t>(len);
    return len;
  }
  if (t->resp.body.size() < kMaxKeptBody) t->resp.body.append(data, len);
  return len;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  absl::string_view line(data, size * n);
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return size * n;
  const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
  const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  if (name == "etag") t->resp.etag = std::string(value);
  if (name == "content-length") {
    int64_t v = -1;
    if (absl::SimpleAtoi(value, &v)) t->resp.content_length = v;
  }
  return size * n;
}

bool RetryableCurl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_OPERATION_TIMEDOUT:  // only while the deadline has not passed (connect timeout)
      return true;
    default:
      return false;
  }
}

// The status for a non-2xx answer, from the status code and the <Error> document's Code.
absl::Status HttpError(const HttpRequest& req, const HttpResponse& resp,
                       const std::string& access_key_id, bool* retryable) {
  std::string code, message;
  if (absl::StatusOr<XmlElement> doc = ParseXml(resp.body); doc.ok() && doc->name == "Error") {
    code = doc->ChildText("Code");
    message = doc->ChildText("Message");
  }
  const std::string what =
      absl::StrCat("S3 ", req.op, " ", ObjectName(req.bucket, req.key), ": HTTP ", resp.status,
                   code.empty() ? "" : " " + code, message.empty() ? "" : " (" + message + ")");
  *retryable = resp.status >= 500 || code == "SlowDown";
  if (*retryable) return absl::UnavailableError(what);
  if (resp.status == 403 || code == "AccessDenied" || code == "SignatureDoesNotMatch" ||
      code == "InvalidAccessKeyId") {
    return absl::PermissionDeniedError(absl::StrCat(what, ": access denied to bucket ", req.bucket,
                                                    " for access key id ", access_key_id));
  }
  if (code == "NoSuchBucket") {
    return absl::NotFoundError(absl::StrCat(what, ": bucket ", req.bucket, " does not exist"));
  }
  if (code == "NoSuchUpload") return absl::NotFoundError(what + ": no such multipart upload");
  if (resp.status == 404 || code == "NoSuchKey") {
    return absl::NotFoundError(absl::StrCat(what, ": object not found"));
  }
  if (resp.status == 416 || code == "InvalidRange") {
    return absl::DataLossError(absl::StrCat(what, ": the requested range is beyond the object"));
  }
  if (code == "BadDigest" || code == "InvalidDigest" || code == "XAmzContentSHA256Mismatch") {
    return absl::DataLossError(
        absl::StrCat(what, ": the server received a body that does not match its checksum"));
  }
  if (resp.status == 409) return absl::FailedPreconditionError(what);
  if (resp.status == 400) return absl::InvalidArgumentError(what);
  return absl::UnknownError(what);
}

absl::Duration Backoff(const S3RetryPolicy& policy, int retry, absl::BitGen& gen) {
  absl::Duration cap = policy.initial_backoff;
  for (int i = 0; i < retry && cap < policy.max_backoff; ++i) cap *= 2;
  cap = std::min(cap, policy.max_backoff);
  return absl::Nanoseconds(absl::Uniform<int64_t>(gen, 0, absl::ToInt64Nanoseconds(cap) + 1));
}

}  // namespace

std::string ContentMd5(absl::string_view data) {
  return absl::Base64Escape(Digest(EVP_md5(), data));
}

std::string Sha256Hex(absl::string_view data) {
  return absl::BytesToHexString(Digest(EVP_sha256(), data));
}

std::string ObjectName(absl::string_view bucket, absl::string_view key) {
  return key.empty() ? absl::StrCat("s3://", bucket) : absl::StrCat("s3://", bucket, "/", key);
}

HttpPool::HttpPool(const S3ClientOptions& options) : options_(options) { InitCurlOnce(); }

HttpPool::~HttpPool() {
  for (void* h : free_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* HttpPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      void* h = free_.back();
      free_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void HttpPool::Release(void* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(handle);
}

absl::StatusOr<HttpResponse> HttpPool::Send(const HttpRequest& req, absl::Time deadline) {
  const S3RetryPolicy& policy = options_.retry;
  const int max_attempts = std::max(1, policy.max_attempts);
  absl::BitGen gen;
  absl::Status last;  // the last retryable failure
  const char* cut = "";
  int attempt = 0;
  while (attempt < max_attempts) {
    Outcome outcome;
    absl::StatusOr<HttpResponse> resp = SendOnce(req, deadline, &outcome);
    ++attempt;
    if (resp.ok()) return resp;
    // The deadline cutting a storm short is the storm's error, not the deadline's.
    if (absl::IsDeadlineExceeded(resp.status()) && !last.ok()) {
      cut = ": the deadline passed during the last";
      break;
    }
    if (!outcome.retryable) return resp;
    last = resp.status();
    if (attempt == max_attempts) break;
    const absl::Duration wait = Backoff(policy, attempt - 1, gen);
    if (absl::Now() + wait >= deadline) {
      cut = ": the next backoff would pass the deadline";
      break;
    }
    if (policy.on_retry) {
      S3RetryEvent event;
      event.op = req.op;
      event.bucket = req.bucket;
      event.key = req.key;
      event.attempt = attempt;
      event.http_status = outcome.http_status;
      event.curl_code = outcome.curl_code;
      event.error = last.message();
      event.backoff = wait;
      policy.on_retry(event);
    }
    absl::SleepFor(wait);
  }
  return absl::Status(last.code(), absl::StrCat(last.message(), " (gave up after ", attempt,
                                                attempt == 1 ? " attempt" : " attempts", cut, ")"));
}

namespace {

// Sets every option of one attempt on `curl` (reset first: a pooled handle keeps only its
// connections). Returns the header list to free after the transfer.
absl::StatusOr<curl_slist*> Configure(const S3ClientOptions& o, const HttpRequest& req,
                                      absl::Duration remaining, Transfer* t) {
  CURL* c = t->curl;
  curl_easy_reset(c);
  absl::StatusOr<std::string> url =
      S3RequestUrl(o.endpoint, o.addressing, req.bucket, req.key, req.query);
  if (!url.ok()) return url.status();
  curl_easy_setopt(c, CURLOPT_URL, url->c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, absl::StrCat("aws:amz:", o.region, ":s3").c_str());
  curl_easy_setopt(c, CURLOPT_USERNAME, o.credentials.access_key_id.c_str());
  curl_easy_setopt(c, CURLOPT_PASSWORD, o.credentials.secret_access_key.c_str());
  if (!o.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o.ca_file.c_str());
  const long total_ms =
      std::max<long>(1, absl::ToInt64Milliseconds(absl::Ceil(remaining, absl::Milliseconds(1))));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, total_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   std::min<long>(total_ms, absl::ToInt64Milliseconds(o.connect_timeout)));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, t);
  // S3 wants the payload's hash signed: the hash of small bodies, UNSIGNED-PAYLOAD for PUT
  // bodies, whose integrity Content-MD5 proves. libcurl 7.88 signs the value given here.
  const bool unsigned_payload = !std::strcmp(req.method, "PUT") && !req.body.empty();
  std::vector<std::string> headers = req.headers;
  headers.push_back(absl::StrCat(
      "x-amz-content-sha256: ",
      unsigned_payload ? "UNSIGNED-PAYLOAD"
                       : (req.body.empty() ? std::string(kEmptySha256) : Sha256Hex(req.body))));
  if (!o.credentials.session_token.empty()) {
    headers.push_back("x-amz-security-token: " + o.credentials.session_token);
  }
  if (!std::strcmp(req.method, "HEAD")) {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (!std::strcmp(req.method, "PUT")) {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, &OnRead);
    curl_easy_setopt(c, CURLOPT_READDATA, t);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (!std::strcmp(req.method, "POST")) {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    headers.push_back("Content-Type: application/xml");
  } else if (!std::strcmp(req.method, "DELETE")) {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  curl_slist* list = nullptr;
  for (const std::string& h : headers) list = curl_slist_append(list, h.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  return list;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpPool::SendOnce(const HttpRequest& req, absl::Time deadline,
                                                Outcome* outcome) {
  *outcome = Outcome();
  bool* retryable = &outcome->retryable;
  const absl::Duration remaining = deadline - absl::Now();
  const std::string name = ObjectName(req.bucket, req.key);
  if (remaining <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        absl::StrCat("S3 ", req.op, " ", name, ": the deadline passed"));
  }
  Transfer t;
  t.curl = static_cast<CURL*>(Acquire());
  t.req = &req;
  if (t.curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  absl::StatusOr<curl_slist*> headers = Configure(options_, req, remaining, &t);
  if (!headers.ok()) {
    Release(t.curl);
    return headers.status();
  }
  const CURLcode rc = curl_easy_perform(t.curl);
  curl_slist_free_all(*headers);
  curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &t.resp.status);
  Release(t.curl);
  if (t.resp.sink_overflow) {
    return absl::DataLossError(absl::StrCat("S3 ", req.op, " ", name,
                                            ": the server sent more than the ", req.sink.size(),
                                            " bytes requested"));
  }
  if (rc != CURLE_OK) {
    outcome->curl_code = static_cast<int>(rc);
    // The whole-transfer timeout is the deadline (curl's timer may fire a little early); an
    // earlier timeout is the connect timeout, retried.
    const bool timed_out =
        rc == CURLE_OPERATION_TIMEDOUT && absl::Now() + absl::Milliseconds(20) >= deadline;
    *retryable = RetryableCurl(rc) && !timed_out;
    const std::string what = absl::StrCat("S3 ", req.op, " ", name, " at ", options_.endpoint, ": ",
                                          curl_easy_strerror(rc));
    if (timed_out) return absl::DeadlineExceededError(what + " (the call's deadline passed)");
    return absl::UnavailableError(what);
  }
  if (t.resp.status / 100 != 2) {
    outcome->http_status = static_cast<int>(t.resp.status);
    return HttpError(req, t.resp, options_.credentials.access_key_id, retryable);
  }
  return std::move(t.resp);
}

}  // namespace ckpt::s3_internal
