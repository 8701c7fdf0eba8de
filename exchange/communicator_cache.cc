#include "exchange/communicator_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt {

std::string CachedCommunicator::ReuseToken() const {
  return absl::StrCat(instance_, "|", inner_->size(), "|", calls_);
}

absl::Status CachedCommunicator::Track(absl::Status status) {
  ++calls_;
  if (!status.ok() && failure_.ok()) failure_ = status;
  return status;
}

absl::Status CachedCommunicator::Broadcast(void* data, size_t bytes, int root,
                                           absl::Time deadline) {
  return Track(inner_->Broadcast(data, bytes, root, deadline));
}

absl::Status CachedCommunicator::AllGatherV(const void* send, absl::Span<const size_t> counts,
                                            void* recv, absl::Time deadline) {
  return Track(inner_->AllGatherV(send, counts, recv, deadline));
}

absl::Status CachedCommunicator::GatherV(const void* send, size_t send_bytes,
                                         absl::Span<const size_t> counts, void* recv, int root,
                                         absl::Time deadline) {
  return Track(inner_->GatherV(send, send_bytes, counts, recv, root, deadline));
}

absl::Status CachedCommunicator::ScatterV(const void* send, absl::Span<const size_t> counts,
                                          void* recv, size_t recv_bytes, int root,
                                          absl::Time deadline) {
  return Track(inner_->ScatterV(send, counts, recv, recv_bytes, root, deadline));
}

absl::Status CachedCommunicator::AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                           void* recv, absl::Span<const size_t> recv_counts,
                                           absl::Time deadline) {
  return Track(inner_->AllToAllV(send, send_counts, recv, recv_counts, deadline));
}

absl::Status CachedCommunicator::IndexedAllToAllV(
    const void* send, absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
    absl::Span<const std::vector<ByteSlice>> recv_slices, absl::Time deadline) {
  return Track(inner_->IndexedAllToAllV(send, send_slices, recv, recv_slices, deadline));
}

absl::Status CachedCommunicator::AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                                  absl::Span<const RecvBuffer> recvs,
                                                  absl::Time deadline) {
  return Track(inner_->AllToAllVBuffers(sends, recvs, deadline));
}

absl::Status CachedCommunicator::Send(const void* data, size_t bytes, int peer, uint32_t tag,
                                      absl::Time deadline) {
  return Track(inner_->Send(data, bytes, peer, tag, deadline));
}

absl::Status CachedCommunicator::Recv(void* data, size_t bytes, int peer, uint32_t tag,
                                      absl::Time deadline) {
  return Track(inner_->Recv(data, bytes, peer, tag, deadline));
}

absl::Status CachedCommunicator::Barrier(absl::Time deadline) {
  return Track(inner_->Barrier(deadline));
}

std::unique_ptr<CachedCommunicator> CommunicatorCache::Take(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key) continue;
    std::unique_ptr<CachedCommunicator> out = std::move(it->communicator);
    entries_.erase(it);
    ++stats_.taken;
    return out;
  }
  ++stats_.missed;
  return nullptr;
}

void CommunicatorCache::Put(const std::string& key,
                            std::unique_ptr<CachedCommunicator> communicator) {
  if (communicator == nullptr) return;
  // Destroyed outside the lock: closing a Gloo communicator joins its connections.
  std::vector<std::unique_ptr<CachedCommunicator>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!communicator->failure().ok() || max_entries_ == 0) {
      ++stats_.refused;
      dropped.push_back(std::move(communicator));
    } else {
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->key == key) {
          dropped.push_back(std::move(it->communicator));
          it = entries_.erase(it);
          ++stats_.evicted;
        } else {
          ++it;
        }
      }
      while (entries_.size() >= max_entries_) {
        dropped.push_back(std::move(entries_.front().communicator));
        entries_.pop_front();
        ++stats_.evicted;
      }
      entries_.push_back(Entry{key, std::move(communicator)});
      ++stats_.kept;
    }
  }
}

size_t CommunicatorCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

CommunicatorCacheStats CommunicatorCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ckpt
