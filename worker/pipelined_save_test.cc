// The pipelined save (SnapshotSavePart with a host pool): the files match WriteDataFiles' byte
// for byte, the pool bounds the memory (back-pressure), chunks are written in pipeline order,
// a second save faults in no new memory, lent pieces are not copied, O_DIRECT is reported.
// A compressed save goes through the same pipeline (each run encoded while the next is copied):
// its frames and checksums are WriteDataFiles' (WriteOptions.compression), and every dtype,
// NaN payloads, subnormals and odd sizes included, reads back bit-exact through the reader.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/page_faults.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/manifest.pb.h"
#include "sharding/dtype.h"
#include "storage/checkpoint_reader.h"
#include "storage/checkpoint_writer.h"
#include "storage/direct_io_refusal.h"
#include "storage/file_util.h"
#include "storage/io_engine.h"
#include "storage/piece_codec.h"
#include "storage/verify.h"
#include "worker/host_buffer_pool.h"
#include "worker/save_executor.h"

namespace ckpt::worker {
namespace {

constexpr int64_t kChunk = 64 << 10;  // the pool's chunk in most tests

// Weight-like values of `dtype` (floats near zero, small integers) with every seventh element
// special: NaN payloads, infinities, subnormals, negative zero, or random bits.
void FillValues(char* data, int64_t bytes, DType dtype, std::mt19937& rng) {
  const int w = static_cast<int>(DTypeSize(dtype));
  std::normal_distribution<float> weight(0.f, 0.02f);
  // f32 NaN payloads, -0, a subnormal; f64 NaN payload and subnormal; f16/bf16 NaN payloads,
  // subnormal, -0.
  const uint64_t specials[] = {
      0x7FC00123ull,         0xFF800001ull, 0x80000000ull, 0x00000001ull, 0x7FF0000000000001ull,
      0x000FFFFFFFFFFFFFull, 0x7E01ull,     0x7F81ull,     0x0001ull,     0x8000ull};
  for (int64_t i = 0; i + w <= bytes; i += w) {
    uint64_t v = 0;
    const int64_t e = i / w;
    if (e % 7 == 3) {
      v = e % 14 == 3 ? specials[(e / 14) % 10] : (uint64_t{rng()} << 32 | rng());
    } else if (dtype == DType::kF32 || dtype == DType::kC64 || dtype == DType::kBF16) {
      const float f = weight(rng);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      v = dtype == DType::kBF16 ? b >> 16 : b;
    } else if (dtype == DType::kF64) {
      const double d = weight(rng);
      std::memcpy(&v, &d, 8);
    } else if (dtype == DType::kF16) {
      v = (rng() & 0x83FF) | 0x2000 | ((rng() & 3) << 10);  // small magnitudes
    } else {
      v = rng() % 5;
    }
    std::memcpy(data + i, &v, static_cast<size_t>(w));
  }
}

// A trainer's host state: tensors "t<i>" of the given sizes (in bytes) in one shared segment,
// registered in a session of job `job`: u8 with random bytes, or of `dtypes` with FillValues.
class Trainer {
 public:
  Trainer(MemoryRegistry& registry, const std::string& job, const std::vector<int64_t>& sizes,
          bool lend = false, std::vector<DType> dtypes = {})
      : sizes_(sizes), dtypes_(std::move(dtypes)) {
    dtypes_.resize(sizes.size(), DType::kU8);
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
    for (int64_t i = 0, at = 0; i < static_cast<int64_t>(sizes.size()); at += sizes[i++]) {
      if (dtypes_[i] != DType::kU8) FillValues(data_ + at, sizes[i], dtypes_[i], rng);
    }
    auto session = registry.OpenSession(TrainerIdentity{job, 0, 1, 0, getpid()});
    EXPECT_TRUE(session.ok());
    std::vector<pb::SharedTensor> tensors;
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      pb::SharedTensor t;
      t.mutable_shard()->mutable_tensor()->set_key(absl::StrCat("t", i));
      t.mutable_shard()->mutable_tensor()->set_dtype(DTypeToProto(dtypes_[i]));
      t.mutable_shard()->mutable_tensor()->add_global_shape(elements(i));
      t.mutable_shard()->mutable_region()->add_offsets(0);
      t.mutable_shard()->mutable_region()->add_lengths(elements(i));
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
  int64_t elements(size_t i) const { return sizes_[i] / DTypeSize(dtypes_[i]); }
  std::vector<TensorMeta> Metas() const {
    std::vector<TensorMeta> metas;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      metas.push_back(TensorMeta{absl::StrCat("t", i), dtypes_[i], {elements(i)}});
    }
    return metas;
  }

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
                                              WrittenData* records,
                                              const WriteOptions& options = {}) const {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto dir = CreateStagingDir(absl::StrCat(tmp ? tmp : "/tmp", "/expected-", getpid()), true);
    EXPECT_TRUE(dir.ok());
    const std::vector<TensorMeta> metas = Metas();
    std::vector<DataFilePlan> plans;
    for (const std::vector<int>& file : files) {
      DataFilePlan plan;
      for (int i : file) {
        PieceData piece;
        piece.key = metas[i].key;
        piece.region = Region{{0}, {elements(i)}, std::nullopt};
        piece.data = tensor(i);
        piece.size_bytes = sizes_[i];
        plan.pieces.push_back(piece);
      }
      plans.push_back(plan);
    }
    auto written = WriteDataFiles(*dir, metas, plans, 0, options);
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
  std::vector<DType> dtypes_;
  int64_t total_ = 0;
  std::string segment_;
  char* data_ = nullptr;
  SessionInfo session_;
};

// The order in which a save's pipeline reported its events: Trace() goes into
// DeviceSnapshotOptions::trace; after the save, At(kind, chunk) is that event's position.
class PipelineOrder {
 public:
  std::function<void(const SavePipelineEvent&)> Trace() {
    return [this](const SavePipelineEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      when_[{e.kind, e.chunk}] = count_++;
    };
  }
  size_t size() const { return count_; }
  size_t At(SavePipelineEvent::Kind kind, int64_t chunk) const { return when_.at({kind, chunk}); }

