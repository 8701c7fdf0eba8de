#include "worker/save_executor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "device/host_memcpy_copy_engine_for_tests.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_writer.h"
#include "storage/checksum.h"
#include "storage/file_util.h"
#include "worker/host_buffer_pool.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

// The manifest checksum of `bytes`, computed independently of the writer.
uint64_t Xxh3BlocksOf(const std::string& bytes, int64_t block_bytes) {
  std::vector<uint64_t> blocks;
  for (size_t at = 0; at < bytes.size(); at += static_cast<size_t>(block_bytes)) {
    const size_t n = std::min(bytes.size() - at, static_cast<size_t>(block_bytes));
    blocks.push_back(Xxh3(bytes.data() + at, n));
  }
  return RangeChecksum(blocks);
}

class SaveExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    segment_ = absl::StrCat("/ckpt.exec.r0.p", getpid(), ".1");
    shm_unlink(segment_.c_str());
    int fd = shm_open(segment_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 64), 0);
    data_ = static_cast<int32_t*>(mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    for (int i = 0; i < 16; ++i) data_[i] = 100 + i;
    auto session = registry_.OpenSession(TrainerIdentity{"exec", 0, 1, 0, getpid()});
    ASSERT_TRUE(session.ok());
    pb::SharedTensor t;
    t.mutable_shard()->mutable_tensor()->set_key("w");
    t.mutable_shard()->mutable_tensor()->set_dtype(pb::DTYPE_I32);
    t.mutable_shard()->mutable_tensor()->add_global_shape(4);
    t.mutable_shard()->mutable_tensor()->add_global_shape(4);
    for (int64_t v : {0, 0}) t.mutable_shard()->mutable_region()->add_offsets(v);
    for (int64_t v : {4, 4}) t.mutable_shard()->mutable_region()->add_lengths(v);
    t.set_memory_kind(pb::MEMORY_HOST);
    t.set_segment(segment_);
    t.set_nbytes(64);
    ASSERT_TRUE(registry_.RegisterTensors(*session, {t}).ok());
    auto info = registry_.Find(*session);
    ASSERT_TRUE(info.ok());
    session_ = *info;
    const char* tmp = std::getenv("TEST_TMPDIR");
    final_path_ = absl::StrCat(tmp ? tmp : "/tmp", "/exec-ckpt-", getpid());
    auto staging = CreateStagingDir(final_path_, /*overwrite=*/true);
    ASSERT_TRUE(staging.ok()) << staging.status();
    staging_ = *staging;
  }
  void TearDown() override {
    munmap(data_, 64);
    shm_unlink(segment_.c_str());
    (void)RemoveTree(staging_);
  }

  pb::SavePlanPart Part() {
    pb::SavePlanPart part;
    part.set_rank(0);
    part.set_total_bytes(64);
    part.set_staging_dir(staging_);
    pb::PlanFile* f = part.add_files();
    f->set_path("data/r0_0.safetensors");
    f->set_total_bytes(64);
    pb::PlanPiece* p = f->add_pieces();
    *p->mutable_region() = session_.tensors[0].shard.region();
    p->set_key("w");
    p->set_dtype(pb::DTYPE_I32);
    p->add_global_shape(4);
    p->add_global_shape(4);
    p->set_size_bytes(64);
    p->set_local_index(0);
    return part;
  }

  std::string segment_;
  int32_t* data_ = nullptr;
  MemoryRegistry registry_;
  SessionInfo session_;
  std::string final_path_;
  std::string staging_;
};

