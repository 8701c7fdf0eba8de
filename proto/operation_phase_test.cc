#include "proto/operation_phase.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(OperationPhaseTest, OnlyDoneAndAbortedOperationsHaveEnded) {
  const google::protobuf::EnumDescriptor* phases = pb::OperationPhase_descriptor();
  for (int i = 0; i < phases->value_count(); ++i) {
    const auto phase = static_cast<pb::OperationPhase>(phases->value(i)->number());
    const bool ended = phase == pb::PHASE_DONE || phase == pb::PHASE_ABORTED;
    EXPECT_EQ(IsFinal(phase), ended) << phases->value(i)->name();
  }
}

}  // namespace
}  // namespace ckpt
