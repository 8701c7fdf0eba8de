// The pipelined save (SnapshotSavePart with a host pool): the files match WriteDataFiles' byte
// for byte, the pool bounds the memory (back-pressure), chunks are written in pipeline order,
// a second save faults in no new memory, lent pieces are not copied, O_DIRECT is reported.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/manifest.pb.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/io_engine.h"
#include "worker/host_buffer_pool.h"
#include "worker/save_executor.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kChunk = 64 << 10;  // the pool's chunk in most tests

int64_t ThreadMinorFaults() {
  struct rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// A trainer's host state: u8 tensors "t<i>" of the given sizes in one shared segment, with
// random bytes, registered in a session of job `job`.
class Trainer {
 public:
  Trainer(MemoryRegistry& registry, const std::string& job, const std::vector<int64_t>& sizes,
          bool lend = false)
      : sizes_(sizes) {
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    total_ = std::max<int64_t>(total, 1);
    static int counter = 0;
    segment_ = absl::StrCat("/ckpt.pipe.p", getpid(), ".", ++counter);
    shm_unlink(segment_.c_str());
    const int fd = shm_open(segment_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, total_), 0);
    data_ = static_cast<char*>(
        mmap(nullptr, static_cast<size_t>(total_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    std::mt19937 rng(static_cast<unsigned>(counter));
    for (int64_t i = 0; i < total; ++i) data_[i] = static_cast<char>(rng());
    auto session = registry.OpenSession(TrainerIdentity{job, 0, 1, 0, getpid()});
    EXPECT_TRUE(session.ok());
    std::vector<pb::SharedTensor> tensors;
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      pb::SharedTensor t;
      t.mutable_shard()->mutable_tensor()->set_key(absl::StrCat("t", i));
      t.mutable_shard()->mutable_tensor()->set_dtype(pb::DTYPE_U8);
      t.mutable_shard()->mutable_tensor()->add_global_shape(sizes[i]);
      t.mutable_shard()->mutable_region()->add_offsets(0);
      t.mutable_shard()->mutable_region()->add_lengths(sizes[i]);
      t.set_memory_kind(pb::MEMORY_HOST);
      t.set_segment(segment_);
      t.set_offset(offset);
      t.set_nbytes(sizes[i]);
      t.set_lent_until_durable(lend);
      tensors.push_back(t);
      offset += sizes[i];
    }
    EXPECT_TRUE(registry.RegisterTensors(*session, tensors).ok());
    auto info = registry.Find(*session);
    EXPECT_TRUE(info.ok());
    session_ = *info;
  }
  ~Trainer() {
    munmap(data_, static_cast<size_t>(total_));
    shm_unlink(segment_.c_str());
  }

  const SessionInfo& session() const { return session_; }
  char* tensor(int i) const { return reinterpret_cast<char*>(session_.tensors[i].data); }
  int64_t size(int i) const { return sizes_[i]; }

  // A part writing file f with the tensors files[f], in order.
  pb::SavePlanPart Part(const std::string& staging,
                        const std::vector<std::vector<int>>& files) const {
    pb::SavePlanPart part;
    part.set_rank(0);
    part.set_staging_dir(staging);
    for (size_t f = 0; f < files.size(); ++f) {
      pb::PlanFile* file = part.add_files();
      file->set_path(absl::StrCat("data/r0_", f, ".safetensors"));
      for (int i : files[f]) {
        pb::PlanPiece* p = file->add_pieces();
        p->set_size_bytes(sizes_[i]);
        p->set_local_index(i);
        part.set_total_bytes(part.total_bytes() + sizes_[i]);
      }
    }
    return part;
  }

  // What WriteDataFiles writes for the same files, from the trainer's memory as it is now:
  // file name -> bytes, and the records.
  std::map<std::string, std::string> Expected(const std::vector<std::vector<int>>& files,
                                              WrittenData* records) const {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto dir = CreateStagingDir(absl::StrCat(tmp ? tmp : "/tmp", "/expected-", getpid()), true);
    EXPECT_TRUE(dir.ok());
    std::vector<TensorMeta> metas;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      metas.push_back(TensorMeta{absl::StrCat("t", i), DType::kU8, {sizes_[i]}});
    }
    std::vector<DataFilePlan> plans;
    for (const std::vector<int>& file : files) {
      DataFilePlan plan;
      for (int i : file) {
        PieceData piece;
        piece.key = metas[i].key;
        piece.region = Region{{0}, {sizes_[i]}, std::nullopt};
        piece.data = tensor(i);
        piece.size_bytes = sizes_[i];
        plan.pieces.push_back(piece);
      }
      plans.push_back(plan);
    }
    auto written = WriteDataFiles(*dir, metas, plans, 0, WriteOptions());
    EXPECT_TRUE(written.ok()) << written.status();
    std::map<std::string, std::string> out;
    for (const pb::DataFile& f : written->files) {
      out[f.name()] = *ReadWholeFile(JoinPath(*dir, f.name()), int64_t{1} << 30);
    }
    *records = *std::move(written);
    (void)RemoveTree(*dir);
    return out;
  }

 private:
  std::vector<int64_t> sizes_;
  int64_t total_ = 0;
  std::string segment_;
  char* data_ = nullptr;
  SessionInfo session_;
};

class PipelinedSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    final_path_ = absl::StrCat(tmp ? tmp : "/tmp", "/pipelined-", getpid());
  }
  void TearDown() override {
    for (const std::string& s : stagings_) (void)RemoveTree(s);
  }
  std::string Staging() {
    auto staging = CreateStagingDir(absl::StrCat(final_path_, "-", stagings_.size()), true);
    EXPECT_TRUE(staging.ok()) << staging.status();
    stagings_.push_back(*staging);
    return *staging;
  }

  // Snapshot + write through `pool`; the written record, the snapshot's report in `report`.
  pb::Manifest Save(const Trainer& trainer, const pb::SavePlanPart& part, HostBufferPool& pool,
                    SnapshotReport* report = nullptr, const DeviceSnapshotOptions& base = {}) {
    MemoryGate gate;
    DeviceSnapshotOptions options = base;
    options.host_pool = &pool;
    auto snapshot = SnapshotSavePart(part, trainer.session(), gate, options);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    if (!snapshot.ok()) return {};
    auto written = WriteSnapshot(*snapshot, nullptr);
    EXPECT_TRUE(written.ok()) << written.status();
    if (report != nullptr) *report = snapshot->report;
    pb::Manifest m;
    EXPECT_TRUE(written.ok() && m.ParseFromString(*written));
    return m;
  }

  // Every file of `m` in `staging` holds the bytes of `expected`, and the records match.
  void ExpectIdentical(const pb::Manifest& m, const std::string& staging,
                       const std::map<std::string, std::string>& expected,
                       const WrittenData& records) {
    ASSERT_EQ(m.files_size(), static_cast<int>(expected.size()));
    for (const pb::DataFile& f : m.files()) {
      auto bytes = ReadWholeFile(JoinPath(staging, f.name()), int64_t{1} << 30);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_TRUE(*bytes == expected.at(f.name())) << f.name() << " differs";
    }
    ASSERT_EQ(m.pieces_size(), static_cast<int>(records.pieces.size()));
    for (int i = 0; i < m.pieces_size(); ++i) {
      EXPECT_EQ(m.pieces(i).SerializeAsString(), records.pieces[i].SerializeAsString());
    }
    for (int i = 0; i < m.files_size(); ++i) {
      EXPECT_EQ(m.files(i).SerializeAsString(), records.files[i].SerializeAsString());
    }
  }

  std::string final_path_;
  std::vector<std::string> stagings_;
  MemoryRegistry registry_;
};

