#include "planner/save_plan_classes.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/rank_pieces.h"
#include "planner/save_plan.h"
#include "proto/convert.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// A save problem as the coordinator holds it: every rank's described pieces.
struct Problem {
  int64_t num_ranks = 0;
  std::vector<std::vector<pb::PieceMeta>> ranks;
  ProcessGroups groups;
  std::string what;  // the injected fault, for messages
};

// The brute-force twin's input: every piece flattened in (rank, local index) order, as the
// coordinator's GatheredPieces built it, and each piece's local index.
absl::StatusOr<std::vector<TensorPiece>> Flatten(const Problem& problem, std::vector<int>* local) {
  std::vector<TensorPiece> out;
  for (size_t r = 0; r < problem.ranks.size(); ++r) {
    for (size_t i = 0; i < problem.ranks[r].size(); ++i) {
      const pb::PieceMeta& s = problem.ranks[r][i];
      TensorPiece p;
      p.key = s.tensor().key();
      p.rank = static_cast<int64_t>(r);
      absl::StatusOr<DType> dtype = DTypeFromProto(s.tensor().dtype());
      if (!dtype.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " tensor ", p.key, ": ", dtype.status().message()));
      }
      p.dtype = *dtype;
      p.global_shape.assign(s.tensor().global_shape().begin(), s.tensor().global_shape().end());
      absl::StatusOr<Region> region = RegionFromProto(s.region());
      if (!region.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " tensor ", p.key, ": ", region.status().message()));
      }
      p.region = *region;
      p.replica_id.assign(s.replica_id().begin(), s.replica_id().end());
      out.push_back(std::move(p));
      local->push_back(static_cast<int>(i));
    }
  }
  return out;
}

pb::PieceMeta Meta(const std::string& key, pb::DType dtype, const std::vector<int64_t>& shape,
                   const Region& region, const std::vector<int64_t>& replica) {
  pb::PieceMeta m;
  *m.mutable_tensor() = TensorMetaToProto(TensorMeta{key, DType::kF32, shape});
  m.mutable_tensor()->set_dtype(dtype);
  *m.mutable_region() = RegionToProto(region);
  for (int64_t c : replica) m.add_replica_id(c);
  return m;
}

// [start, stop) of part `i` of `n` parts of `total` (uneven: the first parts one larger).
std::pair<int64_t, int64_t> Part(int64_t total, int64_t n, int64_t i) {
  const int64_t base = total / n, extra = total % n;
  const int64_t start = i * base + std::min(i, extra);
  return {start, start + base + (i < extra ? 1 : 0)};
}

// One tensor's pieces on rank (tp_i, dp_i) under one of four schemes: rows over TP replicated
// over DP, replicated everywhere, rows over TP with the box flat-sharded over DP (a distributed
// optimizer), or held whole by the TP-rank-0 ranks only.
std::vector<pb::PieceMeta> TensorPieces(int t, int scheme, pb::DType dtype,
                                        const std::vector<int64_t>& shape, int64_t tp, int64_t dp,
                                        int64_t tp_i, int64_t dp_i, bool long_ids) {
  const std::string key = absl::StrCat("t", t, ".w");
  Region whole{std::vector<int64_t>(shape.size(), 0), shape, std::nullopt};
  Region rows = whole;
  auto [r0, r1] = Part(shape[0], tp, tp_i);
  rows.offsets[0] = r0;
  rows.lengths[0] = r1 - r0;
  auto replica = [&](int64_t a, int64_t b) {
    return long_ids ? std::vector<int64_t>{0, a, b} : std::vector<int64_t>{a + b};
  };
  switch (scheme) {
    case 0:
      return {Meta(key, dtype, shape, rows, replica(0, dp_i))};
    case 1:
      return {Meta(key, dtype, shape, whole, replica(tp_i, dp_i))};
    case 2: {
      Region flat = rows;
      auto [f0, f1] = Part(rows.BoxElements(), dp, dp_i);
      flat.flat = FlatRange{f0, f1};
      return {Meta(key, dtype, shape, flat,
                   long_ids ? std::vector<int64_t>{0, 0, 0} : std::vector<int64_t>{})};
    }
    default:
      if (tp_i != 0) return {};
      return {Meta(key, dtype, shape, whole, replica(0, dp_i))};
  }
}