 private:
  std::mutex mu_;
  size_t count_ = 0;
  std::map<std::pair<SavePipelineEvent::Kind, int64_t>, size_t> when_;
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
  PipelineOrder order;
  DeviceSnapshotOptions options;
  options.trace = order.Trace();
  Save(trainer, trainer.Part(Staging(), {{0, 1}}), pool, nullptr, options);
  ASSERT_EQ(order.size(), 20u);  // ten chunks, each copied and written once
  for (int64_t k = 0; k + 2 < 10; ++k) {
    SCOPED_TRACE(absl::StrCat("chunk ", k));
    EXPECT_LT(order.At(SavePipelineEvent::kWritten, k),
              order.At(SavePipelineEvent::kCopied, k + 2));
  }
  for (int64_t k = 0; k < 10; ++k) {  // and each is copied before it is written
    EXPECT_LT(order.At(SavePipelineEvent::kCopied, k), order.At(SavePipelineEvent::kWritten, k));
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
    const int64_t faults = SnapshotFaults(*trainer, pool, Staging());
    if (kPageFaultsMeasureTheCode) {
      EXPECT_LT(faults, 64) << "the snapshot faulted in new memory";
    }
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
  if (kPageFaultsMeasureTheCode) {
    EXPECT_LT(faults, kBound / 4096 + 4 * 64);
  }
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
  // No change to the lent bytes here: the pipeline may already be writing them (the snapshot
  // starts the writer), so a change would race it. That no copy was taken shows in the report
  // and the pool above.
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

// --- compressed saves -----------------------------------------------------------------------

constexpr int64_t kRun = 256 << 10;  // the pool's chunk in the compressed tests: 2 codec chunks

// The part with compression "zstd" (the codec's defaults: 128 KiB chunks).
pb::SavePlanPart Compressed(pb::SavePlanPart part) {
  part.set_compression("zstd");
  return part;
}

WriteOptions CompressedWrite() {
  WriteOptions options;
  options.compression.enabled = true;
  return options;
}

// Commits the staging dir `staging` holding `m`'s files as a checkpoint of `trainer`'s tensors
// and reads every tensor back through CheckpointReader: each must equal the trainer's bytes.
void ExpectReadsBackBitExact(const Trainer& trainer, const std::string& staging,
                             const pb::Manifest& m, const std::string& final_path) {
  WrittenData data;
  for (const pb::StoredPiece& p : m.pieces()) data.pieces.push_back(p);
  for (const pb::DataFile& f : m.files()) data.files.push_back(f);
  const std::vector<TensorMeta> metas = trainer.Metas();
  const pb::Manifest manifest =
      BuildManifest(metas, data, CheckpointContents(), kDefaultChecksumBlockBytes);
  ASSERT_TRUE(CommitCheckpoint(staging, final_path, manifest, WriteOptions()).ok());
  auto reader = CheckpointReader::Open(final_path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (size_t i = 0; i < metas.size(); ++i) {
    SCOPED_TRACE(absl::StrCat(metas[i].key, " ", DTypeName(metas[i].dtype)));
    std::string out(static_cast<size_t>(trainer.size(i)), '\0');
    const Region whole{{0}, {trainer.elements(i)}, std::nullopt};
    ASSERT_TRUE((*reader)->ReadRegion(metas[i].key, whole, out.data()).ok());
    EXPECT_EQ(std::memcmp(out.data(), trainer.tensor(i), out.size()), 0) << "not bit-exact";
  }
  auto verified = VerifyCheckpoint(final_path, IoOptions());
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->problems.empty()) << verified->problems.front();
}

// Each piece of `m` has the codec fields and stored and raw checksums of the same piece written
// by WriteDataFiles with compression, and its file holds the same frame.
void ExpectSameFrames(const pb::Manifest& m, const std::string& staging,
                      const std::map<std::string, std::string>& expected,
                      const WrittenData& records) {
  ASSERT_EQ(m.pieces_size(), static_cast<int>(records.pieces.size()));
  std::map<std::string, std::string> files;
  for (const pb::DataFile& f : m.files()) {
    files[f.name()] = *ReadWholeFile(JoinPath(staging, f.name()), int64_t{1} << 30);
    EXPECT_EQ(static_cast<int64_t>(files[f.name()].size()), f.size_bytes()) << f.name();
  }
  for (int i = 0; i < m.pieces_size(); ++i) {
    const pb::StoredPiece& got = m.pieces(i);
    const pb::StoredPiece& want = records.pieces[i];
    SCOPED_TRACE(got.key());
    EXPECT_EQ(got.codec(), want.codec());
    EXPECT_EQ(got.byte_length(), want.byte_length());
    EXPECT_EQ(got.stored_length(), want.stored_length());
    EXPECT_EQ(got.raw_xxh3_64(), want.raw_xxh3_64());
    EXPECT_EQ(got.codec_chunk_bytes(), want.codec_chunk_bytes());
    EXPECT_EQ(got.xxh3_64(), want.xxh3_64());
    EXPECT_THAT(got.block_xxh3(), ::testing::ElementsAreArray(want.block_xxh3()));
    const int64_t n = StoredBytes(got);
    EXPECT_TRUE(files.at(got.file()).substr(got.byte_offset(), n) ==
                expected.at(want.file()).substr(want.byte_offset(), n))
        << "the stored frame differs";
  }
}

TEST_F(PipelinedSaveTest, ACompressedSaveOfEveryDTypeIsPipelinedThroughThePoolAndBitExact) {
  // Every dtype at odd sizes (one element, a few, chunk-crossing) and a 6 MiB f32 piece whose
  // frame spans checksum blocks, across three files; an empty piece too.
  std::vector<int64_t> sizes;
  std::vector<DType> dtypes;
  for (DType d : kAllDTypes) {
    for (int64_t elements : {int64_t{1}, int64_t{7}, int64_t{40001}}) {
      sizes.push_back(elements * DTypeSize(d));
      dtypes.push_back(d);
    }
  }
  sizes.push_back(int64_t{6} << 20);
  dtypes.push_back(DType::kF32);
  sizes.push_back(0);
  dtypes.push_back(DType::kBF16);
  const Trainer trainer(registry_, "job", sizes, false, dtypes);
  std::vector<std::vector<int>> files(3);
  for (int i = 0; i < static_cast<int>(sizes.size()); ++i) files[i % 3].push_back(i);
  WrittenData records;
  const auto expected = trainer.Expected(files, &records, CompressedWrite());
  HostBufferPool pool(3 * kRun, kRun);  // far smaller than the save: back-pressure
  const std::string staging = Staging();
  SnapshotReport report;
  const pb::Manifest m = Save(trainer, Compressed(trainer.Part(staging, files)), pool, &report);
  EXPECT_TRUE(report.compression_pipelined);
  EXPECT_EQ(report.compressed_files, 3);
  EXPECT_GT(report.pool_chunks, 3);
  EXPECT_TRUE(report.host_waited_for_pool);
  EXPECT_LE(pool.stats().chunks_mapped, 3);
  EXPECT_LT(report.compressed_stored_bytes, report.compressed_raw_bytes);
  ExpectSameFrames(m, staging, expected, records);
  ExpectReadsBackBitExact(trainer, staging, m, absl::StrCat(final_path_, "-every-dtype"));
}

TEST_F(PipelinedSaveTest, ACompressedRunIsEncodedBeforeTheRunAPoolLaterIsCopiedAndWrittenInOrder) {
  const Trainer trainer(registry_, "job", {4 * kRun, 6 * kRun}, false, {DType::kBF16, DType::kF32});
  HostBufferPool pool(2 * kRun, kRun);
  PipelineOrder order;
  DeviceSnapshotOptions options;
  options.trace = order.Trace();
  const std::string staging = Staging();
  const pb::Manifest m =
      Save(trainer, Compressed(trainer.Part(staging, {{0, 1}})), pool, nullptr, options);
  ASSERT_EQ(order.size(), 30u);  // ten runs, each copied, encoded and written once
  using E = SavePipelineEvent;
  for (int64_t k = 0; k < 10; ++k) {
    SCOPED_TRACE(absl::StrCat("run ", k));
    // The pool's two chunks bound the pipeline: run k+2 waits for run k's chunk, which the
    // writer returns once it encoded the run.
    if (k + 2 < 10) {
      EXPECT_LT(order.At(E::kEncoded, k), order.At(E::kCopied, k + 2));
    }
    EXPECT_LT(order.At(E::kCopied, k), order.At(E::kEncoded, k));
    EXPECT_LT(order.At(E::kEncoded, k), order.At(E::kWritten, k));
    if (k + 1 < 10) {
      EXPECT_LT(order.At(E::kWritten, k), order.At(E::kEncoded, k + 1));
    }
  }
  // And the snapshot ran ahead of the writes: some run was copied before an earlier one was
  // written.
  bool overlapped = false;
  for (int64_t k = 0; k + 1 < 10; ++k) {
    overlapped = overlapped || order.At(E::kCopied, k + 1) < order.At(E::kWritten, k);
  }
  EXPECT_TRUE(overlapped);
  ExpectReadsBackBitExact(trainer, staging, m, absl::StrCat(final_path_, "-order"));
}

TEST_F(PipelinedSaveTest, CompressedSavesOfEveryJobReuseThePrefaultedPoolAndFaultInNothing) {
  const Trainer first(registry_, "job-a", {kBig}, false, {DType::kBF16});
  const Trainer second(registry_, "job-b", {kBig / 2, kBig / 2}, false,
                       {DType::kF32, DType::kBF16});
  MapSources({&first, &second});
  HostBufferPool pool(int64_t{8} << 20, int64_t{1} << 20);
  ASSERT_TRUE(pool.Prefault().ok());
  for (const Trainer* trainer : {&first, &second, &first}) {
    MemoryGate gate;
    DeviceSnapshotOptions options;
    options.host_pool = &pool;
    const pb::SavePlanPart part = Compressed(trainer->Part(Staging(), {{0}, {}}));
    const int64_t acquires_before = pool.stats().acquires;
    const int64_t faults_before = ThreadMinorFaults();
    auto snapshot = SnapshotSavePart(part, trainer->session(), gate, options);
    const int64_t faults = ThreadMinorFaults() - faults_before;
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    ASSERT_TRUE(WriteSnapshot(*snapshot, nullptr).ok());
    EXPECT_TRUE(snapshot->report.compression_pipelined);
    if (kPageFaultsMeasureTheCode) {
      EXPECT_LT(faults, 64) << "the compressed snapshot faulted in new memory";
    }
    EXPECT_GE(pool.stats().acquires - acquires_before, trainer->size(0) / (int64_t{1} << 20));
    EXPECT_EQ(pool.stats().bytes_mapped, int64_t{8} << 20) << "the save mapped new memory";
  }
}

TEST_F(PipelinedSaveTest, LentPiecesOfACompressedSaveAreEncodedFromTheTrainersMemory) {
  const Trainer lent(registry_, "job", {5 * kRun + 6, 3000, 0}, /*lend=*/true,
                     {DType::kF16, DType::kI32, DType::kF64});
  HostBufferPool pool(2 * kRun, kRun);
  const std::string staging = Staging();
  SnapshotReport report;
  const pb::Manifest m = Save(lent, Compressed(lent.Part(staging, {{0, 1, 2}})), pool, &report);
  EXPECT_TRUE(report.compression_pipelined);
  EXPECT_EQ(report.copied_bytes, 0);
  EXPECT_EQ(report.pool_chunks, 0);
  EXPECT_EQ(pool.stats().chunks_mapped, 0);
  WrittenData records;
  const auto expected = lent.Expected({{0, 1, 2}}, &records, CompressedWrite());
  ExpectSameFrames(m, staging, expected, records);
  ExpectReadsBackBitExact(lent, staging, m, absl::StrCat(final_path_, "-lent"));
}

TEST_F(PipelinedSaveTest, AnAbortStopsACompressedSaveAndReturnsEveryChunk) {
  const Trainer trainer(registry_, "job", {10 * kRun}, false, {DType::kBF16});
  HostBufferPool pool(16 * kRun, kRun);
  MemoryGate gate;
  DeviceSnapshotOptions options;
  options.host_pool = &pool;
  auto snapshot = SnapshotSavePart(Compressed(trainer.Part(Staging(), {{0}})), trainer.session(),
                                   gate, options);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  gate.Close(absl::AbortedError("rank 3 failed"));
  auto written = WriteSnapshot(*snapshot, nullptr, [&gate] { return gate.closed(); });
  EXPECT_FALSE(written.ok());
  snapshot = absl::UnknownError("gone");
  EXPECT_EQ(pool.stats().chunks_in_use, 0);
}

}  // namespace
}  // namespace ckpt::worker
