#include "sharding/compact_layout.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The twin: the global indices a coordinate holds along each tensor dim, found by chunking
// index lists as torch.chunk chunks a tensor (ceil-sized chunks, trailing ones short or
// empty), one Shard mesh dim after another; no offsets arithmetic.
std::vector<std::vector<int64_t>> TwinIndices(const std::vector<int64_t>& shape,
                                              const std::vector<int64_t>& mesh,
                                              const std::vector<int64_t>& coordinate,
                                              const std::vector<Placement>& placements) {
  std::vector<std::vector<int64_t>> held(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    for (int64_t i = 0; i < shape[d]; ++i) held[d].push_back(i);
  }
  for (size_t m = 0; m < mesh.size(); ++m) {
    if (!placements[m].is_shard()) continue;
    const int n = static_cast<int>(shape.size());
    std::vector<int64_t>& list = held[(placements[m].dim + n) % n];
    std::vector<std::vector<int64_t>> chunks;
    const size_t size = (list.size() + mesh[m] - 1) / mesh[m];
    for (size_t start = 0; size > 0 && start < list.size(); start += size) {
      chunks.emplace_back(list.begin() + start, list.begin() + std::min(list.size(), start + size));
    }
    list = coordinate[m] < static_cast<int64_t>(chunks.size()) ? chunks[coordinate[m]]
                                                               : std::vector<int64_t>{};
  }
  return held;
}

// Every coordinate of `mesh`, row-major.
std::vector<std::vector<int64_t>> Coordinates(const std::vector<int64_t>& mesh) {
  std::vector<std::vector<int64_t>> out(1);
  for (int64_t n : mesh) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& c : out) {
      for (int64_t i = 0; i < n; ++i) {
        next.push_back(c);
        next.back().push_back(i);
      }
    }
    out = std::move(next);
  }
  return out;
}

// Row-major element numbers of a box.
std::vector<int64_t> BoxElements(const std::vector<int64_t>& shape, const Region& region) {
  std::vector<int64_t> out;
  const int64_t total = region.BoxElements();
  for (int64_t e = 0; e < total; ++e) {
    int64_t rest = e, global = 0;
    std::vector<int64_t> index(shape.size());
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      index[d] = region.offsets[d] + rest % region.lengths[d];
      rest /= region.lengths[d];
    }
    for (size_t d = 0; d < shape.size(); ++d) global = global * shape[d] + index[d];
    out.push_back(global);
  }
  return out;
}

TEST(ExpandDTensorPieceTest, MatchesTheIndexChunkingTwinAndMainReplicasCoverEachElementOnce) {
  std::mt19937 rng(16);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  const std::vector<int64_t> sizes = {0, 1, 2, 3, 5, 7, 8, 12, 13};
  int empty_pieces = 0, nested = 0, flat_cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int64_t> shape(pick(4)), mesh(1 + pick(3));
    for (int64_t& d : shape) d = sizes[pick(static_cast<int>(sizes.size()))];
    for (int64_t& d : mesh) d = 1 + pick(4);
    std::vector<Placement> placements;
    for (size_t m = 0; m < mesh.size(); ++m) {
      const int n = static_cast<int>(shape.size());
      placements.push_back(n == 0 || pick(3) == 0
                               ? Placement::Replicate()
                               : Placement::Shard(pick(n) - (pick(4) == 0 ? n : 0)));
    }
    // Sometimes flat over a Replicate() mesh dim (ZeRO-1 optimizer state).
    std::vector<int64_t> replicate_dims;
    for (size_t m = 0; m < mesh.size(); ++m) {
      if (!placements[m].is_shard()) replicate_dims.push_back(static_cast<int64_t>(m));
    }
    std::optional<int64_t> flat_over;
    if (!replicate_dims.empty() && pick(3) == 0) {
      flat_over = replicate_dims[pick(static_cast<int>(replicate_dims.size()))];
      ++flat_cases;
    }
    const int64_t numel = *CheckedNumElements(shape);
    std::vector<int> main_holders(numel, 0);
    for (const std::vector<int64_t>& c : Coordinates(mesh)) {
      absl::StatusOr<ExpandedPiece> piece =
          ExpandDTensorPiece({"w", 3}, shape, mesh, c, placements, {5}, flat_over);
      ASSERT_TRUE(piece.ok()) << piece.status();
      std::vector<std::vector<int64_t>> twin = TwinIndices(shape, mesh, c, placements);
      std::vector<int64_t> replica;
      for (size_t m = 0; m < mesh.size(); ++m) {
        if (!placements[m].is_shard() && static_cast<int64_t>(m) != flat_over) {
          replica.push_back(c[m]);
        }
      }
      replica.push_back(5);
      EXPECT_EQ(piece->replica_id, replica);
      for (size_t d = 0; d < shape.size(); ++d) {
        ASSERT_EQ(piece->region.lengths[d], static_cast<int64_t>(twin[d].size()));
        // PyTorch's offset of an empty shard is the dim's global size.
        EXPECT_EQ(piece->region.offsets[d], twin[d].empty() ? shape[d] : twin[d].front());
        empty_pieces += twin[d].empty() && shape[d] > 0;
      }
      std::vector<int64_t> held = BoxElements(shape, piece->region);
      if (flat_over) {
        // The twin: chunk the box's element list as torch.chunk does.
        const size_t k = mesh[*flat_over], at = c[*flat_over];
        const size_t size = (held.size() + k - 1) / k;
        std::vector<int64_t> chunk;
        for (size_t i = at * size; i < std::min(held.size(), (at + 1) * size); ++i) {
          chunk.push_back(held[i]);
        }
        ASSERT_TRUE(piece->region.flat.has_value());
        held.assign(held.begin() + piece->region.flat->start,
                    held.begin() + piece->region.flat->stop);
        EXPECT_EQ(held, chunk);
      } else {
        EXPECT_FALSE(piece->region.flat.has_value());
      }
      if (std::all_of(replica.begin(), replica.end() - 1, [](int64_t r) { return r == 0; })) {
        for (int64_t e : held) ++main_holders[e];
      }
    }
    for (int64_t e = 0; e < numel; ++e) ASSERT_EQ(main_holders[e], 1) << "element " << e;
    for (size_t a = 0; a < placements.size(); ++a) {
      for (size_t b = a + 1; b < placements.size(); ++b) {
        nested += placements[a].is_shard() && placements[a] == placements[b];
      }
    }
  }
  EXPECT_GT(empty_pieces, 0);  // the generator reached the hard cases
  EXPECT_GT(nested, 0);
  EXPECT_GT(flat_cases, 0);
}

