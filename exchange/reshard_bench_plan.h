// The row-to-column reshard both data-plane benchmarks measure (ranks as threads in
// exchange_benchmark, ranks as processes in exchange_process_benchmark), defined once so the
// two always time the same exchange.
#ifndef CKPT_EXCHANGE_RESHARD_BENCH_PLAN_H_
#define CKPT_EXCHANGE_RESHARD_BENCH_PLAN_H_

#include <cstdint>
#include <vector>

#include "exchange/exchange.h"

namespace ckpt {

// An F32 tensor of `bytes` (4096 columns) stored as N row chunks (rank i loads chunk i, filled
// with byte i) where every rank needs column chunk i. Fills `loaded` with each rank's shards.
ExchangePlan RowsToColumnsReshardPlan(int n, int64_t bytes, std::vector<ShardBuffers>* loaded);

}  // namespace ckpt

#endif  // CKPT_EXCHANGE_RESHARD_BENCH_PLAN_H_
