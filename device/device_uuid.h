// Matching a trainer's GPU to the worker's by UUID (cudaDeviceProp.uuid), not by ordinal: two
// processes with different CUDA_VISIBLE_DEVICES number the same GPU differently. Pure code (no
// CUDA): the UUIDs are read by device/gpu.h.
#ifndef CKPT_DEVICE_DEVICE_UUID_H_
#define CKPT_DEVICE_DEVICE_UUID_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// Bytes of a CUDA device UUID (cudaUUID_t).
inline constexpr size_t kDeviceUuidBytes = 16;

// nvidia-smi's spelling, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; other lengths are printed
// as "<n-byte uuid: hex>" and an empty one as "<no uuid>".
std::string FormatDeviceUuid(absl::string_view uuid);

// Whether the trainer's tensor `key` (on its device `trainer_ordinal` with `trainer_uuid`) is
// on the worker's GPU (`worker_ordinal`, `worker_uuid`). InvalidArgument when the trainer's
// UUID is not kDeviceUuidBytes long; FailedPrecondition on a mismatch, naming the tensor, both
// UUIDs and both ordinals. Ordinals alone never decide.
absl::Status CheckSameDevice(absl::string_view key, absl::string_view trainer_uuid,
                             int trainer_ordinal, absl::string_view worker_uuid,
                             int worker_ordinal);

}  // namespace ckpt

#endif  // CKPT_DEVICE_DEVICE_UUID_H_
