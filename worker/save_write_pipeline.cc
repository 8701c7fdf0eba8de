#include "worker/save_write_pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {
namespace {

// An encoding thread's zstd contexts and buffers, and the encoded chunks of a run: kept for the
// next save (a worker's saves encode into memory touched once, as they copy into its pool).
struct EncodeBuffers {
  CodecScratch scratch;
  std::vector<EncodedChunk> chunks;
};

std::mutex& BuffersMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::vector<std::unique_ptr<EncodeBuffers>>& FreeBuffers() {
  static auto* free = new std::vector<std::unique_ptr<EncodeBuffers>>;
  return *free;
}
constexpr size_t kMaxKeptBuffers = 16;

std::unique_ptr<EncodeBuffers> TakeBuffers() {
  std::lock_guard<std::mutex> lock(BuffersMu());
  if (FreeBuffers().empty()) return std::make_unique<EncodeBuffers>();
  std::unique_ptr<EncodeBuffers> b = std::move(FreeBuffers().back());
  FreeBuffers().pop_back();
  return b;
}

void KeepBuffers(std::unique_ptr<EncodeBuffers> b) {
  std::lock_guard<std::mutex> lock(BuffersMu());
  if (FreeBuffers().size() < kMaxKeptBuffers) FreeBuffers().push_back(std::move(b));
}

}  // namespace

// Encodes a run's chunks: the calling thread and the helpers take chunks in turn.
class SaveWritePipeline::Encoder {
 public:
  explicit Encoder(int threads) {
    for (int t = 0; t < std::max(1, threads); ++t) buffers_.push_back(TakeBuffers());
    for (int t = 1; t < std::max(1, threads); ++t) helpers_.emplace_back([this, t] { Help(t); });
  }
  ~Encoder() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    changed_.notify_all();
    for (std::thread& t : helpers_) t.join();
    for (std::unique_ptr<EncodeBuffers>& b : buffers_) KeepBuffers(std::move(b));
  }

  // Encodes `bytes` raw bytes at `raw` in chunks of params.chunk_bytes; the chunks are
  // chunks()[0, count()).
  void Encode(const char* raw, int64_t bytes, const CodecParams& params) {
    const size_t n = bytes <= 0 ? 0 : static_cast<size_t>((bytes - 1) / params.chunk_bytes + 1);
    std::vector<EncodedChunk>& out = buffers_[0]->chunks;
    if (out.size() < n) out.resize(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = Job{raw, bytes, &params, out.data(), n};
      next_ = 0;
      open_ = !helpers_.empty() && n > 1;
      ++generation_;
    }
    if (open_) changed_.notify_all();
    Work(job_, buffers_[0]->scratch);
    std::unique_lock<std::mutex> lock(mu_);
    open_ = false;  // no helper joins now; wait for those at work
    changed_.wait(lock, [this] { return active_ == 0; });
    count_ = n;
  }
  const EncodedChunk* chunks() const { return buffers_[0]->chunks.data(); }
  size_t count() const { return count_; }

 private:
  struct Job {
    const char* raw = nullptr;
    int64_t bytes = 0;
    const CodecParams* params = nullptr;
    EncodedChunk* out = nullptr;
    size_t n = 0;
  };
  void Work(const Job& job, CodecScratch& scratch) {
    const int64_t cb = job.params->chunk_bytes;
    for (size_t i; (i = next_.fetch_add(1)) < job.n;) {
      const int64_t off = static_cast<int64_t>(i) * cb;
      EncodeChunkInto(job.raw + off, std::min(cb, job.bytes - off), *job.params, scratch,
                      &job.out[i]);
    }
  }
  void Help(int t) {
    int64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [&] { return stop_ || (open_ && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
      const Job job = job_;
      ++active_;
      lock.unlock();
      Work(job, buffers_[t]->scratch);
      lock.lock();
      --active_;
      changed_.notify_all();
    }
  }

  std::vector<std::unique_ptr<EncodeBuffers>> buffers_;  // one per thread; [0]: the caller's
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable changed_;
  Job job_;
  std::atomic<size_t> next_{0};
  bool open_ = false;  // helpers may join the job
  int64_t generation_ = 0;
  int active_ = 0;  // helpers at work
  bool stop_ = false;
  size_t count_ = 0;
};

SaveWritePipeline::SaveWritePipeline(std::vector<DataFileStream*> streams, std::string who,
                                     std::function<absl::Status()> stop,
                                     std::function<void(const SavePipelineEvent&)> trace,
                                     std::vector<CompressedFileStream*> packed, int encode_threads)
    : streams_(std::move(streams)),
      packed_(std::move(packed)),
      who_(std::move(who)),
      stop_(std::move(stop)),
      trace_(std::move(trace)) {
  if (std::any_of(packed_.begin(), packed_.end(), [](auto* p) { return p != nullptr; })) {
    encoder_ = std::make_unique<Encoder>(encode_threads);
  }
  thread_ = std::thread([this] { Run(); });
}

