#include "common/connection_budget.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

using Verdict = ConnectionBudget::Verdict;

TEST(ConnectionBudgetTest, RefusesAPeerOverItsOwnCapWhileOthersGetIn) {
  ConnectionBudget budget({/*max_total=*/100, /*max_per_peer=*/2});
  EXPECT_EQ(budget.Admit(10, "10.0.0.1", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.Admit(11, "10.0.0.1", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.Admit(12, "10.0.0.1", false).verdict, Verdict::kRefusePeer);
  EXPECT_EQ(budget.Admit(13, "10.0.0.2", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.PeerCount("10.0.0.1"), 2);
  EXPECT_EQ(budget.total(), 3);
  budget.Forget(10);
  EXPECT_EQ(budget.Admit(14, "10.0.0.1", false).verdict, Verdict::kAdmit);
}

TEST(ConnectionBudgetTest, SpentTotalEvictsTheHeaviestPeersOldestForALighterPeer) {
  ConnectionBudget budget({/*max_total=*/4, /*max_per_peer=*/10});
  for (int fd = 1; fd <= 4; ++fd)
    EXPECT_EQ(budget.Admit(fd, "flood", false).verdict, Verdict::kAdmit);
  ConnectionBudget::Decision d = budget.Admit(5, "operator", false);
  EXPECT_EQ(d.verdict, Verdict::kAdmitEvicting);
  ASSERT_TRUE(d.evict.has_value());
  EXPECT_EQ(*d.evict, 1);  // the oldest
  EXPECT_EQ(d.evicted_peer, "flood");
  EXPECT_EQ(budget.total(), 4);
  EXPECT_EQ(budget.PeerCount("flood"), 3);
  // The flooding peer itself gets no more once the total is spent.
  EXPECT_EQ(budget.Admit(6, "flood", false).verdict, Verdict::kRefuseTotal);
}

TEST(ConnectionBudgetTest, SpentTotalRefusesWhenEveryPeerHoldsAFairShare) {
  ConnectionBudget budget({/*max_total=*/2, /*max_per_peer=*/10});
  EXPECT_EQ(budget.Admit(1, "a", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.Admit(2, "b", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.Admit(3, "c", false).verdict, Verdict::kRefuseTotal);
  EXPECT_EQ(budget.total(), 2);
}

TEST(ConnectionBudgetTest, OutOfDescriptorsCountsAsASpentTotal) {
  ConnectionBudget budget({/*max_total=*/100, /*max_per_peer=*/100});
  EXPECT_EQ(budget.Admit(1, "a", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.Admit(2, "a", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.Admit(3, "b", true).verdict, Verdict::kAdmitEvicting);
  EXPECT_EQ(budget.Admit(4, "a", true).verdict, Verdict::kRefuseTotal);
}

TEST(ConnectionBudgetTest, AReusedIdReplacesTheConnectionItNamedBefore) {
  ConnectionBudget budget({/*max_total=*/100, /*max_per_peer=*/1});
  EXPECT_EQ(budget.Admit(7, "a", false).verdict, Verdict::kAdmit);
  // Descriptor 7 was closed by its owner and came back from accept for peer a again.
  EXPECT_EQ(budget.Admit(7, "a", false).verdict, Verdict::kAdmit);
  EXPECT_EQ(budget.total(), 1);
  budget.Forget(7);
  budget.Forget(7);
  EXPECT_EQ(budget.total(), 0);
  EXPECT_EQ(budget.PeerCount("a"), 0);
}

}  // namespace
}  // namespace ckpt