// Injects one fault into a valid problem (or none), naming it in `what`.
void Inject(std::mt19937_64& rng, Problem* p) {
  std::vector<std::pair<int, int>> all;
  for (size_t r = 0; r < p->ranks.size(); ++r) {
    for (size_t i = 0; i < p->ranks[r].size(); ++i) all.emplace_back(r, i);
  }
  if (all.empty()) return;
  auto [r, i] = all[rng() % all.size()];
  pb::PieceMeta& m = p->ranks[r][i];
  bool main = true;
  for (int64_t c : m.replica_id()) main = main && c == 0;
  switch (rng() % 11) {
    case 0:  // a second main replica (overlap) where it was a copy
      p->what = "overlap";
      m.clear_replica_id();
      break;
    case 1:  // a main replica lost (hole)
      p->what = "hole";
      if (main) m.add_replica_id(1);
      break;
    case 2:
      p->what = "dtype";
      m.mutable_tensor()->set_dtype(m.tensor().dtype() == pb::DTYPE_F32 ? pb::DTYPE_BF16
                                                                        : pb::DTYPE_F32);
      break;
    case 3:
      p->what = "shape";
      m.mutable_tensor()->set_global_shape(0, m.tensor().global_shape(0) + 1);
      break;
    case 4:
      p->what = "region";
      m.mutable_region()->set_lengths(0, m.tensor().global_shape(0) + 1);
      break;
    case 5:
      p->what = "bad flat";
      m.mutable_region()->mutable_flat()->set_start(3);
      m.mutable_region()->mutable_flat()->set_stop(1);
      break;
    case 6:
      p->what = "unknown dtype";
      m.mutable_tensor()->set_dtype(pb::DTYPE_UNSPECIFIED);
      break;
    case 7:  // one id, two regions (a copy that is one row shorter)
      p->what = "region conflict";
      if (!main && m.region().lengths(0) > 1) {
        m.mutable_region()->set_lengths(0, m.region().lengths(0) - 1);
      }
      break;
    case 8:  // a flat range one element longer: overlaps the next range of its box, or leaves it
      p->what = "flat range grown";
      if (m.region().has_flat()) {
        m.mutable_region()->mutable_flat()->set_stop(m.region().flat().stop() + 1);
      }
      break;
    case 9:  // a flat piece's box one row shorter: one id, two boxes
      p->what = "flat box shrunk";
      if (m.region().has_flat() && m.region().lengths(0) > 1) {
        m.mutable_region()->set_lengths(0, m.region().lengths(0) - 1);
      }
      break;
    default:
      p->what = "piece dropped";
      p->ranks[r].erase(p->ranks[r].begin() + i);
  }
}

Problem RandomProblem(std::mt19937_64& rng) {
  Problem p;
  const int64_t tp = 1 + rng() % 3, dp = 1 + rng() % 4;
  const int64_t world = tp * dp;
  const int tensors = 1 + rng() % 5;
  const bool long_ids = rng() % 2;
  p.ranks.resize(world);
  const pb::DType dtypes[] = {pb::DTYPE_F32, pb::DTYPE_BF16, pb::DTYPE_I64};
  for (int t = 0; t < tensors; ++t) {
    std::vector<int64_t> shape = {1 + static_cast<int64_t>(rng() % 7)};
    if (rng() % 2) shape.push_back(1 + rng() % 5);
    const int scheme = rng() % 4;
    const pb::DType dtype = dtypes[rng() % 3];
    for (int64_t r = 0; r < world; ++r) {
      for (pb::PieceMeta& m :
           TensorPieces(t, scheme, dtype, shape, tp, dp, r % tp, r / tp, long_ids)) {
        p.ranks[r].push_back(std::move(m));
      }
    }
  }
  if (rng() % 5 == 0) {  // ranks list their pieces in their own orders
    for (auto& list : p.ranks) std::shuffle(list.begin(), list.end(), rng);
  }
  p.num_ranks = world + (rng() % 6 == 0 ? 1 : 0);  // sometimes a rank with nothing
  p.ranks.resize(p.num_ranks);
  switch (rng() % 5) {
    case 0:  // data-parallel groups: ranks with equal r mod tp
      for (int64_t t = 0; t < tp; ++t) {
        p.groups.emplace_back();
        for (int64_t r = t; r < world; r += tp) p.groups.back().push_back(r);
      }
      break;
    case 1:  // model replicas: tp consecutive ranks
      for (int64_t d = 0; d < dp; ++d) {
        p.groups.emplace_back();
        for (int64_t r = d * tp; r < (d + 1) * tp; ++r) p.groups.back().push_back(r);
      }
      break;
    case 2:  // one rank per group
      for (int64_t r = 0; r < world; ++r) p.groups.push_back({r});
      break;
    default:
      break;
  }
  if (!p.groups.empty() && p.num_ranks > world) p.groups.push_back({world});
  if (rng() % 2) Inject(rng, &p);
  return p;
}

