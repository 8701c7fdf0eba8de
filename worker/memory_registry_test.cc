#include "worker/memory_registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "device/device_uuid.h"
#include "device/gpu.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

using ::testing::HasSubstr;

// A process table the test controls: pid -> start token (0 = dead).
class FakeProbe final : public ProcessProbe {
 public:
  explicit FakeProbe(std::map<pid_t, uint64_t>* table) : table_(table) {}
  uint64_t StartToken(pid_t pid) const override {
    auto it = table_->find(pid);
    return it == table_->end() ? 0 : it->second;
  }

 private:
  std::map<pid_t, uint64_t>* table_;
};

// Creates a shared-memory segment of `size` bytes; unlinks it (if still there) at the end.
class Segment {
 public:
  Segment(const std::string& name, size_t size) : name_(name), size_(size) {
    shm_unlink(name.c_str());
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, size), 0);
    addr_ = static_cast<std::byte*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~Segment() {
    munmap(addr_, size_);
    shm_unlink(name_.c_str());
  }
  std::byte* data() { return addr_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  size_t size_;
  std::byte* addr_;
};

bool SegmentExists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

pb::SharedTensor HostTensor(const std::string& key, const std::string& segment, int64_t offset,
                            int64_t rows, int64_t cols) {
  pb::SharedTensor t;
  pb::TensorMeta* meta = t.mutable_shard()->mutable_tensor();
  meta->set_key(key);
  meta->set_dtype(pb::DTYPE_F32);
  meta->add_global_shape(rows * 2);
  meta->add_global_shape(cols);
  pb::Region* region = t.mutable_shard()->mutable_region();
  region->add_offsets(rows);
  region->add_offsets(0);
  region->add_lengths(rows);
  region->add_lengths(cols);
  t.set_memory_kind(pb::MEMORY_HOST);
  t.set_segment(segment);
  t.set_offset(offset);
  t.set_nbytes(rows * cols * 4);
  return t;
}

// A device tensor of rows x cols f32 at `ipc_offset` in an allocation of 8192 bytes on GPU 0.
// The UUID of the GPU the tests' worker serves (and their device tensors are on).
const std::string kWorkerGpuUuid(kDeviceUuidBytes, '\x5a');

pb::SharedTensor DeviceTensor(const std::string& key, int64_t ipc_offset, int64_t rows,
                              int64_t cols) {
  pb::SharedTensor t = HostTensor(key, "", 0, rows, cols);
  t.set_memory_kind(pb::MEMORY_DEVICE);
  t.clear_segment();
  t.set_cuda_ipc_handle(std::string(kCudaIpcHandleBytes, '\x01'));
  t.set_device(0);
  t.set_device_uuid(kWorkerGpuUuid);
  t.set_ipc_offset(ipc_offset);
  t.set_allocation_bytes(8192);
  return t;
}

class MemoryRegistryTest : public ::testing::Test {
 protected:
  MemoryRegistryTest() : registry_(std::make_unique<FakeProbe>(&table_)) { table_[pid_] = 7; }
  std::string Name(int n) { return absl::StrCat("/ckpt.test.r0.p", pid_, ".", n); }
  TrainerIdentity Trainer() { return TrainerIdentity{"job", 0, 2, 0, pid_}; }

  pid_t pid_ = getpid();
  std::map<pid_t, uint64_t> table_;
  MemoryRegistry registry_;
};

TEST_F(MemoryRegistryTest, SharesTheTrainersBytesWithoutCopies) {
  Segment seg(Name(1), 4096);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok()) << session.status();
  pb::SharedTensor a = HostTensor("a", seg.name(), 0, 2, 3);
  pb::SharedTensor b = HostTensor("b", seg.name(), 64, 1, 4);
  ASSERT_TRUE(registry_.RegisterTensors(*session, {a, b}).ok());
  auto info = registry_.Find(*session);
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->tensors.size(), 2u);
  EXPECT_EQ(info->segments, std::vector<std::string>{seg.name()});
  // The worker's mapping and the trainer's are the same memory, both ways.
  float v = 3.5f;
  std::memcpy(seg.data() + 64, &v, 4);
  float seen = 0;
  std::memcpy(&seen, info->tensors[1].data, 4);
  EXPECT_EQ(seen, 3.5f);
  float w = -1.25f;
  std::memcpy(info->tensors[0].data + 4, &w, 4);
  std::memcpy(&seen, seg.data() + 4, 4);
  EXPECT_EQ(seen, -1.25f);
}

