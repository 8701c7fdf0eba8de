// Direct loads into device tensors through the staging pipeline, on the host copy engine
// ("device" memory is host memory here; the daemon runs the same code over CudaCopyEngine).
#include "worker/load_executor.h"

#include <unistd.h>

#include <algorithm>
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
#include "storage/manifest_file.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

// Tensor d (int32, 100 x 100) as rank 0 of the tests shares `region` of it.
RegisteredTensor TensorD(const Region& region, pb::MemoryKind kind) {
  RegisteredTensor t;
  t.shard.mutable_tensor()->set_key("d");
  t.shard.mutable_tensor()->set_dtype(pb::DTYPE_I32);
  t.shard.mutable_tensor()->add_global_shape(100);
  t.shard.mutable_tensor()->add_global_shape(100);
  *t.shard.mutable_region() = RegionToProto(region);
  t.memory_kind = kind;
  t.nbytes = region.NumElements() * 4;
  return t;
}

// Rank 0's part reading `region` of d from the checkpoint at `path` into its tensor 0.
pb::LoadPlanPart PartReadingD(const std::string& path, const Region& region) {
  pb::LoadPlanPart part;
  part.set_rank(0);
  part.set_path(path);
  pb::LoadRead* read = part.add_reads();
  read->set_key("d");
  *read->mutable_region() = RegionToProto(region);
  read->set_local_index(0);
  read->set_size_bytes(region.NumElements() * 4);
  return part;
}

// A path for this test's checkpoint `name` under TEST_TMPDIR (else /tmp), with nothing there.
std::string FreshTestPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid());
  (void)RemoveTree(path);
  return path;
}

class DeviceLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = FreshTestPath("device-load");
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
    RegisteredTensor t = TensorD(region, pb::MEMORY_DEVICE);
    t.device = 0;
    t.device_ptr = memory->data();
    session_.tensors.push_back(t);
  }
  pb::LoadPlanPart Part(const Region& region) { return PartReadingD(path_, region); }

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

// Direct loads through the manifest share a coordinator sends with the part.
class ShareLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = FreshTestPath("share-load");
    stored_.resize(100 * 100);
    for (int i = 0; i < 100 * 100; ++i) stored_[i] = 7 * i + 1;
    CheckpointContents contents;
    contents.tensors.push_back(TensorMeta{"d", DType::kI32, {100, 100}});
    for (int half = 0; half < 2; ++half) {  // rows 0-49 by writer 0, rows 50-99 by writer 1
      DataFilePlan file;
      file.writer_rank = half;
      file.pieces.push_back(PieceData{"d", Region{{50 * half, 0}, {50, 100}, std::nullopt},
                                      stored_.data() + 5000 * half, 20000});
      contents.files.push_back(file);
    }
    ASSERT_TRUE(WriteCheckpoint(path_, contents, WriteOptions()).ok());
    absl::StatusOr<pb::Manifest> manifest = ReadManifestFile(path_);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    manifest_ = *std::move(manifest);
    session_.trainer.job = "j";
    session_.trainer.rank = 0;
  }
  void TearDown() override { (void)RemoveTree(path_); }

  // The share of the manifest's pieces whose writer is in `writers`.
  std::string ShareOf(const std::vector<int>& writers) const {
    pb::ManifestShare share;
    share.set_format_version(manifest_.format_version());
    share.set_checksum_block_bytes(manifest_.checksum_block_bytes());
    *share.add_tensors() = manifest_.tensors(0);
    share.add_tensor_ids(0);
    for (const pb::StoredPiece& p : manifest_.pieces()) {
      if (std::find(writers.begin(), writers.end(), p.writer_rank()) == writers.end()) continue;
      pb::SharedPiece* s = share.add_pieces();
      s->set_tensor_id(0);
      for (int f = 0; f < manifest_.files_size(); ++f) {
        if (manifest_.files(f).name() != p.file()) continue;
        s->set_file_id(f);
        *share.add_files() = manifest_.files(f);  // one piece per file here
        share.add_file_ids(f);
      }
      *s->mutable_region() = p.region();
      s->set_byte_offset(p.byte_offset());
      s->set_byte_length(p.byte_length());
      s->set_xxh3_64(p.xxh3_64());
      s->set_writer_rank(p.writer_rank());
      *s->mutable_block_xxh3() = p.block_xxh3();
    }
    return share.SerializeAsString();
  }
  // Rank 0 holds `region` of d in host memory `memory`; its part reads it with `share`.
  pb::LoadPlanPart HostPart(const Region& region, std::vector<int32_t>* memory,
                            const std::string& share) {
    memory->assign(region.NumElements(), 0);
    RegisteredTensor t = TensorD(region, pb::MEMORY_HOST);
    t.data = reinterpret_cast<std::byte*>(memory->data());
    session_.tensors.push_back(t);
    pb::LoadPlanPart part = PartReadingD(path_, region);
    part.set_manifest_share(share);
    return part;
  }

  std::string path_;
  std::vector<int32_t> stored_;
  pb::Manifest manifest_;
  SessionInfo session_;
};

TEST_F(ShareLoadTest, ReadsThroughItsShareWithoutTheCheckpointsOtherDataFiles) {
  // The bottom half's file is gone: opening the whole checkpoint would refuse it.
  for (const pb::StoredPiece& p : manifest_.pieces()) {
    if (p.writer_rank() == 1) {
      ASSERT_EQ(::unlink(JoinPath(path_, p.file()).c_str()), 0);
    }
  }
  std::vector<int32_t> memory;
  const Region rows{{10, 0}, {30, 100}, std::nullopt};
  MemoryGate gate;
  absl::Status s =
      ExecuteLoadPart(HostPart(rows, &memory, ShareOf({0})), session_, gate, nullptr, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 30 * 100; ++i) ASSERT_EQ(memory[i], stored_[10 * 100 + i]) << i;
}

TEST_F(ShareLoadTest, AShareLackingAPieceTheReadNeedsIsNotFoundNamingRankAndTensor) {
  std::vector<int32_t> memory;
  const Region rows{{40, 0}, {20, 100}, std::nullopt};  // crosses into the bottom half
  MemoryGate gate;
  absl::Status s =
      ExecuteLoadPart(HostPart(rows, &memory, ShareOf({0})), session_, gate, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 of job j: reading d"));
}

TEST_F(ShareLoadTest, ACorruptShareIsDataLossNamingTheRank) {
  std::vector<int32_t> memory;
  MemoryGate gate;
  absl::Status s =
      ExecuteLoadPart(HostPart(WholeRegion({100, 100}), &memory, std::string("\x0a\x7f", 2)),
                      session_, gate, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 of job j"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("manifest share"));
}

}  // namespace
}  // namespace ckpt::worker
