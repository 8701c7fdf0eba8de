#include "proto/deterministic.h"

#include <string>

#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace ckpt {
namespace {

pb::JoinOperationRequest JoinOf(int rank, int pieces) {
  pb::JoinOperationRequest join;
  join.set_job("job");
  join.set_rank(rank);
  for (int i = 0; i < pieces; ++i) {
    join.mutable_state()->add_shards()->mutable_tensor()->set_key(std::string(40, 'a' + i % 26));
  }
  return join;
}

TEST(DeterministicTest, MessagesAppendedOneByOneParseAsTheParentsRepeatedField) {
  pb::JoinOperationsRequest whole;
  std::string appended;
  // Sizes whose length varint takes 1, 2 and 3 bytes.
  for (int pieces : {0, 3, 400}) {
    *whole.add_joins() = JoinOf(pieces, pieces);
    AppendMessageField(pb::JoinOperationsRequest::kJoinsFieldNumber, JoinOf(pieces, pieces),
                       &appended);
  }
  EXPECT_EQ(appended, SerializeDeterministically(whole));
  pb::JoinOperationsRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(appended));
  ASSERT_EQ(parsed.joins_size(), 3);
  EXPECT_EQ(parsed.joins(2).state().shards_size(), 400);
}

TEST(DeterministicTest, BytesAppendedAsAFieldEqualTheMessageAppendedAsOne) {
  std::string as_message, as_bytes;
  for (int pieces : {0, 3, 400}) {
    const pb::JoinOperationRequest join = JoinOf(pieces, pieces);
    AppendMessageField(pb::JoinOperationsRequest::kJoinsFieldNumber, join, &as_message);
    AppendBytesField(pb::JoinOperationsRequest::kJoinsFieldNumber, SerializeDeterministically(join),
                     &as_bytes);
  }
  EXPECT_EQ(as_bytes, as_message);
}

}  // namespace
}  // namespace ckpt
