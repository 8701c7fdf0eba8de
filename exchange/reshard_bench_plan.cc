#include "exchange/reshard_bench_plan.h"

#include <algorithm>
#include <string>

namespace ckpt {

ExchangePlan RowsToColumnsReshardPlan(int n, int64_t bytes, std::vector<ShardBuffers>* loaded) {
  const int64_t cols = 4096, rows = bytes / 4 / cols;
  const int64_t rchunk = (rows + n - 1) / n, cchunk = (cols + n - 1) / n;
  ExchangePlan plan;
  plan.num_ranks = n;
  plan.needs.resize(n);
  loaded->assign(n, {});
  for (int r = 0; r < n; ++r) {
    DistributedPiece d;
    d.spec.id.key = "w";
    d.spec.dtype = DType::kF32;
    d.spec.global_shape = {rows, cols};
    int64_t lo = std::min(rows, r * rchunk), hi = std::min(rows, (r + 1) * rchunk);
    d.spec.region.offsets = {lo, 0};
    d.spec.region.lengths = {hi - lo, cols};
    d.spec.id.offsets = d.spec.region.offsets;
    d.main_rank = r;
    (*loaded)[r][d.spec.id] = std::string(d.spec.NumBytes(), static_cast<char>(r));
    plan.distribution.push_back(d);
    PieceSpec need = d.spec;
    int64_t clo = std::min(cols, r * cchunk), chi = std::min(cols, (r + 1) * cchunk);
    need.region.offsets = {0, clo};
    need.region.lengths = {rows, chi - clo};
    need.id.offsets = need.region.offsets;
    plan.needs[r].push_back(need);
  }
  return plan;
}

}  // namespace ckpt
