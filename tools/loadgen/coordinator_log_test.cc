#include "tools/loadgen/coordinator_log.h"

#include "gtest/gtest.h"

namespace ckpt::loadgen {
namespace {

TEST(CoordinatorLogTest, ReadsPhaseEventsByOperation) {
  const char* log =
      "2026-01-02T03:04:05.100000Z info coordinator rank_joined op=op-a-1 job=j rank=0\n"
      "2026-01-02T03:04:05.250000Z info coordinator operation_gathered op=op-a-1 job=j\n"
      "2026-01-02T03:04:06.500000Z info coordinator operation_planned op=op-a-1 bytes_total=9 "
      "plan_reused=true serving_ranks=0 planner_s=1.125 planner_cpu_s=0.750\n"
      "garbage line\n"
      "2026-01-02T03:04:07.000000Z info coordinator operation_committed op=op-a-1 path=/x\n"
      "2026-01-02T03:04:07.001000Z info coordinator operation_done op=op-a-1 job=j\n"
      "2026-01-02T03:04:08.000000Z error coordinator operation_aborted op=op-a-2 cause=\"x\"\n"
      "2026-01-02T03:04:09.000000Z info coordinator operation_planned op=op-a-3 "
      "planner_s=fast planner_cpu_s=\n";
  std::map<std::string, OperationLogTimes> times = ParseCoordinatorLog(log);
  ASSERT_EQ(times.size(), 3u);
  const OperationLogTimes& a = times["op-a-1"];
  EXPECT_EQ(a.planned - a.gathered, absl::Milliseconds(1250));
  EXPECT_EQ(a.done - a.committed, absl::Milliseconds(1));
  EXPECT_EQ(a.aborted, absl::InfinitePast());
  EXPECT_TRUE(a.plan_reused);
  EXPECT_DOUBLE_EQ(a.planner_seconds, 1.125);
  EXPECT_DOUBLE_EQ(a.planner_cpu_seconds, 0.75);
  EXPECT_FALSE(times["op-a-2"].plan_reused);
  EXPECT_EQ(times["op-a-2"].planner_seconds, -1);      // not logged
  EXPECT_EQ(times["op-a-3"].planner_seconds, -1);      // not a number
  EXPECT_EQ(times["op-a-3"].planner_cpu_seconds, -1);  // empty
  EXPECT_NE(times["op-a-2"].abort_line.find("cause=\"x\""), std::string::npos);
}

}  // namespace
}  // namespace ckpt::loadgen
