// Moving the overlap exchange's waves (internal to exchange/): each wave is, per peer, a
// stream of memory runs this rank sends (in its loaded buffers) and receives (in its
// destinations). A stream that is one contiguous run moves in place; any other is packed into
// or unpacked from staging. (A pipelined mode, packing wave k+1 on a helper thread while wave
// k moved, was measured slower on loopback and removed; see exchange/README.md.)
#ifndef CKPT_EXCHANGE_OVERLAP_WAVES_H_
#define CKPT_EXCHANGE_OVERLAP_WAVES_H_

#include <cstddef>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "exchange/communicator.h"
#include "exchange/exchange_internal.h"
#include "exchange/staging_arena.h"

namespace ckpt {
namespace exchange_internal {

// A contiguous run of memory in a loaded buffer or a destination.
struct MemoryRun {
  char* data;
  size_t bytes;
};

// What this rank moves in one wave: per peer, the runs it sends and the runs it receives
// into, in order.
struct WaveStreams {
  std::vector<std::vector<MemoryRun>> send;
  std::vector<std::vector<MemoryRun>> recv;
};

// Appends a run, merging it into the previous one when they are adjacent.
void AppendRun(std::vector<MemoryRun>& runs, char* data, size_t bytes);

// Fills `streams` (already sized to the group, emptied) with wave `wave`'s runs.
using WaveBuilder = std::function<void(int wave, WaveStreams& streams)>;

// How RunWaves stages.
struct WaveRunOptions {
  // Upper bound on this rank's send + receive bytes in any one wave (the staging reserved).
  size_t max_wave_bytes = 0;
  absl::Time deadline = absl::InfiniteFuture();
};

// Runs `num_waves` waves through comm.AllToAllVBuffers, in order, recording each as one wave.
absl::Status RunWaves(Communicator& comm, int num_waves, const WaveBuilder& build,
                      const WaveRunOptions& options, StagingArena& staging, WaveRecorder& recorder);

}  // namespace exchange_internal
}  // namespace ckpt

#endif  // CKPT_EXCHANGE_OVERLAP_WAVES_H_
