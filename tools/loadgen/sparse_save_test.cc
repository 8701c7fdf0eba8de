#include "tools/loadgen/sparse_save.h"

#include <stdlib.h>

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "storage/checkpoint_writer.h"
#include "storage/file_util.h"
#include "storage/verify.h"

namespace ckpt::loadgen {
namespace {

using ::testing::HasSubstr;

// Parts that give their pieces in full resolve nothing from the rank's own pieces.
const google::protobuf::RepeatedPtrField<pb::PieceMeta>& NoOwnPieces() {
  static const auto* none = new google::protobuf::RepeatedPtrField<pb::PieceMeta>();
  return *none;
}

struct Scratch {
  Scratch() {
    char dir[] = "/tmp/ckpt-sparse-save-XXXXXX";
    path = mkdtemp(dir);
  }
  ~Scratch() { (void)RemoveTree(path); }
  std::string path;
};

// A part with a small bf16 piece and an f32 piece of several checksum blocks (4 MiB each) with
// a short last block, in one file, plus a second file.
pb::SavePlanPart TestPart(const std::string& staging) {
  pb::SavePlanPart part;
  part.set_rank(3);
  part.set_staging_dir(staging);
  auto add = [](pb::PlanFile* f, const std::string& key, pb::DType dtype, int64_t rows,
                int64_t cols, int64_t size) {
    pb::PlanPiece* p = f->add_pieces();
    p->set_key(key);
    p->set_dtype(dtype);
    p->add_global_shape(rows);
    p->add_global_shape(cols);
    *p->mutable_region() = RegionToProto(Region{{0, 0}, {rows, cols}, std::nullopt});
    p->set_size_bytes(size);
  };
  pb::PlanFile* f0 = part.add_files();
  f0->set_path(DataFileName(3, 0));
  add(f0, "small", pb::DTYPE_BF16, 2, 5, 20);
  add(f0, "big", pb::DTYPE_F32, 2600, 1000, 2600 * 1000 * 4);  // 2.48 blocks
  pb::PlanFile* f1 = part.add_files();
  f1->set_path(DataFileName(3, 1));
  add(f1, "other", pb::DTYPE_F32, 3, 3, 36);
  return part;
}

std::vector<TensorMeta> Tensors() {
  return {{"small", DType::kBF16, {2, 5}},
          {"big", DType::kF32, {2600, 1000}},
          {"other", DType::kF32, {3, 3}}};
}

// The property: for zero-filled pieces, the sparse record equals what storage's writer records
// after writing every byte.
TEST(SparseSaveTest, RecordEqualsTheRealWritersRecordOfZeros) {
  Scratch sparse_dir, real_dir;
  ASSERT_TRUE(MakeDir(JoinPath(sparse_dir.path, "data")).ok());
  absl::StatusOr<std::string> record =
      WriteSparseSavePart(TestPart(sparse_dir.path), NoOwnPieces(), false);
  ASSERT_TRUE(record.ok()) << record.status();
  pb::Manifest sparse;
  ASSERT_TRUE(sparse.ParseFromString(*record));

  ASSERT_TRUE(MakeDir(JoinPath(real_dir.path, "data")).ok());
  const pb::SavePlanPart part = TestPart(real_dir.path);
  std::vector<std::unique_ptr<char[]>> buffers;
  std::vector<DataFilePlan> files;
  for (const pb::PlanFile& f : part.files()) {
    DataFilePlan plan;
    plan.writer_rank = part.rank();
    for (const pb::PlanPiece& p : f.pieces()) {
      buffers.emplace_back(new char[p.size_bytes()]());
      plan.pieces.push_back(
          PieceData{p.key(), *RegionFromProto(p.region()), buffers.back().get(), p.size_bytes()});
    }
    files.push_back(std::move(plan));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    absl::StatusOr<WrittenData> real =
        WriteDataFiles(real_dir.path, Tensors(), {files[i]}, static_cast<int>(i), WriteOptions());
    ASSERT_TRUE(real.ok()) << real.status();
    ASSERT_EQ(real->files.size(), 1u);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(real->files[0], sparse.files(i)))
        << real->files[0].DebugString() << " vs " << sparse.files(i).DebugString();
    for (size_t j = 0; j < real->pieces.size(); ++j) {
      const pb::StoredPiece& mine = sparse.pieces(i == 0 ? j : 2 + j);
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(real->pieces[j], mine))
          << real->pieces[j].DebugString() << " vs " << mine.DebugString();
    }
  }
  EXPECT_GT(sparse.pieces(1).block_xxh3_size(), 1);
}

