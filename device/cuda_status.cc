#include "device/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

absl::string_view NcclName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult(unknown)";
  }
}

absl::StatusCode NcclCode(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclSystemError:
    case ncclRemoteError:
    case ncclInProgress:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case ncclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    case ncclUnhandledCudaError:
    case ncclInternalError:
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CudaCode(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status NcclStatus(ncclResult_t result, absl::string_view context) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::Status(NcclCode(result), absl::StrCat(context, ": NCCL ", NcclName(result), ": ",
                                                     ncclGetErrorString(result)));
}

absl::Status CudaStatus(cudaError_t error, absl::string_view context) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(context, ": CUDA ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    absl::StrAppend(&message, " (no usable GPU on this host)");
  }
  return absl::Status(CudaCode(error), message);
}

absl::Status CudaDriverStatus(CUresult result, absl::string_view context) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (result) {
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    case CUDA_ERROR_INVALID_VALUE:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      code = absl::StatusCode::kResourceExhausted;
      break;
    default:
      break;
  }
  return absl::Status(code,
                      absl::StrCat(context, ": CUDA driver error ", static_cast<int>(result)));
}

}  // namespace ckpt
