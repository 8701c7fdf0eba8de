#include "exchange/gloo/gloo_communicator.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "exchange/gloo/gloo_store_adapter.h"
#include "exchange/slice_copy.h"

namespace ckpt {
namespace {

// Point-to-point messages use slots above every collective slot.
constexpr uint64_t kP2PSlotBase = uint64_t{1} << 48;

// One message to or from one peer.
struct Transfer {
  int peer;
  char* ptr;
  size_t bytes;
};

// Whether a Gloo exception's text reports a wait that timed out (rather than a broken pair).
bool IsTimeout(absl::string_view what) {
  return absl::StrContains(what, "Timed out") || absl::StrContains(what, "timed out");
}

std::chrono::milliseconds RemainingMs(absl::Time deadline) {
  int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return std::chrono::milliseconds(std::max<int64_t>(1, ms));
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::string group,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : rank_(rank),
        size_(size),
        group_(std::move(group)),
        device_(std::move(device)),
        context_(std::move(context)) {}

  ~GlooCommunicator() override {
    try {
      context_.reset();
      device_.reset();
    } catch (...) {
      // Nothing may escape a destructor; the sockets are closed either way.
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  absl::string_view backend_name() const override { return "gloo"; }

  // Flat (root sends to every rank) for small payloads or groups of two; otherwise a pipelined
  // chain root -> root+1 -> ... in chunks, so the root's link carries the payload once and
  // every hop forwards chunk i while receiving chunk i+1.
  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo broadcast";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "root", root, size_));
    if (size_ >= 3 && bytes >= kChainMinBytes) {
      return ChainBroadcast(kOp, static_cast<char*>(data), bytes, root, deadline);
    }
    uint64_t slot = NextSlot();
    std::vector<Transfer> sends, recvs;
    if (bytes > 0) {
      if (rank_ == root) {
        for (int p = 0; p < size_; ++p) {
          if (p != rank_) sends.push_back({p, static_cast<char*>(data), bytes});
        }
      } else {
        recvs.push_back({root, static_cast<char*>(data), bytes});
      }
    }
    return Run(kOp, slot, sends, recvs, deadline);
  }

  absl::Status AllGatherV(const void* send, absl::Span<const size_t> counts, void* recv,
                          absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo all_gather_v";
    CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size_));
    uint64_t slot = NextSlot();
    std::vector<size_t> offsets = Offsets(counts);
    char* out = static_cast<char*>(recv);
    const size_t mine = counts[rank_];
    if (mine > 0 && out + offsets[rank_] != send) std::memmove(out + offsets[rank_], send, mine);
    std::vector<Transfer> sends, recvs;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (mine > 0) sends.push_back({p, out + offsets[rank_], mine});
      if (counts[p] > 0) recvs.push_back({p, out + offsets[p], counts[p]});
    }
    return Run(kOp, slot, sends, recvs, deadline);
  }

