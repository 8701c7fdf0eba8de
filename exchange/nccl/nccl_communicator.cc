#include "exchange/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "device/cuda_status.h"
#include "device/gpu.h"
#include "exchange/slice_copy.h"

namespace ckpt {
namespace {

constexpr absl::Duration kPollInterval = absl::Microseconds(200);

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, std::string group, ncclComm_t comm,
                   cudaStream_t stream, void* scratch)
      : rank_(rank),
        size_(size),
        device_(device),
        group_(std::move(group)),
        comm_(comm),
        stream_(stream),
        scratch_(scratch) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (broken_.ok() && ncclCommFinalize(comm_) == ncclSuccess) {
      // Finalize is non-blocking here: give it a bounded time, then abort.
      absl::Time until = absl::Now() + absl::Seconds(10);
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             absl::Now() < until) {
        absl::SleepFor(kPollInterval);
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    } else {
      ncclCommAbort(comm_);
    }
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }
  absl::string_view backend_name() const override { return "nccl"; }

  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl broadcast";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "root", root, size_));
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    if (bytes == 0) return absl::OkStatus();
    CKPT_RETURN_IF_ERROR(
        Enqueue(kOp, ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_)));
    return Finish(kOp, absl::StrCat("root rank ", root), deadline);
  }

  absl::Status AllGatherV(const void* send, absl::Span<const size_t> counts, void* recv,
                          absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl all_gather_v";
    CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size_));
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    std::vector<size_t> offsets = Offsets(counts);
    char* out = static_cast<char*>(recv);
    // One broadcast per contributing rank, fused into a single NCCL group.
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupStart()));
    for (int p = 0; p < size_; ++p) {
      if (counts[p] == 0) continue;
      const void* src = p == rank_ ? send : out + offsets[p];
      CKPT_RETURN_IF_ERROR(Enqueue(
          kOp, ncclBroadcast(src, out + offsets[p], counts[p], ncclUint8, p, comm_, stream_)));
    }
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupEnd()));
    return Finish(kOp, "a peer", deadline);
  }

  absl::Status GatherV(const void* send, size_t send_bytes, absl::Span<const size_t> counts,
                       void* recv, int root, absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl gather_v";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "root", root, size_));
    if (rank_ == root) CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size_));
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupStart()));
    if (rank_ == root) {
      std::vector<size_t> offsets = Offsets(counts);
      char* out = static_cast<char*>(recv);
      for (int p = 0; p < size_; ++p) {
        if (counts[p] == 0) continue;
        if (p == rank_) {
          CKPT_RETURN_IF_ERROR(CopyAsync(kOp, out + offsets[p], send, counts[p]));
        } else {
          CKPT_RETURN_IF_ERROR(
              Enqueue(kOp, ncclRecv(out + offsets[p], counts[p], ncclUint8, p, comm_, stream_)));
        }
      }
    } else if (send_bytes > 0) {
      CKPT_RETURN_IF_ERROR(
          Enqueue(kOp, ncclSend(send, send_bytes, ncclUint8, root, comm_, stream_)));
    }
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupEnd()));
    return Finish(kOp, rank_ == root ? "a sending peer" : absl::StrCat("root rank ", root),
                  deadline);
  }

  absl::Status ScatterV(const void* send, absl::Span<const size_t> counts, void* recv,
                        size_t recv_bytes, int root, absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl scatter_v";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "root", root, size_));
    if (rank_ == root) CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "counts", counts, size_));
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupStart()));
    if (rank_ == root) {
      std::vector<size_t> offsets = Offsets(counts);
      const char* in = static_cast<const char*>(send);
      for (int p = 0; p < size_; ++p) {
        if (counts[p] == 0) continue;
        if (p == rank_) {
          CKPT_RETURN_IF_ERROR(CopyAsync(kOp, recv, in + offsets[p], counts[p]));
        } else {
          CKPT_RETURN_IF_ERROR(
              Enqueue(kOp, ncclSend(in + offsets[p], counts[p], ncclUint8, p, comm_, stream_)));
        }
      }
    } else if (recv_bytes > 0) {
      CKPT_RETURN_IF_ERROR(
          Enqueue(kOp, ncclRecv(recv, recv_bytes, ncclUint8, root, comm_, stream_)));
    }
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupEnd()));
    return Finish(kOp, rank_ == root ? "a receiving peer" : absl::StrCat("root rank ", root),
                  deadline);
  }

  absl::Status AllToAllV(const void* send, absl::Span<const size_t> send_counts, void* recv,
                         absl::Span<const size_t> recv_counts, absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl all_to_all_v";
    CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "send_counts", send_counts, size_));
    CKPT_RETURN_IF_ERROR(CheckCounts(kOp, "recv_counts", recv_counts, size_));
    if (send_counts[rank_] != recv_counts[rank_]) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": rank ", rank_, " sends itself ",
                                                     send_counts[rank_], " bytes but expects ",
                                                     recv_counts[rank_]));
    }
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    std::vector<size_t> so = Offsets(send_counts), ro = Offsets(recv_counts);
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    CKPT_RETURN_IF_ERROR(CopyAsync(kOp, out + ro[rank_], in + so[rank_], send_counts[rank_]));
    // All-to-all-v as grouped point-to-point sends and receives.
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupStart()));
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (send_counts[p] > 0) {
        CKPT_RETURN_IF_ERROR(
            Enqueue(kOp, ncclSend(in + so[p], send_counts[p], ncclUint8, p, comm_, stream_)));
      }
      if (recv_counts[p] > 0) {
        CKPT_RETURN_IF_ERROR(
            Enqueue(kOp, ncclRecv(out + ro[p], recv_counts[p], ncclUint8, p, comm_, stream_)));
      }
    }
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupEnd()));
    return Finish(kOp, "a peer", deadline);
  }

  absl::Status IndexedAllToAllV(const void* send,
                                absl::Span<const std::vector<ByteSlice>> send_slices, void* recv,
                                absl::Span<const std::vector<ByteSlice>> recv_slices,
                                absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl indexed_all_to_all_v";
    CKPT_RETURN_IF_ERROR(CheckSlices(kOp, "send_slices", send_slices, size_));
    CKPT_RETURN_IF_ERROR(CheckSlices(kOp, "recv_slices", recv_slices, size_));
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    CKPT_ASSIGN_OR_RETURN(std::vector<SegmentCopy> self,
                          MatchSlices(send_slices[rank_], recv_slices[rank_], kOp));
    for (const SegmentCopy& c : self) {
      CKPT_RETURN_IF_ERROR(CopyAsync(kOp, out + c.dst_offset, in + c.src_offset, c.length));
    }
    // Pack multi-slice sends into one device staging buffer; receive multi-slice peers into
    // staging and unpack after the transfer.
    std::vector<size_t> send_total(size_), recv_total(size_), send_at(size_), recv_at(size_);
    size_t send_staging = 0, recv_staging = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      send_total[p] = TotalBytes(send_slices[p]);
      recv_total[p] = TotalBytes(recv_slices[p]);
      if (send_slices[p].size() > 1) send_at[p] = send_staging, send_staging += send_total[p];
      if (recv_slices[p].size() > 1) recv_at[p] = recv_staging, recv_staging += recv_total[p];
    }
    char* staging = nullptr;
    if (send_staging + recv_staging > 0) {
      CKPT_RETURN_IF_ERROR(CudaStatus(
          cudaMallocAsync(reinterpret_cast<void**>(&staging), send_staging + recv_staging, stream_),
          absl::StrCat(kOp, ": staging allocation")));
    }
    absl::Status status = [&]() -> absl::Status {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || send_slices[p].size() <= 1) continue;
        size_t at = send_at[p];
        for (const ByteSlice& s : send_slices[p]) {
          CKPT_RETURN_IF_ERROR(CopyAsync(kOp, staging + at, in + s.offset, s.length));
          at += s.length;
        }
      }
      CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupStart()));
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (send_total[p] > 0) {
          const char* src =
              send_slices[p].size() > 1 ? staging + send_at[p] : in + send_slices[p][0].offset;
          CKPT_RETURN_IF_ERROR(
              Enqueue(kOp, ncclSend(src, send_total[p], ncclUint8, p, comm_, stream_)));
        }
        if (recv_total[p] > 0) {
          char* dst = recv_slices[p].size() > 1 ? staging + send_staging + recv_at[p]
                                                : out + recv_slices[p][0].offset;
          CKPT_RETURN_IF_ERROR(
              Enqueue(kOp, ncclRecv(dst, recv_total[p], ncclUint8, p, comm_, stream_)));
        }
      }
      CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclGroupEnd()));
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || recv_slices[p].size() <= 1) continue;
        size_t at = send_staging + recv_at[p];
        for (const ByteSlice& s : recv_slices[p]) {
          CKPT_RETURN_IF_ERROR(CopyAsync(kOp, out + s.offset, staging + at, s.length));
          at += s.length;
        }
      }
      return Finish(kOp, "a peer", deadline);
    }();
    if (staging != nullptr) cudaFreeAsync(staging, stream_);
    return status;
  }

  absl::Status Send(const void* data, size_t bytes, int peer, uint32_t /*tag*/,
                    absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl send";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "peer", peer, size_));
    if (peer == rank_) return absl::InvalidArgumentError("nccl send: a rank cannot send to itself");
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    if (bytes == 0) return absl::OkStatus();
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclSend(data, bytes, ncclUint8, peer, comm_, stream_)));
    return Finish(kOp, absl::StrCat("peer rank ", peer), deadline);
  }

  absl::Status Recv(void* data, size_t bytes, int peer, uint32_t /*tag*/,
                    absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl recv";
    CKPT_RETURN_IF_ERROR(CheckRank(kOp, "peer", peer, size_));
    if (peer == rank_) {
      return absl::InvalidArgumentError("nccl recv: a rank cannot receive from itself");
    }
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    if (bytes == 0) return absl::OkStatus();
    CKPT_RETURN_IF_ERROR(Enqueue(kOp, ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_)));
    return Finish(kOp, absl::StrCat("peer rank ", peer), deadline);
  }

  absl::Status Barrier(absl::Time deadline) override {
    constexpr absl::string_view kOp = "nccl barrier";
    CKPT_RETURN_IF_ERROR(Begin(kOp));
    CKPT_RETURN_IF_ERROR(
        Enqueue(kOp, ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_)));
    return Finish(kOp, "a peer", deadline);
  }

 private:
  static std::vector<size_t> Offsets(absl::Span<const size_t> counts) {
    std::vector<size_t> offsets(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
    return offsets;
  }

  absl::Status Begin(absl::string_view op) {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, " on rank ", rank_, " of group '", group_,
                       "': communicator unusable after an earlier failure: ", broken_.message()));
    }
    return CudaStatus(cudaSetDevice(device_), absl::StrCat(op, ": cudaSetDevice(", device_, ")"));
  }

  // Non-blocking communicators may answer ncclInProgress while enqueueing; that is fine.
  absl::Status Enqueue(absl::string_view op, ncclResult_t result) {
    if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
    absl::Status s =
        NcclStatus(result, absl::StrCat(op, " on rank ", rank_, " of group '", group_, "'"));
    Break(s);
    return s;
  }

  absl::Status CopyAsync(absl::string_view op, void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
                      absl::StrCat(op, ": device copy of ", bytes, " bytes"));
  }

  // Polls the communicator's asynchronous error and the stream until the work is done, an
  // error appears, or the deadline passes (then the communicator is aborted).
  absl::Status Finish(absl::string_view op, absl::string_view peer, absl::Time deadline) {
    const std::string where = absl::StrCat(op, " on rank ", rank_, " of group '", group_, "'");
    while (true) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        absl::Status s = NcclStatus(async, absl::StrCat(where, ": waiting for ", peer));
        Break(s);
        return s;
      }
      if (async == ncclSuccess) {
        cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) return absl::OkStatus();
        if (e != cudaErrorNotReady) {
          absl::Status s = CudaStatus(e, where);
          Break(s);
          return s;
        }
      }
      if (absl::Now() >= deadline) {
        absl::Status s = absl::DeadlineExceededError(
            absl::StrCat(where, ": did not complete by the deadline waiting for ", peer,
                         " (stalled or gone); the communicator was aborted"));
        Break(s);
        return s;
      }
      absl::SleepFor(kPollInterval);
    }
  }

  void Break(const absl::Status& status) {
    if (!broken_.ok()) return;
    broken_ = status;
    ncclCommAbort(comm_);
  }

  const int rank_;
  const int size_;
  const int device_;
  const std::string group_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  void* scratch_;
  absl::Status broken_;
};

}  // namespace