std::string PlanString(const SavePlan& plan) {
  std::string s = absl::StrCat("ranks ", plan.num_ranks, "\n");
  for (const WriterPlan& w : plan.writers) {
    absl::StrAppend(&s, "writer ", w.rank, " bytes ", w.total_bytes, "\n");
    for (const PlannedFile& f : w.files) {
      absl::StrAppend(&s, "  file ", f.path, " ", f.total_bytes, "\n");
      for (const PlannedPiece& p : f.pieces) {
        absl::StrAppend(&s, "    ", p.key, " ", DTypeName(p.dtype), " ",
                        ShapeString(p.global_shape), " ", p.region.DebugString(), " ", p.size_bytes,
                        " @", p.source_index, "\n");
      }
    }
  }
  return s;
}

// The twin's plan with each source index turned into the writer's local index.
void ToLocalIndex(const std::vector<int>& local, SavePlan* plan) {
  for (WriterPlan& w : plan->writers) {
    for (PlannedFile& f : w.files) {
      for (PlannedPiece& p : f.pieces) p.source_index = local[p.source_index];
    }
  }
}

// The plan as the coordinator sends it: files, and each piece's size and writer's index.
std::string LeanString(const SavePlan& plan) {
  std::string s;
  for (const WriterPlan& w : plan.writers) {
    absl::StrAppend(&s, "writer ", w.rank, " bytes ", w.total_bytes, "\n");
    for (const PlannedFile& f : w.files) {
      absl::StrAppend(&s, "  file ", f.path, " ", f.total_bytes, ":");
      for (const PlannedPiece& p : f.pieces)
        absl::StrAppend(&s, " ", p.size_bytes, "@", p.source_index);
      absl::StrAppend(&s, "\n");
    }
  }
  return s;
}

absl::StatusOr<SavePlan> PlanOverClasses(const Problem& problem, int64_t target,
                                         std::vector<RankPieces>* kept,
                                         bool describe_pieces = true) {
  PieceListInterner interner;
  kept->clear();
  for (const auto& list : problem.ranks) {
    kept->emplace_back(list);
    interner.Intern(&kept->back());
  }
  std::vector<const RankPieces*> ranks;
  for (const RankPieces& r : *kept) ranks.push_back(&r);
  SavePlanOptions options;
  options.target_file_bytes = target;
  options.groups = problem.groups;
  options.describe_pieces = describe_pieces;
  return BuildSavePlanFromClasses(ranks, problem.num_ranks, options);
}