TEST(ExpandFlatPieceTest, PartsMatchElementByElementDivisionAndCoverTheTensorOnce) {
  for (int64_t numel : {0, 1, 5, 12, 13, 64}) {
    for (int64_t parts : {1, 2, 3, 5, 8, 16}) {
      const int64_t chunk = (numel + parts - 1) / parts;
      std::vector<int> holders(numel, 0);
      for (int64_t part = 0; part < parts; ++part) {
        absl::StatusOr<ExpandedPiece> piece = ExpandFlatPiece({"f", 1}, {numel}, parts, part, {2});
        ASSERT_TRUE(piece.ok()) << piece.status();
        EXPECT_EQ(piece->replica_id, std::vector<int64_t>{2});
        EXPECT_EQ(piece->region, (Region{{0}, {numel}, piece->region.flat}));
        ASSERT_TRUE(piece->region.flat.has_value());
        for (int64_t e = 0; e < numel; ++e) {
          const bool twin_holds = e / chunk == part;
          const bool holds = e >= piece->region.flat->start && e < piece->region.flat->stop;
          EXPECT_EQ(holds, twin_holds) << numel << " " << parts << " " << part << " " << e;
          holders[e] += holds;
        }
      }
      for (int h : holders) EXPECT_EQ(h, 1);
    }
  }
}

TEST(ExpandFlatPieceTest, TwoDTensorsSplitTheirRowMajorFlattening) {
  absl::StatusOr<ExpandedPiece> piece = ExpandFlatPiece({"f", 1}, {3, 5}, 4, 3, {});
  ASSERT_TRUE(piece.ok()) << piece.status();
  EXPECT_EQ(piece->region, (Region{{0, 0}, {3, 5}, FlatRange{12, 15}}));
}

TEST(CompactLayoutTest, HostileDescriptionsAreRefusedNamingTensorAndRank) {
  const std::vector<Placement> shard0 = {Placement::Shard(0)};
  auto refused = [](const absl::StatusOr<ExpandedPiece>& got, const char* why) {
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(got.status().message(), AllOf(HasSubstr("tensor w"), HasSubstr("rank 7"))) << why;
  };
  const CompactSubject who{"w", 7};
  refused(ExpandDTensorPiece(who, {-4}, {2}, {0}, shard0, {}), "negative size");
  refused(ExpandDTensorPiece(who, {4}, {2}, {2}, shard0, {}), "coordinate outside the mesh");
  refused(ExpandDTensorPiece(who, {4}, {2}, {-1}, shard0, {}), "negative coordinate");
  refused(ExpandDTensorPiece(who, {4}, {2}, {0, 0}, shard0, {}), "coordinate of wrong rank");
  refused(ExpandDTensorPiece(who, {4}, {2}, {0}, {Placement::Shard(1)}, {}), "shard dim");
  refused(ExpandDTensorPiece(who, {4}, {2}, {0}, {Placement::Shard(-2)}, {}), "negative dim");
  refused(ExpandDTensorPiece(who, {4}, {2, 2}, {0, 0}, shard0, {}), "placements count");
  refused(ExpandDTensorPiece(who, {4}, {0}, {0}, shard0, {}), "empty mesh dim");
  refused(ExpandDTensorPiece(who, {4}, {int64_t{1} << 40, int64_t{1} << 40}, {0, 0},
                             {Placement::Shard(0), Placement::Shard(0)}, {}),
          "mesh product overflow");
  refused(ExpandDTensorPiece(who, {int64_t{1} << 40, int64_t{1} << 40}, {1}, {0},
                             {Placement::Replicate()}, {}),
          "element count overflow");
  refused(
      ExpandDTensorPiece(who, std::vector<int64_t>(65, 1), {1}, {0}, {Placement::Replicate()}, {}),
      "too many dims");
  refused(ExpandDTensorPiece(who, {4}, {2}, {0}, shard0, {-1}), "negative replica id");
  refused(ExpandDTensorPiece(who, {4}, {2}, {0}, shard0, {}, 0), "flat over a Shard dim");
  refused(ExpandDTensorPiece(who, {4}, {2}, {0}, {Placement::Replicate()}, {}, 1),
          "flat over a dim past the mesh");
  refused(ExpandFlatPiece(who, {4}, 0, 0, {}), "no parts");
  refused(ExpandFlatPiece(who, {4}, 2, 2, {}), "part past the parts");
  refused(ExpandFlatPiece(who, {4}, int64_t{1} << 40, 0, {}), "absurd parts");
  refused(ExpandFlatPiece(who, {-1}, 2, 0, {}), "negative size");
}

}  // namespace
}  // namespace ckpt