SaveWritePipeline::~SaveWritePipeline() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Fail(absl::CancelledError(absl::StrCat(who_, ": the save's writes were stopped")));
    input_closed_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SaveWritePipeline::Fail(const absl::Status& s) {
  if (error_.ok()) error_ = s;
}

void SaveWritePipeline::Push(SaveWriteItem item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(item));
  }
  changed_.notify_all();
}

void SaveWritePipeline::CloseInput() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    input_closed_ = true;
  }
  changed_.notify_all();
}

absl::Status SaveWritePipeline::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int64_t SaveWritePipeline::bytes_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_written_;
}

absl::Status SaveWritePipeline::AppendLocked(int file, int piece, const void* data, int64_t bytes) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  absl::Status s = streams_[file]->Append(piece, data, bytes);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(who_, ": writing ", streams_[file]->path(), ": ", s.message()));
  }
  return s;
}

absl::Status SaveWritePipeline::WritePacked(SaveWriteItem& item) {
  CompressedFileStream& file = *packed_[item.file];
  if (item.piece < 0 || item.piece >= file.num_pieces()) {
    return absl::InternalError(
        absl::StrCat(who_, ": no piece ", item.piece, " in compressed ", file.path()));
  }
  encoder_->Encode(item.data, item.bytes, file.params(item.piece));
  if (trace_ && item.sequence >= 0) {
    trace_(SavePipelineEvent{SavePipelineEvent::kEncoded, item.sequence});
  }
  item.chunk.Reset();  // encoded: the snapshot may copy the next run into it
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    s = file.AppendEncoded(item.piece, encoder_->chunks(), encoder_->count());
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(who_, ": writing ", file.path(), ": ", s.message()));
  }
  if (trace_ && item.sequence >= 0) {
    trace_(SavePipelineEvent{SavePipelineEvent::kWritten, item.sequence});
  }
  return absl::OkStatus();
}

absl::Status SaveWritePipeline::Write(SaveWriteItem& item) {
  if (stop_) {
    if (absl::Status s = stop_(); !s.ok()) return s;
  }
  if (item.file < static_cast<int>(packed_.size()) && packed_[item.file] != nullptr) {
    return WritePacked(item);
  }
  DataFileStream& stream = *streams_[item.file];
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    s = item.piece < 0 ? stream.AppendData(item.data, item.bytes)
                       : stream.Append(item.piece, item.data, item.bytes);
  }
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(who_, ": writing ", stream.path(), ": ", s.message()));
  }
  if (trace_ && item.sequence >= 0) {
    trace_(SavePipelineEvent{SavePipelineEvent::kWritten, item.sequence});
  }
  return absl::OkStatus();
}

void SaveWritePipeline::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [this] { return !queue_.empty() || input_closed_; });
    if (queue_.empty()) return;  // closed and everything written (or dropped)
    SaveWriteItem item = std::move(queue_.front());
    queue_.pop_front();
    if (!error_.ok()) {  // dropped: its chunk goes back to the pool
      lock.unlock();
      item.chunk.Reset();
      lock.lock();
      changed_.notify_all();
      continue;
    }
    busy_ = true;
    lock.unlock();
    absl::Status s = Write(item);
    item.chunk.Reset();  // back to the pool: the snapshot may copy the next chunk into it
    lock.lock();
    busy_ = false;
    if (s.ok()) {
      bytes_written_ += item.bytes;
    } else {
      Fail(s);
    }
    changed_.notify_all();
  }
}

absl::Status SaveWritePipeline::Drain(const std::function<void(int64_t)>& progress,
                                      const std::function<bool()>& cancelled) {
  constexpr auto kEvery = std::chrono::milliseconds(500);
  auto next_report = std::chrono::steady_clock::now() + kEvery;
  std::unique_lock<std::mutex> lock(mu_);
  while (error_.ok() && (!queue_.empty() || busy_ || !input_closed_)) {
    changed_.wait_until(lock, next_report);
    if (std::chrono::steady_clock::now() < next_report) continue;
    next_report += kEvery;
    const int64_t written = bytes_written_;
    lock.unlock();
    const bool stop = cancelled && cancelled();
    if (progress) progress(written);
    lock.lock();
    if (stop) {
      Fail(absl::CancelledError(absl::StrCat(
          who_, ": the operation was aborted; stopped after writing ", written, " bytes")));
    }
  }
  absl::Status result = error_;
  lock.unlock();
  if (result.ok()) {
    changed_.notify_all();
    thread_.join();  // it returns: the input is closed and the queue empty
  }
  return result;
}

}  // namespace ckpt::worker
