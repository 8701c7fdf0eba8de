// The writing half of a pipelined save (worker/save_executor.h): a thread that takes the chunks
// the snapshot copied into the worker's host pool, in the order they were pushed, hashes and
// writes each into its data file (DataFileStream: O_DIRECT for aligned runs where allowed) and
// returns the chunk to the pool, while the snapshot copies the next ones. The pool's bound is
// the pipeline's depth: once every chunk is queued or being written, the snapshot waits for the
// writer to return one. The same shape as the device staging (worker/staging_pipeline.h), with
// a host memcpy in place of the device copy and a writer thread in place of the caller.
//
// Files of a compressed save (storage/piece_compression_stream.h) take the same chunks, each
// holding a run of one piece's raw bytes: the writer encodes the run (storage/piece_codec.h,
// chunk by chunk, on itself and helper threads, each chunk's raw XXH3-64 taken while it is
// encoded), returns the pool chunk, then writes the encoded chunks, hashing the stored bytes as
// they go: encode and write of chunk k overlap the copy of chunk k+1, and the disk writes run k
// while run k+1 is encoded.
//
// Errors name `who` (rank and job) and the file. No gRPC, no logging.
#ifndef CKPT_WORKER_SAVE_WRITE_PIPELINE_H_
#define CKPT_WORKER_SAVE_WRITE_PIPELINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "storage/data_file_stream.h"
#include "storage/piece_codec.h"
#include "storage/piece_compression_stream.h"
#include "worker/host_buffer_pool.h"

namespace ckpt::worker {

// A step of the pipeline, for logs and tests: chunk `chunk` (numbered in the order the save
// copied them) was copied into the pool, encoded (a compressed file's run: its pool chunk is
// returned right after, before the write), or written to its file (a raw chunk's pool chunk
// not returned yet).
struct SavePipelineEvent {
  enum Kind { kCopied, kEncoded, kWritten };
  Kind kind = kCopied;
  int64_t chunk = 0;
};

// One write, in order: bytes [data, data + bytes) of file `file`.
struct SaveWriteItem {
  int file = 0;
  // -1: the next run of the file's data section (AppendData); else Append (a compressed file:
  // the next run of the piece's raw bytes, a whole number of codec chunks unless it ends it)
  int piece = -1;
  const char* data = nullptr;
  int64_t bytes = 0;
  HostBufferPool::Chunk chunk;  // holds `data` (empty: lent memory, written in place)
  int64_t sequence = -1;        // the chunk's number (-1: not a pool chunk)
};

// See the file comment. Push and CloseInput from one thread (the snapshot); AppendLocked from
// any.
class SaveWritePipeline {
 public:
  // `streams`: the save's open data files, by file index (they must outlive the pipeline).
  // `stop` (may be empty) is asked before each write; its error ends the writes (the items
  // still queued are dropped and their chunks returned). `trace` (may be empty) hears each
  // chunk written.
  // `packed` (by file index, null for the files in `streams`; may be empty): the compressed
  // files, whose items are encoded on the writer and `encode_threads` - 1 helper threads.
  SaveWritePipeline(std::vector<DataFileStream*> streams, std::string who,
                    std::function<absl::Status()> stop,
                    std::function<void(const SavePipelineEvent&)> trace,
                    std::vector<CompressedFileStream*> packed = {}, int encode_threads = 1);
  SaveWritePipeline(const SaveWritePipeline&) = delete;
  SaveWritePipeline& operator=(const SaveWritePipeline&) = delete;
  // Stops the writes (Cancelled), drops what is queued and joins the thread.
  ~SaveWritePipeline();

  void Push(SaveWriteItem item);
  // No more items will be pushed.
  void CloseInput();
  // The first error (OK while none).
  absl::Status status() const;
  int64_t bytes_written() const;

  // Appends to a stream under the lock the writer thread takes for its writes (the device
  // staging's chunks go straight into the same files). Errors name who and the file.
  absl::Status AppendLocked(int file, int piece, const void* data, int64_t bytes);

  // Waits until every item pushed is written (CloseInput must have been called), calling
  // `progress(bytes written)` about twice a second; `cancelled` (may be empty), asked as often,
  // stops the writes with Cancelled. Returns the first error.
  absl::Status Drain(const std::function<void(int64_t)>& progress,
                     const std::function<bool()>& cancelled);

 private:
  class Encoder;  // encodes a run's chunks on the writer and helper threads

  void Run();
  absl::Status Write(SaveWriteItem& item);
  absl::Status WritePacked(SaveWriteItem& item);
  void Fail(const absl::Status& s);  // keeps the first error (mu_ held)

  const std::vector<DataFileStream*> streams_;
  const std::vector<CompressedFileStream*> packed_;
  std::unique_ptr<Encoder> encoder_;  // with packed files
  const std::string who_;
  const std::function<absl::Status()> stop_;
  const std::function<void(const SavePipelineEvent&)> trace_;

  mutable std::mutex mu_;
  std::condition_variable changed_;  // an item pushed, written or dropped; input closed
  std::deque<SaveWriteItem> queue_;
  bool input_closed_ = false;
  bool busy_ = false;  // the writer holds an item
  absl::Status error_;
  int64_t bytes_written_ = 0;
  std::mutex streams_mu_;  // one write into the streams at a time
  std::thread thread_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SAVE_WRITE_PIPELINE_H_
