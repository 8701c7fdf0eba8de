#include "device/cuda_status.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "x").ok());
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
}

TEST(CudaStatusTest, NcclCodesMapToActionableStatusCodes) {
  EXPECT_EQ(NcclStatus(ncclRemoteError, "op").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclSystemError, "op").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclInvalidArgument, "op").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatus(ncclInvalidUsage, "op").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NcclStatus(ncclInternalError, "op").code(), absl::StatusCode::kInternal);
  absl::Status s = NcclStatus(ncclRemoteError, "nccl broadcast on rank 3");
  EXPECT_NE(s.message().find("nccl broadcast on rank 3: NCCL ncclRemoteError"), std::string::npos)
      << s;
}

TEST(CudaStatusTest, CudaNoDeviceIsFailedPreconditionWithTheCudaText) {
  absl::Status s = CudaStatus(cudaErrorNoDevice, "probe");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("probe: CUDA cudaErrorNoDevice"), std::string::npos) << s;
  EXPECT_NE(s.message().find("(no usable GPU on this host)"), std::string::npos) << s;
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "p").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "p").code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CudaStatusTest, DriverNotSupportedIsFailedPreconditionNamingTheCall) {
  EXPECT_TRUE(CudaDriverStatus(CUDA_SUCCESS, "x").ok());
  absl::Status s = CudaDriverStatus(CUDA_ERROR_NOT_SUPPORTED, "cuMemGetAddressRange");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cuMemGetAddressRange: CUDA driver error 801"), std::string::npos)
      << s;
  EXPECT_EQ(CudaDriverStatus(CUDA_ERROR_INVALID_VALUE, "p").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
