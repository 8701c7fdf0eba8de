#include "common/arena_messages.h"

#include <string>

#include "google/protobuf/descriptor.pb.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Protobuf's own messages stand in for a call's request and response (common/ is below
// proto/): a file of many messages of many fields is, like a rank's description, many small
// nested messages.
using google::protobuf::DescriptorProto;
using google::protobuf::FileDescriptorProto;

TEST(ArenaMessageAllocatorTest, RequestAndResponseOfACallShareOneArenaAndParseOntoIt) {
  ArenaMessageAllocator<FileDescriptorProto, DescriptorProto> allocator;
  auto* holder = allocator.AllocateMessages();
  ASSERT_NE(holder->request()->GetArena(), nullptr);
  EXPECT_EQ(holder->request()->GetArena(), holder->response()->GetArena());

  FileDescriptorProto sent;
  for (int m = 0; m < 8; ++m) {
    DescriptorProto* message = sent.add_message_type();
    message->set_name("M" + std::to_string(m));
    for (int f = 0; f < 300; ++f) message->add_field()->set_number(f + 1);
  }
  ASSERT_TRUE(holder->request()->ParseFromString(sent.SerializeAsString()));
  EXPECT_EQ(holder->request()->message_type(7).field(299).number(), 300);
  EXPECT_EQ(holder->request()->message_type(7).field(299).GetArena(),
            holder->request()->GetArena());
  holder->response()->add_field()->set_name("answer");
  holder->Release();  // frees both at once (the ASan build checks that nothing leaks)
}

TEST(ArenaMessageAllocatorTest, EachCallGetsItsOwnArena) {
  ArenaMessageAllocator<FileDescriptorProto, DescriptorProto> allocator;
  auto* a = allocator.AllocateMessages();
  auto* b = allocator.AllocateMessages();
  EXPECT_NE(a->request()->GetArena(), b->request()->GetArena());
  a->Release();
  b->Release();
}

}  // namespace
}  // namespace ckpt
