#include "device/device_uuid.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

std::string FormatDeviceUuid(absl::string_view uuid) {
  if (uuid.empty()) return "<no uuid>";
  const std::string hex = absl::BytesToHexString(uuid);
  if (uuid.size() != kDeviceUuidBytes) {
    return absl::StrCat("<", uuid.size(), "-byte uuid: ", hex, ">");
  }
  return absl::StrCat("GPU-", hex.substr(0, 8), "-", hex.substr(8, 4), "-", hex.substr(12, 4), "-",
                      hex.substr(16, 4), "-", hex.substr(20));
}

absl::Status CheckSameDevice(absl::string_view key, absl::string_view trainer_uuid,
                             int trainer_ordinal, absl::string_view worker_uuid,
                             int worker_ordinal) {
  if (trainer_uuid.size() != kDeviceUuidBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", key, " (trainer's device ", trainer_ordinal, "): its device UUID ",
                     FormatDeviceUuid(trainer_uuid), " is not ", kDeviceUuidBytes,
                     " bytes (the client must send cudaDeviceProp.uuid of the tensor's GPU)"));
  }
  if (trainer_uuid == worker_uuid) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "tensor ", key, " is on GPU ", FormatDeviceUuid(trainer_uuid), " (device ", trainer_ordinal,
      " in the trainer), not on GPU ", FormatDeviceUuid(worker_uuid), " (device ", worker_ordinal,
      " in the worker), the one this worker serves: run one worker per GPU (--gpu or the "
      "launcher's local rank) and connect each trainer to its GPU's worker"));
}

}  // namespace ckpt