TEST_F(SaveExecutorTest, WritesTheSharedBytesAndReportsPiecesAndProgress) {
  std::vector<int64_t> progress;
  auto written = ExecuteSavePart(Part(), session_, [&](int64_t b) { progress.push_back(b); });
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  ASSERT_EQ(m.pieces_size(), 1);
  EXPECT_EQ(m.pieces(0).key(), "w");
  EXPECT_EQ(m.pieces(0).byte_length(), 64);
  EXPECT_EQ(m.pieces(0).writer_rank(), 0);
  ASSERT_EQ(m.files_size(), 1);
  EXPECT_EQ(m.files(0).name(), "data/r0_0.safetensors");
  EXPECT_EQ(progress, std::vector<int64_t>{64});
  // The stored bytes are the trainer's.
  auto bytes = ReadFileRange(JoinPath(staging_, m.pieces(0).file()), m.pieces(0).byte_offset(), 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(std::memcmp(bytes->data(), data_, 64), 0);
}

TEST_F(SaveExecutorTest, PieceThatDoesNotMatchTheSharedTensorIsRefusedNamingIt) {
  pb::SavePlanPart part = Part();
  part.mutable_files(0)->mutable_pieces(0)->mutable_region()->set_lengths(0, 2);
  part.mutable_files(0)->mutable_pieces(0)->set_size_bytes(32);
  auto written = ExecuteSavePart(part, session_);
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(written.status().message(), HasSubstr("piece w [0:2, 0:4]"));
  part = Part();
  part.mutable_files(0)->mutable_pieces(0)->set_local_index(3);
  EXPECT_THAT(ExecuteSavePart(part, session_).status().message(),
              HasSubstr("local index 3) is not among the 1 tensors"));
}

// The coordinator names a piece by local index and size alone (pb::PlanPiece): the worker
// writes its own shared tensor at that index, exactly as the same piece given in full.
TEST_F(SaveExecutorTest, PieceNamedByLocalIndexAloneWritesTheSharedTensor) {
  pb::SavePlanPart in_full = Part();
  absl::StatusOr<std::string> given = ExecuteSavePart(in_full, session_);
  ASSERT_TRUE(given.ok()) << given.status();
  (void)RemoveTree(staging_);
  auto staging = CreateStagingDir(final_path_, /*overwrite=*/true);
  ASSERT_TRUE(staging.ok()) << staging.status();
  staging_ = *staging;
  pb::SavePlanPart by_index = Part();
  pb::PlanPiece* p = by_index.mutable_files(0)->mutable_pieces(0);
  p->Clear();
  p->set_local_index(0);
  p->set_size_bytes(64);
  absl::StatusOr<std::string> named = ExecuteSavePart(by_index, session_);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(*named, *given);  // the same record: key, region, entry, checksums
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*named));
  auto bytes = ReadFileRange(JoinPath(staging_, m.pieces(0).file()), m.pieces(0).byte_offset(), 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(std::memcmp(bytes->data(), data_, 64), 0);
  // A size that is not the shared tensor's (the trainer re-registered) is refused, naming it.
  p->set_size_bytes(32);
  absl::StatusOr<std::string> wrong = ExecuteSavePart(by_index, session_);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("piece local index 0 of 32 bytes does not match the shared tensor w"));
}

TEST_F(SaveExecutorTest, CancelledWriteStopsBeforeTheNextFile) {
  MemoryGate gate;
  auto snapshot = SnapshotSavePart(Part(), session_, gate);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  auto written = WriteSnapshot(*snapshot, nullptr, [] { return true; });
  EXPECT_EQ(written.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(written.status().message(), HasSubstr("stopped after 0 of 1 data files"));
  EXPECT_FALSE(PathExists(JoinPath(staging_, "data/r0_0.safetensors")));
}

TEST_F(SaveExecutorTest, SnapshotOfAnAbortedSaveDoesNotTouchTheTrainersMemory) {
  MemoryGate gate;
  gate.Close(absl::UnavailableError("the worker of rank 1 missed its lease"));
  auto snapshot = SnapshotSavePart(Part(), session_, gate);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(snapshot.status().message(), HasSubstr("stopped copying w: the worker of rank 1"));
}

TEST_F(SaveExecutorTest, SnapshotIsACopyTheTrainerMayOverwrite) {
  MemoryGate gate;
  auto snapshot = SnapshotSavePart(Part(), session_, gate);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  std::memset(data_, 0, 64);  // training goes on
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  auto bytes = ReadFileRange(JoinPath(staging_, m.pieces(0).file()), m.pieces(0).byte_offset(), 64);
  ASSERT_TRUE(bytes.ok());
  int32_t first = 0;
  std::memcpy(&first, bytes->data(), 4);
  EXPECT_EQ(first, 100);  // the value at the snapshot
}

// The trainer's tensor registered again, lent to the save until durable.
SessionInfo LentSession(const SessionInfo& session) {
  SessionInfo lent = session;
  for (RegisteredTensor& t : lent.tensors) t.lent_until_durable = true;
  return lent;
}

TEST_F(SaveExecutorTest, ALentTensorIsNotCopiedAndTheSnapshotSignalComesAtOnce) {
  const SessionInfo lent = LentSession(session_);
  MemoryGate gate;
  // A closed gate stops every copy out of the trainer's memory; a lent tensor needs none.
  gate.Close(absl::UnavailableError("no copy may run"));
  SnapshotReport at_signal;
  bool signalled = false;
  DeviceSnapshotOptions device;
  device.on_device_drained = [&](const SnapshotReport& r) {
    signalled = true;
    at_signal = r;
  };
  auto snapshot = SnapshotSavePart(Part(), lent, gate, device);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(signalled);
  EXPECT_EQ(at_signal.copied_bytes, 0);
  EXPECT_EQ(at_signal.lent_bytes, 64);
  EXPECT_TRUE(snapshot->buffers.empty());
  // Written from the trainer's own mapping: a change before the write (which a lender promises
  // not to make) is what gets stored, proving no copy was taken.
  data_[0] = 4242;
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  auto bytes = ReadFileRange(JoinPath(staging_, m.pieces(0).file()), m.pieces(0).byte_offset(), 64);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(std::memcmp(bytes->data(), data_, 64), 0);
}

TEST_F(SaveExecutorTest, ALentTensorStaysMappedForTheWriteAfterTheSessionIsGone) {
  MemoryGate gate;
  absl::StatusOr<SaveSnapshot> snapshot;
  {
    const SessionInfo lent = LentSession(session_);
    snapshot = SnapshotSavePart(Part(), lent, gate);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  }
  // The snapshot itself holds the worker's mapping of the lent piece's segment.
  ASSERT_EQ(snapshot->mappings.size(), 1u);
  EXPECT_EQ(snapshot->mappings[0]->addr(), session_.tensors[0].mapping->addr());
  // The trainer said goodbye: the registry unmaps its segments, the session copy is gone.
  ASSERT_TRUE(registry_.CloseSession(session_.id).ok());
  session_ = SessionInfo();
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(snapshot->report.lent_bytes, 64);
}

TEST_F(SaveExecutorTest, ATensorNotLentIsCopiedAndReportedAsCopied) {
  MemoryGate gate;
  auto snapshot = SnapshotSavePart(Part(), session_, gate);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->report.copied_bytes, 64);
  EXPECT_EQ(snapshot->report.lent_bytes, 0);
  EXPECT_EQ(snapshot->buffers.size(), 1u);
}