TEST(SavePlanClassesTest, EqualsTheFlatPlannerOnRandomLayoutsValidAndInvalid) {
  std::mt19937_64 rng(20261124);
  int planned = 0, refused = 0;
  std::map<std::string, int> outcomes;
  for (int iter = 0; iter < 3000; ++iter) {
    const Problem problem = RandomProblem(rng);
    const int64_t target = 1 + rng() % 200;
    std::vector<int> local;
    absl::StatusOr<SavePlan> flat;
    absl::StatusOr<std::vector<TensorPiece>> pieces = Flatten(problem, &local);
    if (!pieces.ok()) {
      flat = pieces.status();
    } else {
      SavePlanOptions options;
      options.target_file_bytes = target;
      options.groups = problem.groups;
      flat = BuildSavePlan(*pieces, problem.num_ranks, options);
    }
    std::vector<RankPieces> kept;
    absl::StatusOr<SavePlan> classes = PlanOverClasses(problem, target, &kept);
    SCOPED_TRACE(absl::StrCat("iteration ", iter, " fault: ", problem.what));
    ASSERT_EQ(flat.ok(), classes.ok())
        << "flat: " << flat.status() << "\nclasses: " << classes.status();
    outcomes[absl::StrCat(problem.what, problem.groups.empty() ? "" : " +groups",
                          flat.ok() ? " planned" : " refused")]++;
    if (!flat.ok()) {
      ++refused;
      EXPECT_EQ(classes.status(), flat.status());
      continue;
    }
    ++planned;
    ToLocalIndex(local, &*flat);
    ASSERT_EQ(PlanString(*classes), PlanString(*flat));
    // Without the pieces' descriptions (the coordinator's parts), the same files and pieces.
    std::vector<RankPieces> kept_lean;
    absl::StatusOr<SavePlan> lean = PlanOverClasses(problem, target, &kept_lean, false);
    ASSERT_TRUE(lean.ok()) << lean.status();
    ASSERT_EQ(LeanString(*lean), LeanString(*flat));
    for (const WriterPlan& w : lean->writers) {
      for (const PlannedFile& f : w.files) {
        for (const PlannedPiece& p : f.pieces) EXPECT_TRUE(p.key.empty() && p.global_shape.empty());
      }
    }
  }
  for (const auto& [what, n] : outcomes) std::cerr << what << ": " << n << "\n";
  EXPECT_GT(planned, 1000);
  EXPECT_GT(refused, 500);
}

TEST(SavePlanClassesTest, DataParallelReplicasShareOneListAndThePlanNamesLocalIndexes) {
  // TP 2 x DP 3: rows over TP, optimizer flat over DP; the ranks of one TP index share a list.
  Problem p;
  p.num_ranks = 6;
  p.ranks.resize(6);
  for (int64_t r = 0; r < 6; ++r) {
    for (int t = 0; t < 3; ++t) {
      for (pb::PieceMeta& m :
           TensorPieces(t, t == 2 ? 2 : 0, pb::DTYPE_F32, {4, 3}, 2, 3, r % 2, r / 2, true)) {
        p.ranks[r].push_back(std::move(m));
      }
    }
  }
  std::vector<RankPieces> kept;
  absl::StatusOr<SavePlan> plan = PlanOverClasses(p, 1 << 20, &kept);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(kept[0].list(), kept[2].list());
  EXPECT_EQ(kept[1].list(), kept[5].list());
  EXPECT_NE(kept[0].list(), kept[1].list());
  int64_t pieces = 0;
  for (const WriterPlan& w : plan->writers) {
    for (const PlannedFile& f : w.files) {
      for (const PlannedPiece& piece : f.pieces) {
        ++pieces;
        const pb::PieceMeta own = kept[w.rank].Piece(piece.source_index);
        EXPECT_EQ(own.tensor().key(), piece.key);
        EXPECT_EQ(own.region().SerializeAsString(),
                  RegionToProto(piece.region).SerializeAsString());
      }
    }
  }
  EXPECT_EQ(pieces, 2 * 2 + 2 * 3);  // two row blocks of t0, t1; six flat pieces of t2
}

TEST(SavePlanClassesTest, TwoMainReplicasOfOneShardOnTwoRanksOverlap) {
  Problem p;
  p.num_ranks = 2;
  p.ranks.resize(2);
  for (int64_t r = 0; r < 2; ++r) {
    p.ranks[r] = TensorPieces(0, 0, pb::DTYPE_F32, {4}, 1, 2, 0, 0, false);  // both dp 0
  }
  std::vector<RankPieces> kept;
  absl::StatusOr<SavePlan> plan = PlanOverClasses(p, 1 << 20, &kept);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("tensor 't0.w': main replicas overlap"));
  EXPECT_THAT(plan.status().message(), HasSubstr("rank 0"));
  EXPECT_THAT(plan.status().message(), HasSubstr("rank 1"));
}

}  // namespace
}  // namespace ckpt
