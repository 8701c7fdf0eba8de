// Uploads a stream of bytes as one S3 object through a multipart upload: parts of a fixed
// size, several in flight on threads of its own, bounded memory, aborted on any error.
#ifndef CKPT_STORAGE_S3_S3_MULTIPART_WRITER_H_
#define CKPT_STORAGE_S3_S3_MULTIPART_WRITER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "storage/s3/s3_client.h"

namespace ckpt {

// Part size and parallelism of an S3MultipartWriter.
struct S3MultipartWriterOptions {
  // Every part but the last has this size; S3 (and Swift's s3api by default) refuse parts
  // under 5 MiB except the last.
  int64_t part_size = int64_t{8} << 20;
  // Parts uploading at once. Memory: at most parts_in_flight + 1 part buffers (one filling).
  int parts_in_flight = 4;
  // How long the abort after a failure may take (it runs past the writer's deadline).
  absl::Duration abort_timeout = absl::Seconds(30);
};

// Not thread-safe: one thread calls Write, then Finish or Abort. The object appears only when
// Finish succeeds; on any failure (or destruction before Finish) the upload is aborted, so the
// server keeps no parts (unless the abort itself fails: the error then names the upload id,
// which S3Client::ListMultipartUploads finds for gc).
class S3MultipartWriter {
 public:
  // Begins the upload (CreateMultipartUpload). Every request is bounded by `deadline`.
  static absl::StatusOr<std::unique_ptr<S3MultipartWriter>> Start(S3Client* client,
                                                                  std::string bucket,
                                                                  std::string key,
                                                                  S3MultipartWriterOptions options,
                                                                  absl::Time deadline);
  ~S3MultipartWriter();
  S3MultipartWriter(const S3MultipartWriter&) = delete;
  S3MultipartWriter& operator=(const S3MultipartWriter&) = delete;

  // Appends `data`; blocks while every part buffer is uploading. Returns the first failure of
  // any part (naming the bucket, key and part), after aborting the upload.
  absl::Status Write(absl::string_view data);
  // Uploads the last part, waits for all, completes the upload.
  absl::Status Finish();
  // Abandons the upload and removes its parts from the server.
  absl::Status Abort();

  const std::string& upload_id() const { return upload_id_; }
  int64_t bytes_written() const { return bytes_written_; }
  // The most part buffers allocated at once (at most parts_in_flight + 1) and the most parts
  // uploading at once (at most parts_in_flight): the memory and parallelism bounds.
  int peak_buffers() const;
  int peak_uploading() const;

 private:
  struct Part {
    int number = 0;
    std::unique_ptr<std::string> data;
  };

  S3MultipartWriter(S3Client* client, std::string bucket, std::string key,
                    S3MultipartWriterOptions options, absl::Time deadline, std::string upload_id);
  void UploadLoop();
  absl::Status Enqueue();         // hands the filling buffer to the uploaders
  absl::Status WaitForUploads();  // until nothing is queued or uploading; the first error
  absl::Status FailAndAbort(absl::Status error);
  void StopThreads();

  S3Client* const client_;
  const std::string bucket_;
  const std::string key_;
  const S3MultipartWriterOptions options_;
  const absl::Time deadline_;
  const std::string upload_id_;

  std::unique_ptr<std::string> filling_;  // owned by the writing thread
  int next_part_ = 1;
  int64_t bytes_written_ = 0;
  bool done_ = false;  // finished or aborted

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Part> queue_;
  std::vector<std::unique_ptr<std::string>> free_;
  int buffers_ = 0;  // allocated part buffers, at most parts_in_flight + 1
  int uploading_ = 0;
  int peak_uploading_ = 0;
  bool stop_ = false;
  absl::Status error_;
  std::map<int, std::string> etags_;
  std::vector<std::thread> threads_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_S3_S3_MULTIPART_WRITER_H_