TEST_F(MemoryRegistryTest, RejectsByteCountThatDoesNotMatchTheRegion) {
  Segment seg(Name(1), 4096);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  pb::SharedTensor t = HostTensor("layers.0.w", seg.name(), 0, 2, 3);
  t.set_nbytes(20);
  absl::Status s = registry_.RegisterTensors(*session, {t});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layers.0.w"));
  EXPECT_THAT(s.message(), HasSubstr("needs 24 bytes"));
}

TEST_F(MemoryRegistryTest, RejectsBytesOutsideTheSegment) {
  Segment seg(Name(1), 16);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  absl::Status s = registry_.RegisterTensors(*session, {HostTensor("a", seg.name(), 8, 2, 3)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("outside segment"));
}

TEST_F(MemoryRegistryTest, RejectsRegionOutsideTheTensor) {
  Segment seg(Name(1), 4096);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  pb::SharedTensor t = HostTensor("a", seg.name(), 0, 2, 3);
  t.mutable_shard()->mutable_region()->set_offsets(0, 3);
  EXPECT_EQ(registry_.RegisterTensors(*session, {t}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MemoryRegistryTest, RejectsSegmentsOfOtherProcessesAndMissingOnes) {
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  absl::Status other = registry_.RegisterTensors(
      *session, {HostTensor("a", absl::StrCat("/ckpt.test.r0.p", pid_ + 1, ".1"), 0, 1, 1)});
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("is not one the client library"));
  EXPECT_EQ(ValidateSegmentName("/etc/passwd", pid_).code(), absl::StatusCode::kInvalidArgument);
  absl::Status missing = registry_.RegisterTensors(*session, {HostTensor("a", Name(99), 0, 1, 1)});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
}

TEST_F(MemoryRegistryTest, DeviceTensorsNeedAWorkerThatServesAGpu) {
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  pb::SharedTensor t = DeviceTensor("a", 0, 1, 1);
  absl::Status s = registry_.RegisterTensors(*session, {t});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job job rank 0: tensor a (device 0) is in device memory, "
                        "but this worker serves no GPU"));
  if (!CudaDeviceCount().ok()) {
    EXPECT_THAT(s.message(), HasSubstr("CUDA"));
  }
}

TEST(CheckDeviceShareTest, AcceptsATensorInsideItsAllocationOnTheWorkersGpu) {
  pb::SharedTensor t = DeviceTensor("w", 4096, 16, 4);  // 256 bytes at 4096 of 8192
  EXPECT_TRUE(CheckDeviceShare(t, 0, kWorkerGpuUuid, "").ok());
  t.set_ipc_offset(8192 - 256);
  EXPECT_TRUE(CheckDeviceShare(t, 0, kWorkerGpuUuid, "").ok());
}

TEST(CheckDeviceShareTest, RefusesBytesOutsideTheAllocationNamingTensorAndDevice) {
  pb::SharedTensor t = DeviceTensor("layers.0.w", 8192 - 255, 16, 4);
  absl::Status s = CheckDeviceShare(t, 0, kWorkerGpuUuid, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor layers.0.w (device 0): bytes [7937, 8193) lie "
                                     "outside its CUDA allocation of 8192 bytes"));
  t.set_ipc_offset(-1);
  EXPECT_EQ(CheckDeviceShare(t, 0, kWorkerGpuUuid, "").code(), absl::StatusCode::kInvalidArgument);
  t.set_ipc_offset(0);
  t.set_allocation_bytes(0);
  EXPECT_EQ(CheckDeviceShare(t, 0, kWorkerGpuUuid, "").code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckDeviceShareTest, RefusesAHandleOfTheWrongSize) {
  pb::SharedTensor t = DeviceTensor("w", 0, 1, 1);
  t.set_cuda_ipc_handle("short");
  absl::Status s = CheckDeviceShare(t, 0, kWorkerGpuUuid, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor w (device 0): its CUDA IPC handle has 5 bytes, "
                                     "expected 64"));
}

