#include "storage/s3/s3_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "storage/s3/s3_client_internal.h"
#include "storage/s3/s3_xml.h"

namespace ckpt {

using s3_internal::ContentMd5;
using s3_internal::HttpRequest;
using s3_internal::HttpResponse;
using s3_internal::ObjectName;

struct S3Client::Impl {
  explicit Impl(const S3ClientOptions& options) : http(options) {}
  s3_internal::HttpPool http;
};

namespace {

absl::Status CheckNames(absl::string_view bucket, absl::string_view key) {
  CKPT_RETURN_IF_ERROR(ValidateBucketName(bucket));
  if (!key.empty()) CKPT_RETURN_IF_ERROR(ValidateObjectKey(key));
  return absl::OkStatus();
}

HttpRequest Request(const char* op, const char* method, absl::string_view bucket,
                    absl::string_view key, std::string query = "") {
  HttpRequest r;
  r.op = op;
  r.method = method;
  r.bucket = std::string(bucket);
  r.key = std::string(key);
  r.query = std::move(query);
  return r;
}

// The response body as an XML document whose root is `root`.
absl::StatusOr<XmlElement> ResponseXml(const HttpRequest& req, const HttpResponse& resp,
                                       absl::string_view root) {
  absl::StatusOr<XmlElement> doc = ParseXml(resp.body);
  if (!doc.ok() || doc->name != root) {
    return absl::InternalError(absl::StrCat(
        "S3 ", req.op, " ", ObjectName(req.bucket, req.key), ": expected an XML <", root,
        "> answer, got ", doc.ok() ? "<" + doc->name + ">" : doc.status().message()));
  }
  return doc;
}

// An ISO 8601 time of a listing ("2026-12-07T19:55:01.000Z"); InternalError naming the
// operation, the object and the field when it is missing or malformed.
absl::StatusOr<absl::Time> ListingTime(const HttpRequest& req, absl::string_view bucket,
                                       absl::string_view key, const XmlElement& e,
                                       absl::string_view field) {
  const std::string text = e.ChildText(field);
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &err)) {
    return absl::InternalError(absl::StrCat("S3 ", req.op, " ", ObjectName(bucket, key),
                                            ": the listing has no valid ", field, " (\"", text,
                                            "\": ", err, ")"));
  }
  return t;
}

}  // namespace

S3ClientOptions S3ClientOptionsFrom(const S3Settings& settings) {
  S3ClientOptions o;
  o.endpoint = settings.endpoint;
  o.region = settings.region;
  o.credentials = settings.credentials;
  return o;
}

S3Client::S3Client(S3ClientOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(options_)) {}

S3Client::~S3Client() = default;

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  // The endpoint is checked here, once, rather than on the first request.
  CKPT_RETURN_IF_ERROR(
      S3RequestUrl(options.endpoint, options.addressing, "bucket", "", "").status());
  if (options.credentials.access_key_id.empty() || options.credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 client for ", options.endpoint, ": an access key id and a secret key are required"));
  }
  if (options.region.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 client for ", options.endpoint, ": the region is empty"));
  }
  return std::unique_ptr<S3Client>(new S3Client(std::move(options)));
}

absl::Status S3Client::CreateBucket(absl::string_view bucket, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, ""));
  HttpRequest req = Request("CreateBucket", "PUT", bucket, "");
  absl::StatusOr<HttpResponse> resp = impl_->http.Send(req, deadline);
  if (!resp.ok() && absl::StrContains(resp.status().message(), "BucketAlreadyOwnedByYou")) {
    return absl::OkStatus();
  }
  return resp.status();
}

absl::StatusOr<int64_t> S3Client::HeadObject(absl::string_view bucket, absl::string_view key,
                                             absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  HttpRequest req = Request("HeadObject", "HEAD", bucket, key);
  CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
  if (resp.content_length < 0) {
    return absl::InternalError(absl::StrCat("S3 HeadObject ", ObjectName(bucket, key),
                                            ": the answer has no Content-Length"));
  }
  return resp.content_length;
}

absl::Status S3Client::PutObject(absl::string_view bucket, absl::string_view key,
                                 absl::string_view data, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  HttpRequest req = Request("PutObject", "PUT", bucket, key);
  req.body = data;
  req.headers.push_back("Content-MD5: " + ContentMd5(data));
  req.headers.push_back("Content-Type: application/octet-stream");
  return impl_->http.Send(req, deadline).status();
}

