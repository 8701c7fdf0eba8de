#include "coordinator/manifest_share_builder.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/test_util.h"
#include "storage/manifest_share.h"

namespace ckpt::coordinator {
namespace {

using ::ckpt::testing::HeldGlobalIndices;
using ::ckpt::testing::RandomRegion;
using ::ckpt::testing::Uniform;

// A tiling of `shape`: boxes cut along one dim, each split further into flat ranges at random.
std::vector<Region> RandomTiling(std::mt19937_64& rng, const std::vector<int64_t>& shape) {
  std::vector<Region> boxes;
  const int dim = static_cast<int>(Uniform(rng, 0, static_cast<int64_t>(shape.size()) - 1));
  for (int64_t at = 0; at < shape[dim];) {
    const int64_t length = Uniform(rng, 1, shape[dim] - at);
    Region box = WholeRegion(shape);
    box.offsets[dim] = at;
    box.lengths[dim] = length;
    boxes.push_back(box);
    at += length;
  }
  std::vector<Region> tiles;
  for (const Region& box : boxes) {
    const int64_t n = box.BoxElements();
    for (int64_t at = 0; at < n;) {
      const int64_t length = Uniform(rng, 1, n - at);
      Region tile = box;
      if (length < n) tile.flat = FlatRange{at, at + length};
      tiles.push_back(tile);
      at += length;
    }
  }
  return tiles;
}

pb::StoredPiece PieceOf(const std::string& key, const Region& region, int index) {
  pb::StoredPiece p;
  p.set_key(key);
  *p.mutable_region() = RegionToProto(region);
  p.set_file("data/r" + std::to_string(index % 3) + "_0.safetensors");
  p.set_byte_offset(100 * index);
  p.set_byte_length(4 * region.NumElements());
  p.set_xxh3_64(1000 + index);
  p.set_writer_rank(index % 3);
  return p;
}

bool Meets(const Region& a, const Region& b, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> x = HeldGlobalIndices(a, shape);
  std::set<int64_t> y;
  for (int64_t i : HeldGlobalIndices(b, shape)) y.insert(i);
  return std::any_of(x.begin(), x.end(), [&](int64_t i) { return y.count(i) > 0; });
}

// A head naming tensors "t0".."t<n-1>" of `shapes` and the three data files.
pb::Manifest HeadOf(const std::vector<std::vector<int64_t>>& shapes) {
  pb::Manifest head;
  head.set_format_version(1);
  head.set_checksum_block_bytes(1 << 20);
  for (size_t t = 0; t < shapes.size(); ++t) {
    pb::TensorMeta* m = head.add_tensors();
    m->set_key("t" + std::to_string(t));
    m->set_dtype(pb::DTYPE_F32);
    for (int64_t d : shapes[t]) m->add_global_shape(d);
  }
  for (int f = 0; f < 3; ++f)
    head.add_files()->set_name("data/r" + std::to_string(f) + "_0.safetensors");
  return head;
}

TEST(ManifestShareBuilderTest, EachRankGetsExactlyThePiecesItsReadsOverlap) {
  for (int seed = 0; seed < 60; ++seed) {
    std::mt19937_64 rng(seed);
    const int num_tensors = static_cast<int>(Uniform(rng, 1, 3));
    std::vector<std::vector<int64_t>> shapes;
    std::vector<pb::StoredPiece> pieces;
    for (int t = 0; t < num_tensors; ++t) {
      std::vector<int64_t> shape;
      for (int d = 0, n = static_cast<int>(Uniform(rng, 1, 3)); d < n; ++d) {
        shape.push_back(Uniform(rng, 1, 6));
      }
      shapes.push_back(shape);
      for (const Region& r : RandomTiling(rng, shape)) {
        pieces.push_back(PieceOf("t" + std::to_string(t), r, static_cast<int>(pieces.size())));
      }
    }
    std::shuffle(pieces.begin(), pieces.end(), rng);
    const int ranks = static_cast<int>(Uniform(rng, 1, 5));
    ManifestShareBuilder builder(ranks);
    // reads[r]: (tensor, region); some regions repeated across ranks (replicas).
    std::vector<std::vector<std::pair<int, Region>>> reads(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (int i = 0, n = static_cast<int>(Uniform(rng, 0, 4)); i < n; ++i) {
        std::pair<int, Region> read;
        if (r > 0 && !reads[r - 1].empty() && Uniform(rng, 0, 2) == 0) {
          read = reads[r - 1][0];  // a replica reading what the previous rank reads
        } else {
          read.first = static_cast<int>(Uniform(rng, 0, num_tensors - 1));
          read.second = RandomRegion(rng, shapes[read.first], 0.5);
        }
        const auto& [tensor, region] = read;
        reads[r].push_back({tensor, region});
        builder.AddRead(r, "t" + std::to_string(tensor), shapes[tensor], region);
      }
    }
    for (const pb::StoredPiece& p : pieces) ASSERT_TRUE(builder.AddPiece(p).ok());
    ASSERT_TRUE(builder.Finish(HeadOf(shapes), "/ckpt").ok()) << "seed " << seed;
    for (int r = 0; r < ranks; ++r) {
      std::set<std::string> expected;
      for (const pb::StoredPiece& p : pieces) {
        const int t = std::stoi(p.key().substr(1));
        for (const auto& [tensor, region] : reads[r]) {
          if (tensor == t && Meets(region, *RegionFromProto(p.region()), shapes[t])) {
            expected.insert(p.SerializeAsString());
          }
        }
      }
      pb::ManifestShare share;
      ASSERT_TRUE(share.ParseFromString(builder.ShareOf(r)));
      absl::StatusOr<pb::Manifest> expanded = ExpandManifestShare(share);
      ASSERT_TRUE(expanded.ok()) << expanded.status();
      std::set<std::string> got;
      for (pb::StoredPiece p : expanded->pieces()) {
        EXPECT_FALSE(p.entry_name().empty());
        p.clear_entry_name();
        EXPECT_TRUE(got.insert(p.SerializeAsString()).second)
            << "a piece sent twice, seed " << seed;
      }
      EXPECT_EQ(got, expected) << "seed " << seed << " rank " << r;
      for (const auto& [tensor, region] : reads[r]) {
        const std::string key = "t" + std::to_string(tensor);
        EXPECT_TRUE(std::any_of(expanded->tensors().begin(), expanded->tensors().end(),
                                [&](const pb::TensorMeta& m) { return m.key() == key; }))
            << "seed " << seed << ": tensor " << key << " of a read is not in the share";
      }
    }
  }
}

TEST(ManifestShareBuilderTest, AReadNotTiledByThePiecesIsDataLossNamingTensorAndRank) {
  const std::vector<int64_t> shape = {4, 4};
  ManifestShareBuilder builder(2);
  builder.AddRead(1, "t0", shape, WholeRegion(shape));
  Region top = WholeRegion(shape);
  top.lengths[0] = 2;  // the bottom half is stored by no piece
  ASSERT_TRUE(builder.AddPiece(PieceOf("t0", top, 0)).ok());
  absl::Status s = builder.Finish(HeadOf({shape}), "/ckpt/step5");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("/ckpt/step5"), std::string::npos) << s;
  EXPECT_NE(s.message().find("t0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s;
}

TEST(ManifestShareBuilderTest, ReplicasReadingOneRegionShareItsMatching) {
  const std::vector<int64_t> shape = {8};
  ManifestShareBuilder builder(3);
  for (int r = 0; r < 3; ++r) builder.AddRead(r, "t0", shape, WholeRegion(shape));
  Region a = WholeRegion(shape), b = WholeRegion(shape);
  a.lengths[0] = 5;
  b.offsets[0] = 5;
  b.lengths[0] = 3;
  ASSERT_TRUE(builder.AddPiece(PieceOf("t0", a, 0)).ok());
  ASSERT_TRUE(builder.AddPiece(PieceOf("t1", a, 1)).ok());  // nobody reads t1
  ASSERT_TRUE(builder.AddPiece(PieceOf("t0", b, 2)).ok());
  ASSERT_TRUE(builder.Finish(HeadOf({shape, shape}), "/ckpt").ok());
  EXPECT_EQ(builder.pieces_kept(), 2);
  for (int r = 0; r < 3; ++r) {
    pb::ManifestShare share;
    ASSERT_TRUE(share.ParseFromString(builder.ShareOf(r)));
    EXPECT_EQ(share.pieces_size(), 2);
    ASSERT_EQ(share.tensors_size(), 1);
    EXPECT_EQ(share.tensors(0).key(), "t0");
    EXPECT_EQ(share.tensors(0).global_shape_size(), 1);
    EXPECT_EQ(share.files_size(), 2);
  }
}

TEST(ManifestShareBuilderTest, AnExchangeShareHoldsTheReadPiecesInFullThenTheUnreadOnesByRegion) {
  const std::vector<int64_t> shape = {8};
  ManifestShareBuilder builder(2);
  builder.AddRead(0, "t0", shape, WholeRegion(shape));
  builder.AddRead(1, "t1", shape, WholeRegion(shape));
  Region a = WholeRegion(shape), b = WholeRegion(shape);
  a.lengths[0] = 5;
  b.offsets[0] = 5;
  b.lengths[0] = 3;
  const pb::StoredPiece kept0 = PieceOf("t0", a, 0), kept1 = PieceOf("t0", b, 1);
  ASSERT_TRUE(builder.AddPiece(kept0).ok());                // kept id 0, file r0
  ASSERT_TRUE(builder.AddPiece(kept1).ok());                // kept id 1, file r1
  ASSERT_TRUE(builder.AddPiece(PieceOf("t1", a, 2)).ok());  // kept id 2
  ASSERT_TRUE(builder.AddPiece(PieceOf("t1", b, 3)).ok());  // kept id 3
  ASSERT_TRUE(builder.Finish(HeadOf({shape, shape}), "/ckpt").ok());
  // A part reading piece 1, receiving pieces 0 and 2, whose requests are of t0.
  pb::ManifestShare share;
  ASSERT_TRUE(share.ParseFromString(builder.ShareOfPieces({1}, {0, 2}, {"t0"})));
  absl::StatusOr<pb::Manifest> read = ExpandManifestShare(share);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->pieces_size(), 1);
  pb::StoredPiece got = read->pieces(0);
  got.clear_entry_name();
  EXPECT_EQ(got.SerializeAsString(), kept1.SerializeAsString());
  ASSERT_EQ(read->files_size(), 1);  // only the file of the piece it reads
  EXPECT_EQ(read->files(0).name(), kept1.file());
  absl::StatusOr<std::vector<pb::StoredPiece>> unread = ExpandUnreadPieces(share);
  ASSERT_TRUE(unread.ok()) << unread.status();
  ASSERT_EQ(unread->size(), 2u);  // in the order given
  EXPECT_EQ((*unread)[0].key(), "t0");
  EXPECT_EQ(*RegionFromProto((*unread)[0].region()), a);
  EXPECT_EQ((*unread)[1].key(), "t1");
  EXPECT_EQ(*RegionFromProto((*unread)[1].region()), a);
  EXPECT_TRUE((*unread)[1].file().empty());
  ASSERT_EQ(share.tensors_size(), 2);  // t0 of the request and pieces, t1 of an unread piece
}

}  // namespace
}  // namespace ckpt::coordinator
