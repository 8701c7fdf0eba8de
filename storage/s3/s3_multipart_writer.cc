#include "storage/s3/s3_multipart_writer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<S3MultipartWriter>> S3MultipartWriter::Start(
    S3Client* client, std::string bucket, std::string key, S3MultipartWriterOptions options,
    absl::Time deadline) {
  if (options.part_size < 1 || options.parts_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "S3 multipart upload of s3://", bucket, "/", key, ": part_size ", options.part_size,
        " and parts_in_flight ", options.parts_in_flight, " must be positive"));
  }
  CKPT_ASSIGN_OR_RETURN(std::string upload_id,
                        client->CreateMultipartUpload(bucket, key, deadline));
  return std::unique_ptr<S3MultipartWriter>(new S3MultipartWriter(
      client, std::move(bucket), std::move(key), options, deadline, std::move(upload_id)));
}

S3MultipartWriter::S3MultipartWriter(S3Client* client, std::string bucket, std::string key,
                                     S3MultipartWriterOptions options, absl::Time deadline,
                                     std::string upload_id)
    : client_(client),
      bucket_(std::move(bucket)),
      key_(std::move(key)),
      options_(options),
      deadline_(deadline),
      upload_id_(std::move(upload_id)),
      filling_(std::make_unique<std::string>()),
      buffers_(1) {
  filling_->reserve(static_cast<size_t>(options_.part_size));
  for (int i = 0; i < options_.parts_in_flight; ++i)
    threads_.emplace_back([this] { UploadLoop(); });
}

S3MultipartWriter::~S3MultipartWriter() {
  if (!done_) Abort().IgnoreError();
  StopThreads();
}

void S3MultipartWriter::StopThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void S3MultipartWriter::UploadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    Part part = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.ok();  // a part failed: send nothing more
    ++uploading_;
    peak_uploading_ = std::max(peak_uploading_, uploading_);
    lock.unlock();
    absl::StatusOr<std::string> etag =
        skip ? absl::CancelledError("skipped")
             : client_->UploadPart(bucket_, key_, upload_id_, part.number, *part.data, deadline_);
    part.data->clear();
    lock.lock();
    --uploading_;
    if (etag.ok()) {
      etags_[part.number] = *std::move(etag);
    } else if (error_.ok()) {
      error_ = WithContext(etag.status(),
                           absl::StrCat("part ", part.number, " of upload ", upload_id_, ": "));
    }
    free_.push_back(std::move(part.data));
    cv_.notify_all();
  }
}

absl::Status S3MultipartWriter::Enqueue() {
  std::unique_lock<std::mutex> lock(mu_);
  queue_.push_back(Part{next_part_++, std::move(filling_)});
  cv_.notify_all();
  cv_.wait(lock, [&] {
    return !error_.ok() || !free_.empty() || buffers_ < options_.parts_in_flight + 1;
  });
  if (!error_.ok()) return error_;
  if (!free_.empty()) {
    filling_ = std::move(free_.back());
    free_.pop_back();
  } else {
    ++buffers_;
    filling_ = std::make_unique<std::string>();
    filling_->reserve(static_cast<size_t>(options_.part_size));
  }
  return absl::OkStatus();
}

absl::Status S3MultipartWriter::Write(absl::string_view data) {
  if (done_) {
    return absl::FailedPreconditionError(absl::StrCat("S3 multipart upload of s3://", bucket_, "/",
                                                      key_, ": Write after Finish or Abort"));
  }
  while (!data.empty()) {
    const size_t room = static_cast<size_t>(options_.part_size) - filling_->size();
    const size_t n = std::min(room, data.size());
    filling_->append(data.data(), n);
    data.remove_prefix(n);
    bytes_written_ += static_cast<int64_t>(n);
    if (filling_->size() == static_cast<size_t>(options_.part_size)) {
      if (absl::Status s = Enqueue(); !s.ok()) return FailAndAbort(s);
    }
  }
  return absl::OkStatus();
}

absl::Status S3MultipartWriter::WaitForUploads() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && uploading_ == 0; });
  return error_;
}

absl::Status S3MultipartWriter::Finish() {
  if (done_) {
    return absl::FailedPreconditionError(absl::StrCat("S3 multipart upload of s3://", bucket_, "/",
                                                      key_, ": Finish after Finish or Abort"));
  }
  // The last part (possibly empty when nothing was written: an upload needs one part).
  if (!filling_->empty() || next_part_ == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Part{next_part_++, std::move(filling_)});
    filling_ = std::make_unique<std::string>();
    cv_.notify_all();
  }
  if (absl::Status s = WaitForUploads(); !s.ok()) return FailAndAbort(s);
  std::vector<S3CompletedPart> parts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [number, etag] : etags_) parts.push_back({number, etag});
  }
  absl::Status s = client_->CompleteMultipartUpload(bucket_, key_, upload_id_, parts, deadline_);
  if (!s.ok()) return FailAndAbort(s);
  done_ = true;
  StopThreads();
  return absl::OkStatus();
}

int S3MultipartWriter::peak_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_;
}

int S3MultipartWriter::peak_uploading() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_uploading_;
}

absl::Status S3MultipartWriter::FailAndAbort(absl::Status error) {
  absl::Status abort = Abort();
  if (abort.ok()) return error;
  return absl::Status(error.code(), absl::StrCat(error.message(), "; then the abort of upload ",
                                                 upload_id_, " failed too: ", abort.message()));
}

absl::Status S3MultipartWriter::Abort() {
  if (done_) return absl::OkStatus();
  done_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = absl::CancelledError("aborted");  // queued parts are skipped
  }
  WaitForUploads().IgnoreError();
  StopThreads();
  return client_->AbortMultipartUpload(bucket_, key_, upload_id_,
                                       absl::Now() + options_.abort_timeout);
}

}  // namespace ckpt