TEST_F(SaveExecutorTest, EmptyPartWritesNothing) {
  pb::SavePlanPart part;
  part.set_rank(0);
  auto written = ExecuteSavePart(part, session_);
  ASSERT_TRUE(written.ok());
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  EXPECT_EQ(m.pieces_size(), 0);
}

TEST_F(SaveExecutorTest, PartOfAnotherRankIsAnInternalError) {
  pb::SavePlanPart part = Part();
  part.set_rank(1);
  EXPECT_EQ(ExecuteSavePart(part, session_).status().code(), absl::StatusCode::kInternal);
}

// A device tensor "d" (100 x 100 i32) whose "device" memory is host memory moved by the test
// copy engine, added to the session beside the host tensor "w", and its piece in the plan.
class DeviceSaveTest : public SaveExecutorTest {
 protected:
  void SetUp() override {
    SaveExecutorTest::SetUp();
    device_memory_.resize(100 * 100);
    for (int i = 0; i < 100 * 100; ++i) device_memory_[i] = 7 * i + 1;
    RegisteredTensor d;
    d.shard.mutable_tensor()->set_key("d");
    d.shard.mutable_tensor()->set_dtype(pb::DTYPE_I32);
    for (int64_t v : {100, 100}) d.shard.mutable_tensor()->add_global_shape(v);
    for (int64_t v : {0, 0}) d.shard.mutable_region()->add_offsets(v);
    for (int64_t v : {100, 100}) d.shard.mutable_region()->add_lengths(v);
    d.memory_kind = pb::MEMORY_DEVICE;
    d.nbytes = 40000;
    d.device = 0;
    d.device_ptr = device_memory_.data();
    session_.tensors.push_back(d);
  }
  pb::SavePlanPart MixedPart() {
    pb::SavePlanPart part = Part();
    part.set_total_bytes(64 + 40000);
    pb::PlanPiece* p = part.mutable_files(0)->add_pieces();
    *p->mutable_region() = session_.tensors[1].shard.region();
    p->set_key("d");
    p->set_dtype(pb::DTYPE_I32);
    p->add_global_shape(100);
    p->add_global_shape(100);
    p->set_size_bytes(40000);
    p->set_local_index(1);
    return part;
  }
  std::vector<int32_t> device_memory_;
  HostMemcpyCopyEngineForTests engine_;
  PinnedStagingPool pool_{&engine_, 16384, 8192};  // 40000 bytes do not fit: 5 chunks, 2 buffers
};

