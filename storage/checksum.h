// Streaming XXH3-64 (seed 0) over a byte range, optionally also per fixed-size block, so
// checksums are computed while data streams through the I/O engine.
#ifndef CKPT_STORAGE_CHECKSUM_H_
#define CKPT_STORAGE_CHECKSUM_H_

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ckpt {

// One-shot XXH3-64 with seed 0.
inline uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

// Feeds bytes in order; produces the hash of everything and (when block_bytes > 0) the hash of
// each consecutive block_bytes block (the last one may be shorter).
class StreamingChecksum {
 public:
  explicit StreamingChecksum(int64_t block_bytes = 0) : block_bytes_(block_bytes) {
    whole_ = XXH3_createState();
    XXH3_64bits_reset(whole_);
    if (block_bytes_ > 0) {
      block_ = XXH3_createState();
      XXH3_64bits_reset(block_);
    }
  }
  ~StreamingChecksum() {
    XXH3_freeState(whole_);
    if (block_ != nullptr) XXH3_freeState(block_);
  }
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t size) {
    XXH3_64bits_update(whole_, data, size);
    if (block_ == nullptr) return;
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const size_t n = std::min<size_t>(size, block_bytes_ - in_block_);
      XXH3_64bits_update(block_, p, n);
      in_block_ += n;
      p += n;
      size -= n;
      if (in_block_ == block_bytes_) {
        blocks_.push_back(XXH3_64bits_digest(block_));
        XXH3_64bits_reset(block_);
        in_block_ = 0;
      }
    }
  }

  uint64_t Whole() const { return XXH3_64bits_digest(whole_); }
  // Block hashes including a final partial block.
  std::vector<uint64_t> Blocks() const {
    std::vector<uint64_t> out = blocks_;
    if (block_ != nullptr && in_block_ > 0) out.push_back(XXH3_64bits_digest(block_));
    return out;
  }

 private:
  int64_t block_bytes_;
  int64_t in_block_ = 0;
  XXH3_state_t* whole_ = nullptr;
  XXH3_state_t* block_ = nullptr;
  std::vector<uint64_t> blocks_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKSUM_H_