TEST(CheckDeviceShareTest, RefusesATensorOnAnotherGpuByUuidAndSaysWhatToDo) {
  pb::SharedTensor t = DeviceTensor("w", 0, 1, 1);
  t.set_device(1);  // the same ordinal as the worker's: only the UUID tells them apart
  t.set_device_uuid(std::string(kDeviceUuidBytes, '\x11'));
  absl::Status s = CheckDeviceShare(t, 1, kWorkerGpuUuid, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor w is on GPU GPU-11111111-1111-1111-1111-111111111111 (device 1 "
                        "in the trainer), not on GPU GPU-5a5a5a5a-5a5a-5a5a-5a5a-5a5a5a5a5a5a "
                        "(device 1 in the worker), the one this worker serves: run one worker "
                        "per GPU"));
  EXPECT_THAT(CheckDeviceShare(t, -1, "", "started with --gpu -1").message(),
              HasSubstr("serves no GPU: started with --gpu -1"));
}

TEST(CheckDeviceShareTest, AcceptsTheWorkersGpuUnderAnotherOrdinalInTheTrainer) {
  pb::SharedTensor t = DeviceTensor("w", 0, 1, 1);
  t.set_device(0);  // the trainer sees only this GPU (CUDA_VISIBLE_DEVICES=2)
  EXPECT_TRUE(CheckDeviceShare(t, 2, kWorkerGpuUuid, "").ok());
}

