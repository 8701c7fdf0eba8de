#include "coordinator/two_row_checkpoint.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "storage/checkpoint_writer.h"
#include "storage/manifest_share.h"

namespace ckpt::coordinator {

std::string TmpPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid());
}

std::string WriteTwoRowCheckpoint(const std::string& name) {
  static const int32_t rows[2][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}};
  CheckpointContents contents;
  contents.tensors = {TensorMeta{"w", DType::kI32, {2, 4}}};
  for (int r = 0; r < 2; ++r) {
    DataFilePlan file;
    file.writer_rank = r;
    file.pieces.push_back(PieceData{"w", Region{{r, 0}, {1, 4}, std::nullopt}, rows[r], 16});
    contents.files.push_back(file);
  }
  const std::string path = TmpPath(name);
  WriteOptions options;
  options.overwrite = true;
  auto manifest = WriteCheckpoint(path, contents, options);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  return path;
}

pb::PieceMeta Rows(int64_t first, int64_t count, int64_t rows) {
  pb::PieceMeta s;
  s.mutable_tensor()->set_key("w");
  s.mutable_tensor()->set_dtype(pb::DTYPE_I32);
  s.mutable_tensor()->add_global_shape(rows);
  s.mutable_tensor()->add_global_shape(4);
  *s.mutable_region() = RegionToProto(Region{{first, 0}, {count, 4}, std::nullopt});
  return s;
}

Operation ThreeRankLoad(const std::string& path) {
  Operation op;
  op.id = "op-9";
  op.job = "j";
  op.kind = OperationKind::kLoad;
  op.path = path;
  op.world_size = 3;
  op.ranks.resize(3);
  op.ranks[0].shards = {Rows(0, 2)};
  op.ranks[1].shards = {Rows(0, 2)};
  op.ranks[2].shards = {Rows(1, 1)};
  return op;
}

pb::StoredPiece UnitPiece(const pb::LoadPlanPart& part, const pb::LoadUnitEntry& unit) {
  pb::ManifestShare share;
  EXPECT_TRUE(share.ParseFromString(part.manifest_share()));
  absl::StatusOr<pb::Manifest> read = ExpandManifestShare(share);
  absl::StatusOr<std::vector<pb::StoredPiece>> unread = ExpandUnreadPieces(share);
  EXPECT_TRUE(read.ok() && unread.ok());
  if (!read.ok() || !unread.ok()) return {};
  const int i = unit.share_piece();
  const int n = read->pieces_size();
  if (i >= 0 && i < n) return read->pieces(i);
  if (i >= n && i - n < static_cast<int>(unread->size())) return (*unread)[i - n];
  ADD_FAILURE() << "unit piece " << i << " is not in the part's share";
  return {};
}

}  // namespace ckpt::coordinator