TEST_F(PipelinedSaveTest, FilesAndRecordsAreByteIdenticalToWriteDataFiles) {
  // Pieces that end mid-chunk, span chunks, are empty or tiny, across three files.
  const Trainer trainer(registry_, "job", {5000, 3 * kChunk + 123, 1, 0, 2 * kChunk, 77, 4096});
  const std::vector<std::vector<int>> files = {{0, 1, 2}, {3, 4}, {5, 6}};
  WrittenData records;
  const auto expected = trainer.Expected(files, &records);
  HostBufferPool pool(2 * kChunk, kChunk);
  const std::string staging = Staging();
  const pb::Manifest m = Save(trainer, trainer.Part(staging, files), pool);
  ExpectIdentical(m, staging, expected, records);
}

TEST_F(PipelinedSaveTest, APoolOfTwoChunksSavesATenChunkPieceAndSaysTheSnapshotWaited) {
  const Trainer trainer(registry_, "job", {10 * kChunk});
  WrittenData records;
  const auto expected = trainer.Expected({{0}}, &records);
  HostBufferPool pool(2 * kChunk, kChunk);
  const std::string staging = Staging();
  SnapshotReport report;
  const pb::Manifest m = Save(trainer, trainer.Part(staging, {{0}}), pool, &report);
  ExpectIdentical(m, staging, expected, records);
  EXPECT_EQ(pool.stats().chunks_mapped, 2);  // never more than the bound
  EXPECT_EQ(report.pool_chunks, 10);
  EXPECT_EQ(report.copied_bytes, 10 * kChunk);
  EXPECT_TRUE(report.host_waited_for_pool);
  EXPECT_TRUE(report.waited_for_writes);
}

