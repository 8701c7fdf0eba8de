// Streaming XXH3-64 (seed 0), either over a whole byte range or per fixed-size block, computed
// while data streams through the I/O engine. A range that spans several blocks is summarized by
// CombineBlockHashes (a hash list), so every byte is hashed exactly once.
#ifndef CKPT_STORAGE_CHECKSUM_H_
#define CKPT_STORAGE_CHECKSUM_H_

#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash exports runtime-dispatched variants (AVX2/AVX-512 when the CPU has them);
// same results, ~1.5x faster than the baseline SSE2 build on this project's machines.
#include <xxh_x86dispatch.h>
#define CKPT_XXH3_64BITS XXH3_64bits_dispatch
#define CKPT_XXH3_64BITS_UPDATE XXH3_64bits_update_dispatch
#else
#define CKPT_XXH3_64BITS XXH3_64bits
#define CKPT_XXH3_64BITS_UPDATE XXH3_64bits_update
#endif

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

// One-shot XXH3-64 with seed 0.
inline uint64_t Xxh3(const void* data, size_t size) { return CKPT_XXH3_64BITS(data, size); }

// XXH3-64 of the block hashes, each encoded as 8 little-endian bytes.
inline uint64_t CombineBlockHashes(const std::vector<uint64_t>& blocks) {
  std::string bytes(blocks.size() * 8, '\0');
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (int b = 0; b < 8; ++b) bytes[i * 8 + b] = static_cast<char>((blocks[i] >> (8 * b)) & 0xFF);
  }
  return Xxh3(bytes.data(), bytes.size());
}

// The checksum of a range as the manifest records it: the XXH3-64 of the bytes when they fit
// in one block (or when block_bytes is 0), else CombineBlockHashes of the blocks.
inline uint64_t RangeChecksum(const std::vector<uint64_t>& blocks) {
  if (blocks.empty()) return Xxh3(nullptr, 0);
  return blocks.size() == 1 ? blocks[0] : CombineBlockHashes(blocks);
}

// Feeds bytes in order. With block_bytes == 0 it hashes the whole range; otherwise it hashes
// each consecutive block_bytes block (the last may be shorter) and Whole() is RangeChecksum of
// the blocks.
class StreamingChecksum {
 public:
  explicit StreamingChecksum(int64_t block_bytes = 0) : block_bytes_(block_bytes) {
    state_ = XXH3_createState();
    XXH3_64bits_reset(state_);
  }
  ~StreamingChecksum() { XXH3_freeState(state_); }
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t size) {
    if (block_bytes_ == 0) {
      CKPT_XXH3_64BITS_UPDATE(state_, data, size);
      return;
    }
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const size_t n = std::min<size_t>(size, block_bytes_ - in_block_);
      CKPT_XXH3_64BITS_UPDATE(state_, p, n);
      in_block_ += n;
      p += n;
      size -= n;
      if (in_block_ == block_bytes_) {
        blocks_.push_back(XXH3_64bits_digest(state_));
        XXH3_64bits_reset(state_);
        in_block_ = 0;
      }
    }
  }

  uint64_t Whole() const {
    return block_bytes_ == 0 ? XXH3_64bits_digest(state_) : RangeChecksum(Blocks());
  }
  // Block hashes including a final partial block (empty when block_bytes == 0).
  std::vector<uint64_t> Blocks() const {
    std::vector<uint64_t> out = blocks_;
    if (block_bytes_ > 0 && in_block_ > 0) out.push_back(XXH3_64bits_digest(state_));
    return out;
  }

 private:
  int64_t block_bytes_;
  int64_t in_block_ = 0;
  XXH3_state_t* state_ = nullptr;
  std::vector<uint64_t> blocks_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKSUM_H_