TEST_F(DeviceSaveTest, TheCheckpointHoldsTheValuesAtSaveEvenIfOverwrittenOnceDrained) {
  const std::vector<int32_t> at_save = device_memory_;
  MemoryGate gate;
  bool drained = false;
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  SnapshotReport at_drain;
  device.on_device_drained = [&](const SnapshotReport& r) {
    drained = true;
    at_drain = r;
    // The trainer overwrites its tensors as soon as Save returned.
    for (int32_t& v : device_memory_) v = -1;
    for (int i = 0; i < 16; ++i) data_[i] = -1;
  };
  auto snapshot = SnapshotSavePart(MixedPart(), session_, gate, device);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(drained);
  EXPECT_EQ(snapshot->report.device.bytes, 40000);
  EXPECT_TRUE(snapshot->report.device.over_budget);
  // What the trainer hears with the signal: every device byte staged, over the pinned budget.
  EXPECT_EQ(at_drain.device.bytes, 40000);
  EXPECT_TRUE(at_drain.device.over_budget);
  EXPECT_EQ(at_drain.pinned_budget_bytes, 16384);
  EXPECT_EQ(at_drain.copied_bytes, 64);
  EXPECT_EQ(at_drain.lent_bytes, 0);
  // 5 chunks through 2 buffers: the first 3 were written before the last could be copied.
  EXPECT_TRUE(at_drain.waited_for_writes);
  EXPECT_EQ(at_drain.bytes_written_before_snapshot, 3 * 8192);
  EXPECT_TRUE(snapshot->buffers.size() == 1u);  // the host piece's copy only
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  ASSERT_EQ(m.pieces_size(), 2);
  for (const pb::StoredPiece& piece : m.pieces()) {
    auto bytes =
        ReadFileRange(JoinPath(staging_, piece.file()), piece.byte_offset(), piece.byte_length());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    if (piece.key() == "d") {
      ASSERT_EQ(bytes->size(), 40000u);
      EXPECT_EQ(std::memcmp(bytes->data(), at_save.data(), 40000), 0);
    } else {
      std::vector<int32_t> host(16);
      for (int i = 0; i < 16; ++i) host[i] = 100 + i;
      EXPECT_EQ(std::memcmp(bytes->data(), host.data(), 64), 0);
    }
  }
}

TEST_F(DeviceSaveTest, PipelinedThroughAHostPoolTheMixedFileHoldsTheValuesAtSave) {
  const std::vector<int32_t> at_save = device_memory_;
  MemoryGate gate;
  HostBufferPool host_pool(8192, 4096);
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  device.host_pool = &host_pool;
  bool drained = false;
  device.on_device_drained = [&](const SnapshotReport&) {
    drained = true;
    for (int32_t& v : device_memory_) v = -1;
    for (int i = 0; i < 16; ++i) data_[i] = -1;
  };
  auto snapshot = SnapshotSavePart(MixedPart(), session_, gate, device);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(drained);
  EXPECT_EQ(snapshot->report.copied_bytes, 64);
  EXPECT_EQ(snapshot->report.pool_chunks, 1);
  EXPECT_TRUE(snapshot->buffers.empty());  // the host piece went through the pool
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(snapshot->report.buffered_files, 1);  // device pieces: written buffered
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  ASSERT_EQ(m.pieces_size(), 2);
  for (const pb::StoredPiece& piece : m.pieces()) {
    auto bytes =
        ReadFileRange(JoinPath(staging_, piece.file()), piece.byte_offset(), piece.byte_length());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    std::vector<int32_t> host(16);
    for (int i = 0; i < 16; ++i) host[i] = 100 + i;
    EXPECT_EQ(std::memcmp(bytes->data(), piece.key() == "d" ? at_save.data() : host.data(),
                          bytes->size()),
              0)
        << piece.key();
  }
}

TEST_F(DeviceSaveTest, DevicePiecesOnAWorkerWithoutStagingAreRefusedNamingTheTensor) {
  MemoryGate gate;
  auto snapshot = SnapshotSavePart(MixedPart(), session_, gate, {});
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(snapshot.status().message()),
              HasSubstr("rank 0 of job exec: tensor d is in device memory (device 0)"));
}