TEST(SparseSaveTest, CommittedSparseCheckpointVerifies) {
  Scratch root;
  const std::string path = JoinPath(root.path, "ck");
  absl::StatusOr<std::string> staging = CreateStagingDir(path, false);
  ASSERT_TRUE(staging.ok()) << staging.status();
  absl::StatusOr<std::string> record = WriteSparseSavePart(TestPart(*staging), NoOwnPieces(), true);
  ASSERT_TRUE(record.ok()) << record.status();
  pb::Manifest written;
  ASSERT_TRUE(written.ParseFromString(*record));
  WrittenData data{{written.pieces().begin(), written.pieces().end()},
                   {written.files().begin(), written.files().end()}};
  const pb::Manifest manifest =
      BuildManifest(Tensors(), data, CheckpointContents(), kDefaultChecksumBlockBytes);
  ASSERT_TRUE(CommitCheckpoint(*staging, path, manifest, WriteOptions()).ok());
  absl::StatusOr<VerifyReport> report = VerifyCheckpoint(path, IoOptions());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->problems.empty()) << report->problems[0];
  EXPECT_EQ(report->pieces, 3);
}

TEST(SparseSaveTest, RefusesAFileNameTheWorkerWouldNotWrite) {
  Scratch dir;
  ASSERT_TRUE(MakeDir(JoinPath(dir.path, "data")).ok());
  pb::SavePlanPart part = TestPart(dir.path);
  part.mutable_files(1)->set_path("data/r9_9.safetensors");
  absl::StatusOr<std::string> record = WriteSparseSavePart(part, NoOwnPieces(), false);
  ASSERT_FALSE(record.ok());
  EXPECT_NE(record.status().message().find("r9_9"), std::string::npos) << record.status();
}

// The coordinator's save parts name pieces by local index alone (pb::PlanPiece): resolved from
// the rank's own pieces, the record is the one of the same pieces given in full.
TEST(SparseSaveTest, PiecesNamedByLocalIndexResolveToTheRanksOwnPieces) {
  Scratch given_dir, named_dir;
  ASSERT_TRUE(MakeDir(JoinPath(given_dir.path, "data")).ok());
  ASSERT_TRUE(MakeDir(JoinPath(named_dir.path, "data")).ok());
  const pb::SavePlanPart given = TestPart(given_dir.path);
  pb::SavePlanPart named = TestPart(named_dir.path);
  google::protobuf::RepeatedPtrField<pb::PieceMeta> own;
  for (pb::PlanFile& f : *named.mutable_files()) {
    for (pb::PlanPiece& p : *f.mutable_pieces()) {
      pb::PieceMeta& mine = *own.Add();
      mine.mutable_tensor()->set_key(p.key());
      mine.mutable_tensor()->set_dtype(p.dtype());
      *mine.mutable_tensor()->mutable_global_shape() = p.global_shape();
      *mine.mutable_region() = p.region();
      const int64_t size = p.size_bytes();
      p.Clear();
      p.set_local_index(own.size() - 1);
      p.set_size_bytes(size);
    }
  }
  absl::StatusOr<std::string> by_index = WriteSparseSavePart(named, own, false);
  absl::StatusOr<std::string> in_full = WriteSparseSavePart(given, NoOwnPieces(), false);
  ASSERT_TRUE(by_index.ok()) << by_index.status();
  ASSERT_TRUE(in_full.ok()) << in_full.status();
  EXPECT_EQ(*by_index, *in_full);

  named.mutable_files(0)->mutable_pieces(0)->set_local_index(7);
  EXPECT_THAT(WriteSparseSavePart(named, own, false).status().message(),
              HasSubstr("local index 7"));
  named.mutable_files(0)->mutable_pieces(0)->set_local_index(0);
  named.mutable_files(0)->mutable_pieces(0)->set_size_bytes(21);
  EXPECT_THAT(WriteSparseSavePart(named, own, false).status().message(),
              HasSubstr("21 bytes planned, not its own 20"));
}

}  // namespace
}  // namespace ckpt::loadgen
