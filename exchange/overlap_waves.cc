#include "exchange/overlap_waves.h"

#include <cstring>

#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace ckpt {
namespace exchange_internal {
namespace {

size_t RunBytes(const std::vector<MemoryRun>& runs) {
  size_t total = 0;
  for (const MemoryRun& r : runs) total += r.bytes;
  return total;
}

// One wave ready to move: its streams and the per-peer buffers handed to the communicator.
struct PreparedWave {
  WaveStreams streams;
  std::vector<SendBuffer> sends;
  std::vector<RecvBuffer> recvs;
  size_t staged = 0;
  size_t sent = 0;
  size_t received = 0;
};

// Builds wave `k` into `w` and packs its fragmented send streams into `memory`, which holds
// at least the wave's staged bytes (send + receive).
void Prepare(int n, int k, const WaveBuilder& build, PreparedWave& w, char* memory) {
  w.streams.send.resize(n);
  w.streams.recv.resize(n);
  for (int p = 0; p < n; ++p) {
    w.streams.send[p].clear();
    w.streams.recv[p].clear();
  }
  build(k, w.streams);
  w.sends.assign(n, SendBuffer{});
  w.recvs.assign(n, RecvBuffer{});
  w.staged = w.sent = w.received = 0;
  char* at = memory;
  for (int p = 0; p < n; ++p) {
    const std::vector<MemoryRun>& out = w.streams.send[p];
    const size_t out_bytes = RunBytes(out);
    w.sent += out_bytes;
    if (out.size() > 1) {
      w.sends[p] = {at, out_bytes};
      for (const MemoryRun& r : out) {
        std::memcpy(at, r.data, r.bytes);
        at += r.bytes;
      }
      w.staged += out_bytes;
    } else if (out_bytes > 0) {
      w.sends[p] = {out[0].data, out_bytes};
    }
    const std::vector<MemoryRun>& in = w.streams.recv[p];
    const size_t in_bytes = RunBytes(in);
    w.received += in_bytes;
    if (in.size() > 1) {
      w.recvs[p] = {at, in_bytes};
      at += in_bytes;
      w.staged += in_bytes;
    } else if (in_bytes > 0) {
      w.recvs[p] = {in[0].data, in_bytes};
    }
  }
}

// Moves a prepared wave and scatters what arrived in staging.
absl::Status Move(Communicator& comm, PreparedWave& w, absl::Time deadline,
                  WaveRecorder& recorder) {
  recorder.StartWave();
  absl::Time start = absl::Now();
  CKPT_RETURN_IF_ERROR(comm.AllToAllVBuffers(w.sends, w.recvs, deadline));
  recorder.Add(w.staged, w.sent, w.received, absl::Now() - start);
  for (size_t p = 0; p < w.streams.recv.size(); ++p) {
    const std::vector<MemoryRun>& in = w.streams.recv[p];
    if (in.size() <= 1) continue;
    const char* from = static_cast<const char*>(w.recvs[p].data);
    for (const MemoryRun& r : in) {
      std::memcpy(r.data, from, r.bytes);
      from += r.bytes;
    }
  }
  return absl::OkStatus();
}

}  // namespace

void AppendRun(std::vector<MemoryRun>& runs, char* data, size_t bytes) {
  if (bytes == 0) return;
  if (!runs.empty() && runs.back().data + runs.back().bytes == data) {
    runs.back().bytes += bytes;
  } else {
    runs.push_back({data, bytes});
  }
}

absl::Status RunWaves(Communicator& comm, int num_waves, const WaveBuilder& build,
                      const WaveRunOptions& options, StagingArena& staging,
                      WaveRecorder& recorder) {
  const int n = comm.size();
  CKPT_ASSIGN_OR_RETURN(char* memory, staging.Reserve(options.max_wave_bytes));
  PreparedWave w;
  for (int k = 0; k < num_waves; ++k) {
    Prepare(n, k, build, w, memory);
    CKPT_RETURN_IF_ERROR(Move(comm, w, options.deadline, recorder));
  }
  return absl::OkStatus();
}

}  // namespace exchange_internal
}  // namespace ckpt