absl::Status S3Client::GetObjectRange(absl::string_view bucket, absl::string_view key,
                                      int64_t offset, absl::Span<char> out, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 GetObject ", ObjectName(bucket, key), ": negative offset ", offset));
  }
  if (out.empty()) return absl::OkStatus();
  const int64_t last = offset + static_cast<int64_t>(out.size()) - 1;
  HttpRequest req = Request("GetObject", "GET", bucket, key);
  req.headers.push_back(absl::StrCat("Range: bytes=", offset, "-", last));
  req.body_to_sink = true;
  req.sink = out;
  CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
  // A 200 (the whole object) instead of a 206 is only right when the range was the whole object.
  const bool whole = resp.status == 200;
  if (resp.sink_bytes != static_cast<int64_t>(out.size()) || (whole && offset != 0)) {
    return absl::DataLossError(absl::StrCat(
        "S3 GetObject ", ObjectName(bucket, key), ": bytes [", offset, ", ", last + 1,
        ") requested (", out.size(), " bytes) but the server sent ", resp.sink_bytes,
        whole ? " bytes of the whole object" : " bytes", ": the object is shorter than expected"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(absl::string_view bucket,
                                                            absl::string_view key,
                                                            absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  HttpRequest req =
      Request("CreateMultipartUpload", "POST", bucket, key, S3CanonicalQuery({{"uploads", ""}}));
  CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
  CKPT_ASSIGN_OR_RETURN(XmlElement doc, ResponseXml(req, resp, "InitiateMultipartUploadResult"));
  std::string id = doc.ChildText("UploadId");
  if (id.empty()) {
    return absl::InternalError(absl::StrCat("S3 CreateMultipartUpload ", ObjectName(bucket, key),
                                            ": the answer has no UploadId"));
  }
  return id;
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view bucket, absl::string_view key,
                                                 absl::string_view upload_id, int part_number,
                                                 absl::string_view data, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  HttpRequest req = Request("UploadPart", "PUT", bucket, key,
                            S3CanonicalQuery({{"partNumber", absl::StrCat(part_number)},
                                              {"uploadId", std::string(upload_id)}}));
  req.body = data;
  req.headers.push_back("Content-MD5: " + ContentMd5(data));
  CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
  if (resp.etag.empty()) {
    return absl::InternalError(absl::StrCat("S3 UploadPart ", ObjectName(bucket, key), " part ",
                                            part_number, ": the answer has no ETag"));
  }
  return resp.etag;
}

absl::Status S3Client::CompleteMultipartUpload(absl::string_view bucket, absl::string_view key,
                                               absl::string_view upload_id,
                                               const std::vector<S3CompletedPart>& parts,
                                               absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  std::string body = "<CompleteMultipartUpload>";
  for (const S3CompletedPart& p : parts) {
    absl::StrAppend(&body, "<Part><PartNumber>", p.part_number, "</PartNumber><ETag>",
                    XmlEscape(p.etag), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  HttpRequest req = Request("CompleteMultipartUpload", "POST", bucket, key,
                            S3CanonicalQuery({{"uploadId", std::string(upload_id)}}));
  req.body = body;
  req.headers.push_back("Content-MD5: " + ContentMd5(body));
  CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
  // S3 may answer 200 and still fail: the error then comes in the body.
  absl::StatusOr<XmlElement> doc = ParseXml(resp.body);
  if (doc.ok() && doc->name == "Error") {
    return absl::UnavailableError(
        absl::StrCat("S3 CompleteMultipartUpload ", ObjectName(bucket, key), " upload ", upload_id,
                     ": ", doc->ChildText("Code"), " (", doc->ChildText("Message"), ")"));
  }
  return ResponseXml(req, resp, "CompleteMultipartUploadResult").status();
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  HttpRequest req = Request("AbortMultipartUpload", "DELETE", bucket, key,
                            S3CanonicalQuery({{"uploadId", std::string(upload_id)}}));
  return impl_->http.Send(req, deadline).status();
}

absl::StatusOr<std::vector<S3MultipartUpload>> S3Client::ListMultipartUploads(
    absl::string_view bucket, absl::string_view prefix, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, ""));
  std::vector<S3MultipartUpload> out;
  std::string key_marker, id_marker;
  while (true) {
    std::vector<std::pair<std::string, std::string>> q = {{"uploads", ""},
                                                          {"prefix", std::string(prefix)}};
    if (!key_marker.empty()) q.push_back({"key-marker", key_marker});
    if (!id_marker.empty()) q.push_back({"upload-id-marker", id_marker});
    HttpRequest req = Request("ListMultipartUploads", "GET", bucket, "", S3CanonicalQuery(q));
    CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
    CKPT_ASSIGN_OR_RETURN(XmlElement doc, ResponseXml(req, resp, "ListMultipartUploadsResult"));
    for (const XmlElement* u : doc.Children("Upload")) {
      S3MultipartUpload upload{u->ChildText("Key"), u->ChildText("UploadId")};
      CKPT_ASSIGN_OR_RETURN(upload.initiated,
                            ListingTime(req, bucket, upload.key, *u, "Initiated"));
      out.push_back(std::move(upload));
    }
    key_marker = doc.ChildText("NextKeyMarker");
    id_marker = doc.ChildText("NextUploadIdMarker");
    if (doc.ChildText("IsTruncated") != "true" || key_marker.empty()) return out;
  }
}

absl::StatusOr<S3ListPage> S3Client::ListObjectsV2(absl::string_view bucket,
                                                   absl::string_view prefix,
                                                   absl::string_view continuation_token,
                                                   int max_keys, absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, ""));
  if (max_keys < 1 || max_keys > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("S3 ListObjectsV2 ", ObjectName(bucket, prefix),
                                                   ": max_keys ", max_keys, " is not in 1-1000"));
  }
  std::vector<std::pair<std::string, std::string>> q = {
      {"list-type", "2"}, {"max-keys", absl::StrCat(max_keys)}, {"prefix", std::string(prefix)}};
  if (!continuation_token.empty()) {
    q.push_back({"continuation-token", std::string(continuation_token)});
  }
  HttpRequest req = Request("ListObjectsV2", "GET", bucket, "", S3CanonicalQuery(q));
  CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
  CKPT_ASSIGN_OR_RETURN(XmlElement doc, ResponseXml(req, resp, "ListBucketResult"));
  S3ListPage page;
  for (const XmlElement* c : doc.Children("Contents")) {
    S3ObjectInfo info{c->ChildText("Key"), 0};
    if (!absl::SimpleAtoi(c->ChildText("Size"), &info.size)) {
      return absl::InternalError(absl::StrCat("S3 ListObjectsV2 ", ObjectName(bucket, info.key),
                                              ": the listing has no valid Size"));
    }
    CKPT_ASSIGN_OR_RETURN(info.last_modified,
                          ListingTime(req, bucket, info.key, *c, "LastModified"));
    page.objects.push_back(std::move(info));
  }
  if (doc.ChildText("IsTruncated") == "true") {
    page.next_continuation_token = doc.ChildText("NextContinuationToken");
    if (page.next_continuation_token.empty()) {
      return absl::InternalError(absl::StrCat("S3 ListObjectsV2 ", ObjectName(bucket, prefix),
                                              ": a truncated page without NextContinuationToken"));
    }
  }
  return page;
}

