// Direct loads into device tensors through the staging pipeline, on the host copy engine
// ("device" memory is host memory here; the daemon runs the same code over CudaCopyEngine).
#include "worker/load_executor.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "device/host_memcpy_copy_engine_for_tests.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

class DeviceLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    path_ = absl::StrCat(tmp ? tmp : "/tmp", "/device-load-", getpid());
    (void)RemoveTree(path_);
    stored_.resize(100 * 100);
    for (int i = 0; i < 100 * 100; ++i) stored_[i] = 3 * i - 5000;
    CheckpointContents contents;
    contents.tensors.push_back(TensorMeta{"d", DType::kI32, {100, 100}});
    DataFilePlan file;
    file.pieces.push_back(PieceData{"d", WholeRegion({100, 100}), stored_.data(), 40000});
    contents.files.push_back(file);
    ASSERT_TRUE(WriteCheckpoint(path_, contents, WriteOptions()).ok());
    session_.trainer.job = "j";
    session_.trainer.rank = 0;
  }
  void TearDown() override { (void)RemoveTree(path_); }

  // A device tensor holding `region` of d, backed by `memory`.
  void AddDeviceTensor(const Region& region, std::vector<int32_t>* memory) {
    memory->assign(region.NumElements(), 0);
    RegisteredTensor t;
    t.shard.mutable_tensor()->set_key("d");
    t.shard.mutable_tensor()->set_dtype(pb::DTYPE_I32);
    t.shard.mutable_tensor()->add_global_shape(100);
    t.shard.mutable_tensor()->add_global_shape(100);
    *t.shard.mutable_region() = RegionToProto(region);
    t.memory_kind = pb::MEMORY_DEVICE;
    t.device = 0;
    t.nbytes = region.NumElements() * 4;
    t.device_ptr = memory->data();
    session_.tensors.push_back(t);
  }
  pb::LoadPlanPart Part(const Region& region) {
    pb::LoadPlanPart part;
    part.set_rank(0);
    part.set_path(path_);
    pb::LoadRead* read = part.add_reads();
    read->set_key("d");
    *read->mutable_region() = RegionToProto(region);
    read->set_local_index(0);
    read->set_size_bytes(region.NumElements() * 4);
    return part;
  }

  std::string path_;
  std::vector<int32_t> stored_;
  SessionInfo session_;
  HostMemcpyCopyEngineForTests engine_;
  PinnedStagingPool pool_{&engine_, 16384, 8192};
};

TEST_F(DeviceLoadTest, ReadsARegionChunkByChunkOntoTheDeviceTensor) {
  const Region rows{{10, 0}, {50, 100}, std::nullopt};  // 20000 bytes: 3 chunks of <= 8192
  std::vector<int32_t> device;
  AddDeviceTensor(rows, &device);
  MemoryGate gate;
  std::vector<int64_t> progress;
  absl::Status s = ExecuteLoadPart(
      Part(rows), session_, gate, [&](int64_t b) { progress.push_back(b); }, &pool_);
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 50 * 100; ++i) ASSERT_EQ(device[i], stored_[10 * 100 + i]) << i;
  EXPECT_EQ(progress, std::vector<int64_t>{20000});
}

TEST_F(DeviceLoadTest, DeviceTensorsOnAWorkerWithoutStagingAreRefusedNamingTheTensor) {
  std::vector<int32_t> device;
  AddDeviceTensor(WholeRegion({100, 100}), &device);
  MemoryGate gate;
  absl::Status s = ExecuteLoadPart(Part(WholeRegion({100, 100})), session_, gate, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 0 of job j: tensor d is in device memory (device 0)"));
}

TEST_F(DeviceLoadTest, AFailedCopyOntoTheDeviceNamesRankTensorAndCheckpoint) {
  engine_.set_hook([](const HostCopy& c) {
    return c.ticket == 2 ? absl::InternalError("CUDA cudaErrorIllegalAddress: injected")
                         : absl::OkStatus();
  });
  std::vector<int32_t> device;
  AddDeviceTensor(WholeRegion({100, 100}), &device);
  MemoryGate gate;
  absl::Status s = ExecuteLoadPart(Part(WholeRegion({100, 100})), session_, gate, nullptr, &pool_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 of job j: tensor d bytes ["));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(path_));
}

TEST_F(DeviceLoadTest, CopyOntoDeviceMovesAHostBufferInChunks) {
  std::vector<int32_t> device;
  AddDeviceTensor(WholeRegion({100, 100}), &device);
  MemoryGate gate;
  ASSERT_TRUE(CopyOntoDevice(session_.tensors[0], reinterpret_cast<const char*>(stored_.data()),
                             &pool_, gate, "rank 0 of job j")
                  .ok());
  EXPECT_EQ(device, stored_);
  gate.Close(absl::AbortedError("operation aborted"));
  EXPECT_EQ(CopyOntoDevice(session_.tensors[0], reinterpret_cast<const char*>(stored_.data()),
                           &pool_, gate, "rank 0 of job j")
                .code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace ckpt::worker
