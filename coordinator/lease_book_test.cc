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

}  // namespace
}  // namespace ckpt::coordinator