TEST(CheckDeviceShareTest, RefusesAShareWithoutADeviceUuid) {
  pb::SharedTensor t = DeviceTensor("w", 0, 1, 1);
  t.clear_device_uuid();
  absl::Status s = CheckDeviceShare(t, 0, kWorkerGpuUuid, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tensor w"));
  EXPECT_THAT(s.message(), HasSubstr("device UUID <no uuid>"));
}

TEST_F(MemoryRegistryTest, AValidDeviceShareIsOpenedOnTheServedGpuAndErrorsNameTheTensor) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present; opening is covered by GPU tests";
  registry_.ServeDevice(0, kWorkerGpuUuid);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  // Validation passes; opening the handle fails without a GPU, and says which tensor and why.
  absl::Status s = registry_.RegisterTensors(*session, {DeviceTensor("opt.m", 0, 4, 4)});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("job job rank 0: tensor opt.m (device 0): opening its "
                        "CUDA IPC handle: no CUDA device"));
  pb::SharedTensor bad = DeviceTensor("opt.v", 0, 4, 4);
  bad.set_cuda_ipc_handle(std::string(63, 'x'));
  EXPECT_EQ(registry_.RegisterTensors(*session, {bad}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MemoryRegistryTest, OpenSessionNeedsALiveTrainer) {
  TrainerIdentity dead = Trainer();
  dead.pid = pid_ + 12345;
  EXPECT_EQ(registry_.OpenSession(dead).status().code(), absl::StatusCode::kInvalidArgument);
  TrainerIdentity bad_rank = Trainer();
  bad_rank.rank = 2;
  EXPECT_EQ(registry_.OpenSession(bad_rank).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MemoryRegistryTest, DeadTrainersSegmentsAreUnlinked) {
  Segment seg(Name(1), 4096);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(registry_.RegisterTensors(*session, {HostTensor("a", seg.name(), 0, 2, 3)}).ok());
  EXPECT_TRUE(registry_.ReapDeadTrainers().empty());
  EXPECT_TRUE(SegmentExists(seg.name()));
  table_[pid_] = 0;  // the trainer died
  auto reaped = registry_.ReapDeadTrainers();
  ASSERT_EQ(reaped.size(), 1u);
  EXPECT_EQ(reaped[0].trainer.rank, 0);
  EXPECT_EQ(reaped[0].segments, std::vector<std::string>{seg.name()});
  EXPECT_FALSE(SegmentExists(seg.name()));
  EXPECT_EQ(registry_.Find(*session).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(MemoryRegistryTest, ARanksReplacementTrainerStillCountsAfterTheOldOneIsReaped) {
  auto old_session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(old_session.ok()) << old_session.status();
  TrainerIdentity replacement = Trainer();
  replacement.pid = pid_ + 1;
  table_[replacement.pid] = 9;
  auto new_session = registry_.OpenSession(replacement);
  ASSERT_TRUE(new_session.ok()) << new_session.status();
  EXPECT_EQ(registry_.SessionsOfRank("job", 0), 2);
  table_[pid_] = 0;  // the old trainer died after its replacement said Hello
  ASSERT_EQ(registry_.ReapDeadTrainers().size(), 1u);
  // The worker skips the dead trainer's DetachRank: the rank is attached through the new one.
  EXPECT_EQ(registry_.SessionsOfRank("job", 0), 1);
  EXPECT_EQ(registry_.SessionsOfRank("job", 1), 0);
  EXPECT_EQ(registry_.SessionsOfRank("other", 0), 0);
}

// Whether [addr, addr + bytes) is mapped in this process (msync fails with ENOMEM otherwise).
bool Mapped(const void* addr, size_t bytes) {
  uintptr_t page = reinterpret_cast<uintptr_t>(addr) & ~uintptr_t{4095};
  return msync(reinterpret_cast<void*>(page), bytes, MS_ASYNC) == 0;
}

// A plan part copies into a SessionInfo's tensors while the reaper closes the session (the
// trainer died): the memory must stay mapped until the part lets go of its SessionInfo.
TEST_F(MemoryRegistryTest, ASessionSnapshotKeepsItsTensorsMappedAfterTheSessionEnds) {
  Segment seg(Name(1), 4096);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(registry_.RegisterTensors(*session, {HostTensor("a", seg.name(), 0, 2, 3)}).ok());
  auto running_part = registry_.Find(*session);
  ASSERT_TRUE(running_part.ok());
  const std::byte* data = running_part->tensors[0].data;
  table_[pid_] = 0;  // the trainer died
  ASSERT_EQ(registry_.ReapDeadTrainers().size(), 1u);
  EXPECT_FALSE(SegmentExists(seg.name()));  // unlinked at once
  ASSERT_TRUE(Mapped(data, 24)) << "the session's mapping went away under a running part";
  std::memset(running_part->tensors[0].data, 1, 24);  // still writable, no crash
  running_part = absl::NotFoundError("the part ended");
  EXPECT_FALSE(Mapped(data, 24)) << "the mapping outlived every reference to it";
}

TEST_F(MemoryRegistryTest, ReusedPidCountsAsDead) {
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  table_[pid_] = 8;  // another process got the pid
  EXPECT_EQ(registry_.ReapDeadTrainers().size(), 1u);
}

TEST_F(MemoryRegistryTest, ClosingASessionLeavesItsSegmentsToTheTrainerForItsNextSession) {
  Segment seg(Name(1), 64);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(registry_.RegisterTensors(*session, {HostTensor("a", seg.name(), 0, 1, 1)}).ok());
  ASSERT_TRUE(registry_.CloseSession(*session).ok());
  EXPECT_TRUE(SegmentExists(seg.name()));
  EXPECT_EQ(registry_.CloseSession(*session).code(), absl::StatusCode::kNotFound);
  // The same process's next session registers the same memory.
  auto next = registry_.OpenSession(Trainer());
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(registry_.RegisterTensors(*next, {HostTensor("a", seg.name(), 0, 1, 1)}).ok());
}

TEST_F(MemoryRegistryTest, ReapingADeadTrainerUnlinksItsSegments) {
  Segment seg(Name(1), 64);
  auto session = registry_.OpenSession(Trainer());
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE(registry_.RegisterTensors(*session, {HostTensor("a", seg.name(), 0, 1, 1)}).ok());
  table_[pid_] = 0;  // the trainer died
  EXPECT_EQ(registry_.ReapDeadTrainers().size(), 1u);
  EXPECT_FALSE(SegmentExists(seg.name()));
}

// Reports one pid dead and every other alive. The sweep reads the real /dev/shm, which other
// tests running at the same time share: a probe that called their trainers dead would unlink
// their live segments.
class OnePidDeadProbe final : public ProcessProbe {
 public:
  explicit OnePidDeadProbe(pid_t dead) : dead_(dead) {}
  uint64_t StartToken(pid_t pid) const override { return pid == dead_ ? 0 : 1; }

 private:
  const pid_t dead_;
};

TEST_F(MemoryRegistryTest, SweepRemovesOnlySegmentsOfDeadProcesses) {
  Segment mine(Name(1), 64);
  const pid_t dead_pid = (1 << 22) + 7;  // above Linux's PID_MAX_LIMIT: no real process has it
  Segment orphan(absl::StrCat("/ckpt.test.r1.p", dead_pid, ".3"), 64);
  Segment unrelated(absl::StrCat("/notckpt.test.r1.p", dead_pid, ".3"), 64);
  OnePidDeadProbe probe(dead_pid);
  std::vector<std::string> removed = SweepOrphanSegments(probe);
  EXPECT_THAT(removed, ::testing::ElementsAre(orphan.name()));
  EXPECT_TRUE(SegmentExists(mine.name()));
  EXPECT_FALSE(SegmentExists(orphan.name()));
  EXPECT_TRUE(SegmentExists(unrelated.name()));
}

TEST_F(MemoryRegistryTest, SweepRemovesOrphansOfAllowedTrainerUidsOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a segment to another uid needs root";
  constexpr uid_t kNobody = 65534;
  const pid_t dead_pid = (1 << 22) + 11;  // above PID_MAX_LIMIT: no real process has it
  Segment orphan(absl::StrCat("/ckpt.other-uid.r0.p", dead_pid, ".1"), 64);
  ASSERT_EQ(chown(absl::StrCat("/dev/shm", orphan.name()).c_str(), kNobody, kNobody), 0)
      << std::strerror(errno);
  OnePidDeadProbe probe(dead_pid);
  // Another user's segment is not this worker's business unless it serves that user's trainers.
  EXPECT_THAT(SweepOrphanSegments(probe), ::testing::IsEmpty());
  EXPECT_TRUE(SegmentExists(orphan.name()));
  EXPECT_THAT(SweepOrphanSegments(probe, {kNobody}), ::testing::ElementsAre(orphan.name()));
  EXPECT_FALSE(SegmentExists(orphan.name()));
}

TEST(ProcfsProcessProbeTest, TokenIsTheStartTimeAndStaysStableWhileTheProcessRuns) {
  ProcfsProcessProbe probe;
  uint64_t before = probe.StartToken(getpid());
  // Growing the address space changes other /proc/<pid>/stat fields (vsize), not the token.
  size_t size = size_t{256} << 20;
  void* big = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(big, MAP_FAILED);
  static_cast<char*>(big)[0] = 1;
  EXPECT_EQ(probe.StartToken(getpid()), before);
  munmap(big, size);
  // The start time (in clock ticks since boot) of the test process is before "now".
  std::ifstream uptime("/proc/uptime");
  double seconds = 0;
  uptime >> seconds;
  EXPECT_LE(before - 1, static_cast<uint64_t>(seconds * sysconf(_SC_CLK_TCK)) + 1);
}

TEST(ProcfsProcessProbeTest, SeesLiveZombieAndReapedProcesses) {
  ProcfsProcessProbe probe;
  EXPECT_NE(probe.StartToken(getpid()), 0u);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  EXPECT_NE(probe.StartToken(child), 0u);
  ASSERT_EQ(kill(child, SIGKILL), 0);
  // Until reaped the child is a zombie; a zombie counts as dead. waitid(WNOWAIT) returns once
  // the child has exited, leaving it unreaped.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(probe.StartToken(child), 0u);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(probe.StartToken(child), 0u);
  EXPECT_EQ(probe.StartToken(-1), 0u);
}

}  // namespace
}  // namespace ckpt::worker
