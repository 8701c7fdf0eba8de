// The one place where NCCL and CUDA runtime error codes convert to absl::Status (used by the
// device helpers in device/gpu.h and the NCCL backend in exchange/nccl/).
#ifndef CKPT_DEVICE_CUDA_STATUS_H_
#define CKPT_DEVICE_CUDA_STATUS_H_

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt {

// OK for ncclSuccess; otherwise "<context>: NCCL <name>: <ncclGetErrorString>" with a code
// that says what the caller can do (Unavailable for system/remote errors, InvalidArgument for
// misuse, Internal for CUDA/NCCL internal failures). ncclInProgress is Unavailable.
absl::Status NcclStatus(ncclResult_t result, absl::string_view context);

// OK for cudaSuccess; otherwise "<context>: CUDA <name>: <cudaGetErrorString>". "No device"
// and "driver too old" are FailedPrecondition (the message adds "(no usable GPU on this
// host)"), allocation failures ResourceExhausted.
absl::Status CudaStatus(cudaError_t error, absl::string_view context);

// OK for CUDA_SUCCESS; otherwise "<context>: CUDA driver error <number>" (the driver API is
// reached through cudaGetDriverEntryPoint, so its error names may be unavailable): not
// supported / not permitted are FailedPrecondition, invalid values InvalidArgument, out of
// memory ResourceExhausted, the rest Internal.
absl::Status CudaDriverStatus(CUresult result, absl::string_view context);

}  // namespace ckpt

#endif  // CKPT_DEVICE_CUDA_STATUS_H_