  absl::Status GatherV(const void* send, size_t send_bytes, absl::Span<const size_t> counts,
                       void* recv, int root, absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo gather_v";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "root", root, size_));
    uint64_t slot = NextSlot();
    std::vector<Transfer> sends, recvs;
    if (rank_ == root) {
      CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size_));
      if (counts[rank_] != send_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            kOp, ": root sends ", send_bytes, " bytes but counts[root] is ", counts[rank_]));
      }
      std::vector<size_t> offsets = Offsets(counts);
      char* out = static_cast<char*>(recv);
      if (send_bytes > 0) std::memmove(out + offsets[rank_], send, send_bytes);
      for (int p = 0; p < size_; ++p) {
        if (p != rank_ && counts[p] > 0) recvs.push_back({p, out + offsets[p], counts[p]});
      }
    } else if (send_bytes > 0) {
      sends.push_back({root, const_cast<char*>(static_cast<const char*>(send)), send_bytes});
    }
    return Run(kOp, slot, sends, recvs, deadline);
  }

  absl::Status ScatterV(const void* send, absl::Span<const size_t> counts, void* recv,
                        size_t recv_bytes, int root, absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo scatter_v";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "root", root, size_));
    uint64_t slot = NextSlot();
    std::vector<Transfer> sends, recvs;
    if (rank_ == root) {
      CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size_));
      if (counts[rank_] != recv_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            kOp, ": root receives ", recv_bytes, " bytes but counts[root] is ", counts[rank_]));
      }
      std::vector<size_t> offsets = Offsets(counts);
      const char* in = static_cast<const char*>(send);
      if (recv_bytes > 0) std::memmove(recv, in + offsets[rank_], recv_bytes);
      for (int p = 0; p < size_; ++p) {
        if (p != rank_ && counts[p] > 0) {
          sends.push_back({p, const_cast<char*>(in + offsets[p]), counts[p]});
        }
      }
    } else if (recv_bytes > 0) {
      recvs.push_back({root, static_cast<char*>(recv), recv_bytes});
    }
    return Run(kOp, slot, sends, recvs, deadline);
  }

  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo all_to_all_v";
    CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "send_counts", send_counts, size_));
    CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "recv_counts", recv_counts, size_));
    if (send_counts[rank_] != recv_counts[rank_]) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": rank ", rank_, " sends itself ",
                                                     send_counts[rank_], " bytes but expects ",
                                                     recv_counts[rank_]));
    }
    uint64_t slot = NextSlot();
    std::vector<size_t> send_offsets = Offsets(send_counts);
    std::vector<size_t> recv_offsets = Offsets(recv_counts);
    char* in = const_cast<char*>(static_cast<const char*>(send));
    char* out = static_cast<char*>(recv);
    std::vector<Transfer> sends, recvs;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (send_counts[p] > 0) sends.push_back({p, in + send_offsets[p], send_counts[p]});
      if (recv_counts[p] > 0) recvs.push_back({p, out + recv_offsets[p], recv_counts[p]});
    }
    // The rank's own block is copied while Gloo's loop thread moves the peers' bytes.
    return Run(kOp, slot, sends, recvs, deadline, [&] {
      if (send_counts[rank_] > 0) {
        std::memmove(out + recv_offsets[rank_], in + send_offsets[rank_], send_counts[rank_]);
      }
    });
  }

  absl::Status AllToAllVBuffers(absl::Span<const SendBuffer> sends,
                                absl::Span<const RecvBuffer> recvs, absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo all_to_all_v_buffers";
    if (static_cast<int>(sends.size()) != size_ || static_cast<int>(recvs.size()) != size_) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", sends.size(), " sends and ",
                                                     recvs.size(), " receives for a group of ",
                                                     size_, " ranks"));
    }
    if (sends[rank_].bytes != recvs[rank_].bytes) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": rank ", rank_, " sends itself ",
                                                     sends[rank_].bytes, " bytes but expects ",
                                                     recvs[rank_].bytes));
    }
    uint64_t slot = NextSlot();
    std::vector<Transfer> send_list, recv_list;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (sends[p].bytes > 0) {
        send_list.push_back(
            {p, const_cast<char*>(static_cast<const char*>(sends[p].data)), sends[p].bytes});
      }
      if (recvs[p].bytes > 0) {
        recv_list.push_back({p, static_cast<char*>(recvs[p].data), recvs[p].bytes});
      }
    }
    return Run(kOp, slot, send_list, recv_list, deadline, [&] {
      if (sends[rank_].bytes > 0 && recvs[rank_].data != sends[rank_].data) {
        std::memmove(recvs[rank_].data, sends[rank_].data, sends[rank_].bytes);
      }
    });
  }

  absl::Status IndexedAllToAllV(const void* send,
                                absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
                                absl::Span<const std::vector<ByteSlice>> recv_slices,
                                absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo indexed_all_to_all_v";
    CKPT_RETURN_IF_ERROR(CheckSlices(kOp, "send_slices", send_slices, size_));
    CKPT_RETURN_IF_ERROR(CheckSlices(kOp, "recv_slices", recv_slices, size_));
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    CKPT_RETURN_IF_ERROR(CopySlices(in, send_slices[rank_], out, recv_slices[rank_],
                                    absl::StrCat(kOp, " (rank ", rank_, " to itself)")));
    uint64_t slot = NextSlot();
    // A single slice goes straight from/to the user's buffer; several are packed/unpacked
    // through a per-peer staging buffer.
    std::vector<std::vector<char>> send_staging(size_), recv_staging(size_);
    std::vector<Transfer> sends, recvs;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const std::vector<ByteSlice>& ss = send_slices[p];
      size_t send_total = TotalBytes(ss);
      if (send_total > 0) {
        if (ss.size() == 1) {
          sends.push_back({p, const_cast<char*>(in + ss[0].offset), send_total});
        } else {
          send_staging[p].resize(send_total);
          PackSlices(in, ss, send_staging[p].data());
          sends.push_back({p, send_staging[p].data(), send_total});
        }
      }
      const std::vector<ByteSlice>& rs = recv_slices[p];
      size_t recv_total = TotalBytes(rs);
      if (recv_total > 0) {
        if (rs.size() == 1) {
          recvs.push_back({p, out + rs[0].offset, recv_total});
        } else {
          recv_staging[p].resize(recv_total);
          recvs.push_back({p, recv_staging[p].data(), recv_total});
        }
      }
    }
    CKPT_RETURN_IF_ERROR(Run(kOp, slot, sends, recvs, deadline));
    for (int p = 0; p < size_; ++p) {
      if (!recv_staging[p].empty()) UnpackSlices(recv_staging[p].data(), recv_slices[p], out);
    }
    return absl::OkStatus();
  }

  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo send";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "peer", peer, size_));
    if (peer == rank_) return absl::InvalidArgumentError("gloo send: a rank cannot send to itself");
    if (bytes == 0) return absl::OkStatus();
    return Run(kOp, kP2PSlotBase + tag,
               {{peer, const_cast<char*>(static_cast<const char*>(data)), bytes}}, {}, deadline);
  }

  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t tag,
                    absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo recv";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "peer", peer, size_));
    if (peer == rank_)
      return absl::InvalidArgumentError("gloo recv: a rank cannot receive from itself");
    if (bytes == 0) return absl::OkStatus();
    return Run(kOp, kP2PSlotBase + tag, {}, {{peer, static_cast<char*>(data), bytes}}, deadline);
  }

  // Dissemination barrier: ceil(log2 N) rounds of one-byte messages. Every round's receive is
  // posted before the first send. Gloo writes an unbound-buffer message only once the receiver
  // has announced the matching receive, so a receive posted when its round starts would add a
  // notify/announce round trip to every round; posted up front, a faster peer's message for a
  // later round goes out as soon as that peer sends it.
  absl::Status Barrier(absl::Time deadline) override {
    constexpr absl::string_view kOp = "gloo barrier";
    if (!broken_.ok()) return Unusable(kOp);
    std::vector<int> steps;
    for (int step = 1; step < size_; step *= 2) steps.push_back(step);
    if (steps.empty()) return absl::OkStatus();
    const uint64_t base = next_slot_;
    next_slot_ += steps.size();
    char token = 1;
    std::vector<char> sinks(steps.size(), 0);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs, sends;
    Transfer current{};
    bool current_is_send = false;
    absl::Status status;
    try {
      for (size_t k = 0; k < steps.size(); ++k) {
        current = {(rank_ - steps[k] + size_) % size_, &sinks[k], 1};
        recvs.push_back(context_->createUnboundBuffer(&sinks[k], 1));
        recvs.back()->recv(current.peer, base + k);
      }
      sends.push_back(context_->createUnboundBuffer(&token, 1));
      for (size_t k = 0; k < steps.size() && status.ok(); ++k) {
        current = {(rank_ + steps[k]) % size_, &token, 1};
        current_is_send = true;
        sends.back()->send(current.peer, base + k);
        current = {(rank_ - steps[k] + size_) % size_, &sinks[k], 1};
        current_is_send = false;
        if (!recvs[k]->waitRecv(nullptr, RemainingMs(deadline))) {
          status = absl::AbortedError(Describe(kOp, current, false, "was aborted"));
        }
      }
      for (size_t k = 0; k < steps.size() && status.ok(); ++k) {
        current = {(rank_ + steps[k]) % size_, &token, 1};
        current_is_send = true;
        if (!sends.back()->waitSend(nullptr, RemainingMs(deadline))) {
          status = absl::AbortedError(Describe(kOp, current, true, "was aborted"));
        }
      }
    } catch (const std::exception& e) {
      status = Classify(kOp, current, current_is_send, e.what(), deadline);
    } catch (...) {
      status = absl::InternalError(
          Describe(kOp, current, current_is_send, "failed with an unknown exception"));
    }
    if (!status.ok()) Break(status);
    return status;
  }

 private:
  static std::vector<size_t> Offsets(absl::Span<const size_t> counts) {
    std::vector<size_t> offsets(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
    return offsets;
  }

  uint64_t NextSlot() { return next_slot_++; }

  absl::Status Unusable(absl::string_view op) const {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " on rank ", rank_, " of group '", group_,
                     "': communicator unusable after an earlier failure: ", broken_.message()));
  }

  // Posts every receive and send, runs `local_work` (the rank's copy to itself) while Gloo's
  // loop thread moves the bytes, then waits for each message (one unbound buffer per message,
  // so a failure names its peer). On failure the group is closed so peers fail fast too.
  absl::Status Run(absl::string_view op, uint64_t slot, const std::vector<Transfer>& sends,
                   const std::vector<Transfer>& recvs, absl::Time deadline,
                   const std::function<void()>& local_work = nullptr) {
    if (!broken_.ok()) return Unusable(op);
    if (sends.empty() && recvs.empty()) {
      if (local_work) local_work();
      return absl::OkStatus();
    }
    struct Pending {
      const Transfer* transfer;
      bool is_send;
      std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    };
    std::vector<Pending> pending;
    pending.reserve(sends.size() + recvs.size());
    absl::Status status;
    const Transfer* current = nullptr;
    bool current_is_send = false;
    size_t waiting = pending.capacity();  // index of the message being waited for
    try {
      for (const Transfer& t : recvs) {
        current = &t;
        current_is_send = false;
        pending.push_back({&t, false, context_->createUnboundBuffer(t.ptr, t.bytes)});
        pending.back().buffer->recv(t.peer, slot);
      }
      for (const Transfer& t : sends) {
        current = &t;
        current_is_send = true;
        pending.push_back({&t, true, context_->createUnboundBuffer(t.ptr, t.bytes)});
        pending.back().buffer->send(t.peer, slot);
      }
      if (local_work) local_work();
      for (waiting = 0; waiting < pending.size(); ++waiting) {
        Pending& p = pending[waiting];
        current = p.transfer;
        current_is_send = p.is_send;
        bool done = p.is_send ? p.buffer->waitSend(nullptr, RemainingMs(deadline))
                              : p.buffer->waitRecv(nullptr, RemainingMs(deadline));
        if (!done) {
          status = absl::AbortedError(Describe(op, *p.transfer, p.is_send, "was aborted"));
          break;
        }
      }
    } catch (const std::exception& e) {
      status = Classify(op, *current, current_is_send, e.what(), deadline);
      // A peer that failed first may have made another close on us (Break below), and the
      // messages are waited for in peer order: name every peer whose message failed too.
      std::string others;
      const absl::Time probe_until = std::min(deadline, absl::Now() + kFailureProbe);
      for (size_t i = waiting + 1; i < pending.size(); ++i) {
        const Pending& p = pending[i];
        try {
          if (p.is_send) {
            p.buffer->waitSend(nullptr, RemainingMs(probe_until));
          } else {
            p.buffer->waitRecv(nullptr, RemainingMs(probe_until));
          }
        } catch (const std::exception& other) {
          if (IsTimeout(other.what())) continue;  // still in flight
          absl::StrAppend(&others, "; also ",
                          p.is_send ? "sending to rank " : "receiving from rank ", p.transfer->peer,
                          " failed: ", other.what());
        } catch (...) {
        }
      }
      if (!others.empty())
        status = absl::Status(status.code(), absl::StrCat(status.message(), others));
    } catch (...) {
      status = absl::InternalError(
          Describe(op, *current, current_is_send, "failed with an unknown exception"));
    }
    if (!status.ok()) Break(status);
    return status;
  }

  // How long a failed Run looks for other peers' messages failing too.
  static constexpr absl::Duration kFailureProbe = absl::Milliseconds(200);
  static constexpr size_t kChainMinBytes = size_t{4} << 20;
  static constexpr size_t kChainChunkBytes = size_t{1} << 20;

  absl::Status ChainBroadcast(absl::string_view op, char* data, size_t bytes, int root,
                              absl::Time deadline) {
    const size_t chunks = (bytes + kChainChunkBytes - 1) / kChainChunkBytes;
    // One slot per chunk, reserved identically on every rank.
    const uint64_t base = next_slot_;
    next_slot_ += chunks;
    if (!broken_.ok()) return Unusable(op);
    const int pos = (rank_ - root + size_) % size_;
    const int prev = (rank_ - 1 + size_) % size_, next = (rank_ + 1) % size_;
    const bool has_prev = pos != 0, has_next = pos != size_ - 1;
    auto chunk = [&](size_t c) {
      return Transfer{0, data + c * kChainChunkBytes,
                      std::min(kChainChunkBytes, bytes - c * kChainChunkBytes)};
    };
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recvs, sends;
    Transfer current{};
    bool current_is_send = false;
    absl::Status status;
    try {
      if (has_prev) {
        current_is_send = false;
        for (size_t c = 0; c < chunks; ++c) {
          current = chunk(c);
          current.peer = prev;
          recvs.push_back(context_->createUnboundBuffer(current.ptr, current.bytes));
          recvs.back()->recv(prev, base + c);
        }
      }
      for (size_t c = 0; c < chunks && status.ok(); ++c) {
        if (has_prev) {
          current = chunk(c);
          current.peer = prev;
          current_is_send = false;
          if (!recvs[c]->waitRecv(nullptr, RemainingMs(deadline))) {
            status = absl::AbortedError(Describe(op, current, false, "was aborted"));
          }
        }
        if (has_next && status.ok()) {
          current = chunk(c);
          current.peer = next;
          current_is_send = true;
          sends.push_back(context_->createUnboundBuffer(current.ptr, current.bytes));
          sends.back()->send(next, base + c);
        }
      }
      for (size_t c = 0; c < sends.size() && status.ok(); ++c) {
        current = chunk(c);
        current.peer = next;
        current_is_send = true;
        if (!sends[c]->waitSend(nullptr, RemainingMs(deadline))) {
          status = absl::AbortedError(Describe(op, current, true, "was aborted"));
        }
      }
    } catch (const std::exception& e) {
      status = Classify(op, current, current_is_send, e.what(), deadline);
    } catch (...) {
      status = absl::InternalError(
          Describe(op, current, current_is_send, "failed with an unknown exception"));
    }
    if (!status.ok()) Break(status);
    return status;
  }

  std::string Describe(absl::string_view op, const Transfer& t, bool is_send,
                       absl::string_view what) const {
    return absl::StrCat(op, " on rank ", rank_, " of group '", group_,
                        "': ", is_send ? "sending " : "receiving ", t.bytes,
                        is_send ? " bytes to rank " : " bytes from rank ", t.peer, " ", what);
  }

  absl::Status Classify(absl::string_view op, const Transfer& t, bool is_send,
                        absl::string_view what, absl::Time deadline) const {
    bool timed_out = absl::Now() >= deadline || IsTimeout(what);
    if (timed_out) {
      return absl::DeadlineExceededError(
          Describe(op, t, is_send,
                   absl::StrCat("did not complete by the deadline (peer rank ", t.peer,
                                " stalled or is gone): ", what)));
    }
    return absl::UnavailableError(Describe(
        op, t, is_send, absl::StrCat("failed (peer rank ", t.peer, " unreachable): ", what)));
  }

  // Marks the communicator unusable and closes its connections so that peers blocked on this
  // rank fail now instead of at their deadlines.
  void Break(const absl::Status& status) {
    broken_ = status;
    try {
      context_->closeConnections();
    } catch (...) {
    }
  }

  const int rank_;
  const int size_;
  const std::string group_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint64_t next_slot_ = 1;
  absl::Status broken_;
};