TEST_F(PipelinedSaveTest, ChunkKIsWrittenBeforeChunkKPlusThePoolSizeIsCopied) {
  const Trainer trainer(registry_, "job", {4 * kChunk, 6 * kChunk});
  HostBufferPool pool(2 * kChunk, kChunk);
  std::mutex mu;
  std::vector<std::pair<SavePipelineEvent::Kind, int64_t>> events;
  DeviceSnapshotOptions options;
  options.trace = [&](const SavePipelineEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.emplace_back(e.kind, e.chunk);
  };
  Save(trainer, trainer.Part(Staging(), {{0, 1}}), pool, nullptr, options);
  std::map<std::pair<SavePipelineEvent::Kind, int64_t>, size_t> when;
  for (size_t i = 0; i < events.size(); ++i) when[events[i]] = i;
  ASSERT_EQ(events.size(), 20u);  // ten chunks, each copied and written once
  for (int64_t k = 0; k + 2 < 10; ++k) {
    SCOPED_TRACE(absl::StrCat("chunk ", k));
    EXPECT_LT(when.at({SavePipelineEvent::kWritten, k}),
              when.at({SavePipelineEvent::kCopied, k + 2}));
  }
  for (int64_t k = 0; k < 10; ++k) {  // and each is copied before it is written
    EXPECT_LT(when.at({SavePipelineEvent::kCopied, k}), when.at({SavePipelineEvent::kWritten, k}));
  }
}

// The worker's mappings of the trainers' segments fault in on first read, whatever the pool
// does: read them once, so that the faults counted in a snapshot are its own.
void MapSources(std::initializer_list<const Trainer*> trainers) {
  for (const Trainer* trainer : trainers) {
    for (const RegisteredTensor& t : trainer->session().tensors) {
      const volatile char* p = reinterpret_cast<const char*>(t.data);
      for (int64_t at = 0; at < t.nbytes; at += 4096) (void)p[at];
    }
  }
}

// Snapshot + write of `trainer`'s tensor 0 through `pool`: the minor page faults the snapshot
// (the calling thread) took.
int64_t SnapshotFaults(const Trainer& trainer, HostBufferPool& pool, const std::string& staging) {
  MemoryGate gate;
  DeviceSnapshotOptions options;
  options.host_pool = &pool;
  const pb::SavePlanPart part = trainer.Part(staging, {{0}, {}});
  const int64_t faults_before = ThreadMinorFaults();
  auto snapshot = SnapshotSavePart(part, trainer.session(), gate, options);
  const int64_t faults = ThreadMinorFaults() - faults_before;
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  if (snapshot.ok()) {
    EXPECT_TRUE(WriteSnapshot(*snapshot, nullptr).ok());
  }
  return faults;
}

constexpr int64_t kBig = int64_t{16} << 20;  // 4096 pages: what a copy into fresh memory faults

TEST_F(PipelinedSaveTest, WithAPrefaultedPoolEverySaveOfEveryJobFaultsInNoNewMemory) {
  const Trainer first(registry_, "job-a", {kBig});
  const Trainer second(registry_, "job-b", {kBig / 2, kBig / 2});
  MapSources({&first, &second});
  HostBufferPool pool(int64_t{32} << 20, int64_t{1} << 20);
  ASSERT_TRUE(pool.Prefault().ok());
  for (const Trainer* trainer : {&first, &second, &first}) {
    EXPECT_LT(SnapshotFaults(*trainer, pool, Staging()), 64)
        << "the snapshot faulted in new memory";
    EXPECT_EQ(pool.stats().bytes_mapped, int64_t{32} << 20) << "the save mapped new memory";
  }
}

TEST_F(PipelinedSaveTest, ALazyPoolFaultsInItsBoundOnceAcrossSavesOfSeveralJobs) {
  const Trainer first(registry_, "job-a", {kBig});
  const Trainer second(registry_, "job-b", {kBig / 2, kBig / 2});
  MapSources({&first, &second});
  constexpr int64_t kBound = int64_t{4} << 20;  // 1024 pages; each save is four times that
  HostBufferPool pool(kBound, int64_t{1} << 20);
  int64_t faults = 0;
  for (const Trainer* trainer : {&first, &second, &first, &second}) {
    faults += SnapshotFaults(*trainer, pool, Staging());
  }
  // Fresh buffers would have faulted in 4 x 4096 pages; the pool its 1024 once (fewer with
  // huge pages), plus a few for the snapshot's own bookkeeping.
  EXPECT_LT(faults, kBound / 4096 + 4 * 64);
  EXPECT_LE(pool.stats().bytes_mapped, kBound);
  EXPECT_GT(pool.stats().reuses, 0);
}