TEST_F(DeviceSaveTest, AFailedDeviceCopyFailsTheSnapshotNamingTensorAndRankWithoutDraining) {
  engine_.set_hook([](const HostCopy& c) {
    return c.bytes < 8192 ? absl::InternalError("CUDA cudaErrorLaunchFailure: injected")
                          : absl::OkStatus();
  });
  MemoryGate gate;
  bool drained = false;
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  device.on_device_drained = [&](const SnapshotReport&) { drained = true; };
  auto snapshot = SnapshotSavePart(MixedPart(), session_, gate, device);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(snapshot.status().message()),
              HasSubstr("rank 0 of job exec: tensor d bytes [32768, 40000)"));
  EXPECT_FALSE(drained);
}

TEST_F(DeviceSaveTest, AClosedGateStopsTheDeviceStagingWithItsReason) {
  MemoryGate gate;
  gate.Close(absl::AbortedError("rank 1 died"));
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  pb::SavePlanPart part = MixedPart();
  part.mutable_files(0)->mutable_pieces()->DeleteSubrange(0, 1);  // the device piece only
  auto snapshot = SnapshotSavePart(part, session_, gate, device);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(snapshot.status().message()), HasSubstr("rank 1 died"));
}

// A device tensor "big" (160 x 256 i32: 163840 bytes, 10x the pool's 16384-byte budget, 20
// chunks through 2 buffers), and a plan part holding it alone.
class TenTimesTheBudgetTest : public DeviceSaveTest {
 protected:
  static constexpr int64_t kBigBytes = 160 * 256 * 4;
  void SetUp() override {
    DeviceSaveTest::SetUp();
    big_memory_.resize(160 * 256);
    for (size_t i = 0; i < big_memory_.size(); ++i) big_memory_[i] = static_cast<int32_t>(3 * i);
    RegisteredTensor b;
    b.shard.mutable_tensor()->set_key("big");
    b.shard.mutable_tensor()->set_dtype(pb::DTYPE_I32);
    for (int64_t v : {160, 256}) b.shard.mutable_tensor()->add_global_shape(v);
    for (int64_t v : {0, 0}) b.shard.mutable_region()->add_offsets(v);
    for (int64_t v : {160, 256}) b.shard.mutable_region()->add_lengths(v);
    b.memory_kind = pb::MEMORY_DEVICE;
    b.nbytes = kBigBytes;
    b.device = 0;
    b.device_ptr = big_memory_.data();
    session_.tensors.push_back(b);
  }
  pb::SavePlanPart BigPart() {
    pb::SavePlanPart part = Part();
    part.set_total_bytes(kBigBytes);
    part.mutable_files(0)->set_total_bytes(kBigBytes);
    pb::PlanPiece* p = part.mutable_files(0)->mutable_pieces(0);
    *p->mutable_region() = session_.tensors[2].shard.region();
    p->set_key("big");
    p->clear_global_shape();
    p->add_global_shape(160);
    p->add_global_shape(256);
    p->set_size_bytes(kBigBytes);
    p->set_local_index(2);
    return part;
  }
  std::string DataFile() const { return JoinPath(staging_, "data/r0_0.safetensors"); }
  // Bytes of the data file written so far (0 before it exists).
  int64_t DataFileBytes() const {
    absl::StatusOr<int64_t> size = FileSize(DataFile());
    return size.ok() ? *size : 0;
  }
  std::vector<int32_t> big_memory_;
};