// Creates the TCP device on a short-lived thread whose nice value is raised by `nice`: the
// device's event-loop thread, started inside CreateDevice, inherits it (Linux keeps a nice value
// per thread and copies it to new threads), and the calling thread keeps its own priority.
// Gloo's exceptions are rethrown on the calling thread.
std::shared_ptr<gloo::transport::Device> CreateDeviceWithLoopNice(
    const gloo::transport::tcp::attr& attr, int nice) {
  if (nice <= 0) return gloo::transport::tcp::CreateDevice(attr);
  std::shared_ptr<gloo::transport::Device> device;
  std::exception_ptr error;
  std::thread creator([&] {
    const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, tid);
    if (errno == 0) setpriority(PRIO_PROCESS, tid, std::min(19, current + nice));
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (...) {
      error = std::current_exception();
    }
  });
  creator.join();
  if (error) std::rethrow_exception(error);
  return device;
}

// See the header: a peer that closes must fail this process's writes, not kill the process.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store* store, int rank,
                                                                     int size,
                                                                     const GlooOptions& options,
                                                                     absl::Time deadline) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("gloo group size ", size, " < 1"));
  CKPT_RETURN_IF_ERROR(CheckRank("gloo create", "rank", rank, size));
  const std::string where = absl::StrCat("gloo rendezvous of group '", options.group_name,
                                         "' (rank ", rank, " of ", size, ")");
  IgnoreSigpipeUnlessHandled();
  PrefixedStore group_store(options.group_name, store);
  CKPT_RETURN_IF_ERROR(ArriveAndWait(group_store, rank, size, deadline, where));
  std::unique_ptr<Communicator> communicator;
  try {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    std::shared_ptr<gloo::transport::Device> device =
        CreateDeviceWithLoopNice(attr, options.loop_thread_nice);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::milliseconds(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now()))));
    if (size > 1) {
      PrefixedStore mesh_store("mesh", &group_store);
      GlooStoreAdapter adapter(&mesh_store, deadline);
      context->connectFullMesh(adapter, device);
    }
    communicator.reset(new GlooCommunicator(rank, size, options.group_name, device, context));
  } catch (const std::exception& e) {
    bool timed_out = absl::Now() >= deadline;
    std::string message = absl::StrCat(where, ": connecting the TCP mesh on ", options.hostname,
                                       " failed: ", e.what());
    return timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, ": unknown exception from Gloo"));
  }
  // A rank finishes connectFullMesh as soon as its own side of every pair is up, while a peer
  // may still be in its handshake; leaving now would fail that peer's creation. The barrier
  // returns only once every rank has connected.
  if (size > 1) {
    absl::Status joined = communicator->Barrier(deadline);
    if (!joined.ok()) {
      return absl::Status(joined.code(),
                          absl::StrCat(where, ": closing barrier failed: ", joined.message()));
    }
  }
  return communicator;
}

}  // namespace ckpt
