#include "coordinator/lease_book.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

TEST(LeaseBookTest, RenewalsOfLiveWorkersAreRecordedOnceUntilTaken) {
  LeaseBook book;
  book.Add("w-1", "");
  book.Add("w-2", "");
  EXPECT_TRUE(book.Renew("w-1", nullptr));
  EXPECT_TRUE(book.Renew("w-1", nullptr));
  EXPECT_TRUE(book.Renew("w-2", nullptr));
  EXPECT_THAT(book.TakeRenewals(), UnorderedElementsAre("w-1", "w-2"));
  EXPECT_THAT(book.TakeRenewals(), IsEmpty());
  EXPECT_TRUE(book.Renew("w-2", nullptr));
  EXPECT_THAT(book.TakeRenewals(), ElementsAre("w-2"));
}

TEST(LeaseBookTest, UnknownRemovedOrOtherCertificatesWorkersAreLeftToTheRegistry) {
  LeaseBook book;
  book.Add("w-1", "CN=node0");
  const std::string node0 = "CN=node0", node1 = "CN=node1";
  EXPECT_FALSE(book.Renew("w-9", nullptr));  // unknown
  EXPECT_FALSE(book.Renew("w-1", &node1));   // registered by another certificate
  EXPECT_TRUE(book.Renew("w-1", &node0));
  book.Remove("w-1");  // died: its pending renewal goes too
  EXPECT_THAT(book.TakeRenewals(), IsEmpty());
  EXPECT_FALSE(book.Renew("w-1", &node0));
  book.Add("w-1", "CN=node0");  // registered again
  EXPECT_TRUE(book.Renew("w-1", &node0));
  EXPECT_THAT(book.TakeRenewals(), ElementsAre("w-1"));
}

TEST(LeaseBookTest, TheLagIsKeptForItsWindowAndTheNextThenForgotten) {
  LeaseBook book;
  const absl::Duration lease = absl::Seconds(10);
  const absl::Time start = absl::FromUnixSeconds(1000);  // the start of a window
  EXPECT_EQ(book.RecentLag(start, lease, lease), absl::ZeroDuration());
  book.NoteLag(absl::Seconds(3), start + absl::Seconds(1), lease);
  book.NoteLag(absl::Seconds(1), start + absl::Seconds(2), lease);  // the largest is kept
  EXPECT_EQ(book.RecentLag(start + absl::Seconds(5), lease, lease), absl::Seconds(3));
  // The next window still counts the last one's lag, also once it noted a smaller one.
  book.NoteLag(absl::Seconds(2), start + absl::Seconds(12), lease);
  EXPECT_EQ(book.RecentLag(start + absl::Seconds(15), lease, lease), absl::Seconds(3));
  // Two windows on, only the newer one counts; with no lag noted for two windows, none.
  EXPECT_EQ(book.RecentLag(start + absl::Seconds(25), lease, lease), absl::Seconds(2));
  EXPECT_EQ(book.RecentLag(start + absl::Seconds(35), lease, lease), absl::ZeroDuration());
  // At most the cap.
  book.NoteLag(absl::Minutes(5), start + absl::Seconds(40), lease);
  EXPECT_EQ(book.RecentLag(start + absl::Seconds(41), lease, lease), lease);
}

}  // namespace
}  // namespace ckpt::coordinator