TEST_F(TenTimesTheBudgetTest, SavesCorrectlyWithinTheBudgetAndSaysTheSignalWaitedForWrites) {
  const std::vector<int32_t> at_save = big_memory_;
  // Before each copy: the pinned buffer it fills, and how far the data file is written.
  std::mutex mu;
  std::set<void*> buffers_used;
  int copies = 0;
  int64_t max_staged_not_written = 0;
  engine_.set_hook([&](const HostCopy& c) {
    std::lock_guard<std::mutex> lock(mu);
    buffers_used.insert(c.dst);
    ++copies;
    const int64_t written = std::max<int64_t>(0, DataFileBytes() - 4096);  // header: 4 KiB
    max_staged_not_written = std::max(max_staged_not_written, copies * int64_t{8192} - written);
    return absl::OkStatus();
  });
  MemoryGate gate;
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  SnapshotReport at_signal;
  int copies_at_signal = 0;
  int64_t file_bytes_at_signal = 0;
  device.on_device_drained = [&](const SnapshotReport& r) {
    at_signal = r;
    {
      std::lock_guard<std::mutex> lock(mu);
      copies_at_signal = copies;
    }
    file_bytes_at_signal = DataFileBytes();
    for (int32_t& v : big_memory_) v = -7;  // the trainer trains on
  };
  auto snapshot = SnapshotSavePart(BigPart(), session_, gate, device);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  // The signal came once the last device byte was copied, after 18 chunks were written.
  EXPECT_EQ(copies_at_signal, 20);
  EXPECT_TRUE(at_signal.waited_for_writes);
  EXPECT_EQ(at_signal.bytes_written_before_snapshot, 18 * 8192);
  EXPECT_EQ(file_bytes_at_signal, 4096 + 18 * 8192);
  EXPECT_EQ(at_signal.device.bytes, kBigBytes);
  EXPECT_TRUE(at_signal.device.over_budget);
  EXPECT_EQ(snapshot->report.bytes_written_before_snapshot, 18 * 8192);
  // Never more staged than the pool's two buffers hold, and only those two buffers, allocated
  // once; no pageable copy of the device state.
  EXPECT_LE(max_staged_not_written, 2 * 8192);
  EXPECT_EQ(buffers_used.size(), 2u);
  EXPECT_EQ(engine_.pinned_allocations(), 2);
  EXPECT_TRUE(snapshot->buffers.empty());
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  ASSERT_EQ(m.pieces_size(), 1);
  EXPECT_EQ(m.files(0).data_start(), 4096);
  // The file holds the values at Save, in order, and verifies against its recorded checksums.
  auto bytes = ReadFileRange(DataFile(), m.pieces(0).byte_offset(), kBigBytes);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(std::memcmp(bytes->data(), at_save.data(), kBigBytes), 0);
  EXPECT_EQ(Xxh3BlocksOf(*bytes, kDefaultChecksumBlockBytes), m.pieces(0).xxh3_64());
}

TEST_F(TenTimesTheBudgetTest, ACopyFailureMidStreamNamesTensorAndRankAndGivesNoSignal) {
  std::atomic<int> n{0};
  engine_.set_hook([&n](const HostCopy&) {
    return ++n == 8 ? absl::InternalError("CUDA cudaErrorIllegalAddress: injected")
                    : absl::OkStatus();
  });
  MemoryGate gate;
  bool signalled = false;
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  device.on_device_drained = [&](const SnapshotReport&) { signalled = true; };
  auto snapshot = SnapshotSavePart(BigPart(), session_, gate, device);
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(snapshot.status().message()),
              HasSubstr("rank 0 of job exec: tensor big bytes [57344, 65536)"));
  EXPECT_THAT(std::string(snapshot.status().message()), HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_FALSE(signalled);  // the trainer is never told its state was taken
  EXPECT_FALSE(PathExists(final_path_));
}

// A real failed write: the process's file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) stops the
// data file at 32 KiB, midway through the device tensor's chunks.
TEST_F(TenTimesTheBudgetTest, AWriteFailureMidStreamNamesTensorRankAndFileAndGivesNoSignal) {
  MemoryGate gate;
  bool signalled = false;
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  device.on_device_drained = [&](const SnapshotReport&) { signalled = true; };
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 32768;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  auto snapshot = SnapshotSavePart(BigPart(), session_, gate, device);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(snapshot.ok());
  const std::string message(snapshot.status().message());
  EXPECT_THAT(message, HasSubstr("rank 0 of job exec: tensor big bytes [24576, 32768)"));
  EXPECT_THAT(message, HasSubstr(DataFile()));
  EXPECT_FALSE(signalled);
  EXPECT_FALSE(PathExists(final_path_));
}

TEST_F(TenTimesTheBudgetTest, AnAbortAfterTheSignalStopsTheWritesOfTheChunksStillStaged) {
  MemoryGate gate;
  std::thread closer;
  DeviceSnapshotOptions device;
  device.staging = &pool_;
  device.on_device_drained = [&](const SnapshotReport&) {
    // The operation is aborted right after the signal (Close waits for the staging to end).
    closer = std::thread([&gate] { gate.Close(absl::AbortedError("rank 1 died")); });
    while (!gate.closed()) std::this_thread::yield();
  };
  auto snapshot = SnapshotSavePart(BigPart(), session_, gate, device);
  closer.join();
  EXPECT_EQ(snapshot.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(snapshot.status().message()),
              HasSubstr("tensor big bytes [147456, 155648)"));
  EXPECT_THAT(std::string(snapshot.status().message()), HasSubstr("rank 1 died"));
  EXPECT_EQ(DataFileBytes(), 4096 + 18 * 8192);  // the two chunks still staged were not written
}

}  // namespace
}  // namespace ckpt::worker