TEST_F(PipelinedSaveTest, TheTrainerMayOverwriteItsTensorsOnceTheSnapshotReturned) {
  const Trainer trainer(registry_, "job", {10 * kChunk});
  WrittenData records;
  const auto expected = trainer.Expected({{0}}, &records);
  HostBufferPool pool(2 * kChunk, kChunk);
  MemoryGate gate;
  DeviceSnapshotOptions options;
  options.host_pool = &pool;
  bool signalled = false;
  options.on_device_drained = [&](const SnapshotReport&) { signalled = true; };
  const std::string staging = Staging();
  auto snapshot = SnapshotSavePart(trainer.Part(staging, {{0}}), trainer.session(), gate, options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(signalled);
  std::memset(trainer.tensor(0), 0x5a, static_cast<size_t>(trainer.size(0)));
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  ExpectIdentical(m, staging, expected, records);
}

TEST_F(PipelinedSaveTest, LentPiecesAreWrittenFromTheTrainersMemoryWithoutACopy) {
  const Trainer lent(registry_, "job", {3 * kChunk + 5, 100}, /*lend=*/true);
  HostBufferPool pool(2 * kChunk, kChunk);
  MemoryGate gate;
  DeviceSnapshotOptions options;
  options.host_pool = &pool;
  const std::string staging = Staging();
  auto snapshot = SnapshotSavePart(lent.Part(staging, {{0, 1}}), lent.session(), gate, options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->report.copied_bytes, 0);
  EXPECT_EQ(snapshot->report.pool_chunks, 0);
  EXPECT_EQ(snapshot->report.lent_bytes, 3 * kChunk + 105);
  // A change before the write (which a lender promises not to make) is what gets stored: no
  // copy was taken.
  std::memset(lent.tensor(0), 0x11, 100);
  WrittenData records;
  const auto expected = lent.Expected({{0, 1}}, &records);
  auto written = WriteSnapshot(*snapshot, nullptr);
  ASSERT_TRUE(written.ok()) << written.status();
  pb::Manifest m;
  ASSERT_TRUE(m.ParseFromString(*written));
  ExpectIdentical(m, staging, expected, records);
  EXPECT_EQ(pool.stats().chunks_mapped, 0);
}

TEST_F(PipelinedSaveTest, FilesGoODirectWhereAllowedAndARefusalFallsBackAndIsReported) {
  const Trainer trainer(registry_, "job", {5 * kChunk + 7, 3000});
  const std::vector<std::vector<int>> files = {{0}, {1}};
  WrittenData records;
  const auto expected = trainer.Expected(files, &records);
  HostBufferPool pool(4 * kChunk, kChunk);
  SnapshotReport report;
  std::string staging = Staging();
  ExpectIdentical(Save(trainer, trainer.Part(staging, files), pool, &report), staging, expected,
                  records);
  if (!report.direct_io_refused) {  // file 1 has no whole block: buffered
    EXPECT_EQ(report.direct_io_files, 1);
    EXPECT_EQ(report.buffered_files, 1);
  }
  SetDirectIoRefusedForTesting(true);
  staging = Staging();
  const pb::Manifest m = Save(trainer, trainer.Part(staging, files), pool, &report);
  SetDirectIoRefusedForTesting(false);
  ExpectIdentical(m, staging, expected, records);
  EXPECT_TRUE(report.direct_io_refused);
  EXPECT_EQ(report.direct_io_files, 0);
  EXPECT_EQ(report.buffered_files, 2);
}

TEST_F(PipelinedSaveTest, AnAbortStopsTheWritesWithTheGatesReason) {
  const Trainer trainer(registry_, "job", {10 * kChunk});
  HostBufferPool pool(16 * kChunk, kChunk);
  MemoryGate gate;
  DeviceSnapshotOptions options;
  options.host_pool = &pool;
  auto snapshot =
      SnapshotSavePart(trainer.Part(Staging(), {{0}}), trainer.session(), gate, options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  gate.Close(absl::AbortedError("rank 3 failed"));
  auto written = WriteSnapshot(*snapshot, nullptr, [&gate] { return gate.closed(); });
  EXPECT_FALSE(written.ok());
  snapshot = absl::UnknownError("gone");  // the writer stopped; every chunk went back
  EXPECT_EQ(pool.stats().chunks_in_use, 0);
}

}  // namespace
}  // namespace ckpt::worker