absl::StatusOr<int> NcclVersion() {
  int version = 0;
  CKPT_RETURN_IF_ERROR(NcclStatus(ncclGetVersion(&version), "ncclGetVersion"));
  return version;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store* store, int rank,
                                                                     int size,
                                                                     const NcclOptions& options,
                                                                     absl::Time deadline) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("nccl group size ", size, " < 1"));
  CKPT_RETURN_IF_ERROR(CheckRank("nccl create", "rank", rank, size));
  CKPT_ASSIGN_OR_RETURN(int device_count, CudaDeviceCount());
  const std::string where = absl::StrCat("nccl rendezvous of group '", options.group_name,
                                         "' (rank ", rank, " of ", size, ")");
  int device = options.cuda_device;
  if (device < 0) CKPT_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), where));
  if (device >= device_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": CUDA device ", device, " requested but only ", device_count, " visible"));
  }
  CKPT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), where));

  PrefixedStore group_store(options.group_name, store);
  CKPT_RETURN_IF_ERROR(ArriveAndWait(group_store, rank, size, deadline, where));
  ncclUniqueId id;
  if (rank == 0) {
    CKPT_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), where));
    CKPT_RETURN_IF_ERROR(group_store.Set(
        "unique_id", absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id)), deadline));
  } else {
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> v, group_store.Get({"unique_id"}, deadline));
    if (v[0].size() != sizeof(id)) {
      return absl::DataLossError(
          absl::StrCat(where, ": unique id has ", v[0].size(), " bytes, expected ", sizeof(id)));
    }
    std::memcpy(&id, v[0].data(), sizeof(id));
  }

  cudaStream_t stream = nullptr;
  CKPT_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), where));
  void* scratch = nullptr;
  absl::Status s = CudaStatus(cudaMalloc(&scratch, sizeof(float)), where);
  if (s.ok()) s = CudaStatus(cudaMemset(scratch, 0, sizeof(float)), where);
  if (!s.ok()) {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return s;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  while (r == ncclSuccess || r == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) break;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      cudaFree(scratch);
      cudaStreamDestroy(stream);
      return absl::DeadlineExceededError(
          absl::StrCat(where,
                       ": ncclCommInitRankConfig did not complete by the deadline "
                       "(a peer stalled); aborted"));
    }
    absl::SleepFor(kPollInterval);
  }
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return NcclStatus(r, absl::StrCat(where, ": ncclCommInitRankConfig"));
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(rank, size, device, options.group_name, comm, stream, scratch));
}

}  // namespace ckpt