absl::Status S3Client::DeleteObject(absl::string_view bucket, absl::string_view key,
                                    absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, key));
  HttpRequest req = Request("DeleteObject", "DELETE", bucket, key);
  absl::Status s = impl_->http.Send(req, deadline).status();
  // S3 answers 204 for a missing key; some servers say 404 NoSuchKey.
  if (absl::IsNotFound(s) && !absl::StrContains(s.message(), "NoSuchBucket")) {
    return absl::OkStatus();
  }
  return s;
}

absl::Status S3Client::DeleteObjects(absl::string_view bucket, const std::vector<std::string>& keys,
                                     absl::Time deadline) {
  CKPT_RETURN_IF_ERROR(CheckNames(bucket, ""));
  for (const std::string& key : keys) CKPT_RETURN_IF_ERROR(ValidateObjectKey(key));
  constexpr size_t kBatch = 1000;
  for (size_t begin = 0; begin < keys.size(); begin += kBatch) {
    std::string body = "<Delete><Quiet>true</Quiet>";
    for (size_t i = begin; i < std::min(keys.size(), begin + kBatch); ++i) {
      absl::StrAppend(&body, "<Object><Key>", XmlEscape(keys[i]), "</Key></Object>");
    }
    body += "</Delete>";
    HttpRequest req =
        Request("DeleteObjects", "POST", bucket, "", S3CanonicalQuery({{"delete", ""}}));
    req.body = body;
    req.headers.push_back("Content-MD5: " + ContentMd5(body));
    CKPT_ASSIGN_OR_RETURN(HttpResponse resp, impl_->http.Send(req, deadline));
    CKPT_ASSIGN_OR_RETURN(XmlElement doc, ResponseXml(req, resp, "DeleteResult"));
    for (const XmlElement* e : doc.Children("Error")) {
      if (e->ChildText("Code") == "NoSuchKey") continue;
      return absl::UnavailableError(
          absl::StrCat("S3 DeleteObjects ", ObjectName(bucket, e->ChildText("Key")), ": ",
                       e->ChildText("Code"), " (", e->ChildText("Message"), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt
