#include "coordinator/piece_classes.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

PieceClass SomeClass() {
  return PieceClass{std::make_shared<SharedPieceList>(), std::make_shared<std::string>("rest")};
}

// Runs what was handed back and counts it.
int RunAll(const std::vector<PieceClasses::Resume>& resumes) {
  for (const PieceClasses::Resume& r : resumes) r();
  return static_cast<int>(resumes.size());
}

TEST(PieceClassesTest, OneCallIsAskedForAClassAndTheOthersWaitForIt) {
  PieceClasses classes(absl::Seconds(5), 100);
  int resumed = 0;
  auto count = [&] { ++resumed; };
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, count));   // asked: goes on now
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, count));  // waits for the supplier
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, count));
  EXPECT_EQ(classes.parked(), 2);
  EXPECT_FALSE(classes.Find("j", "D").has_value());
  EXPECT_EQ(RunAll(classes.Add("j", "D", SomeClass())), 2);
  EXPECT_EQ(resumed, 2);
  EXPECT_EQ(classes.parked(), 0);
  ASSERT_TRUE(classes.Find("j", "D").has_value());
  EXPECT_EQ(*classes.Find("j", "D")->rest, "rest");
  EXPECT_FALSE(classes.Find("other", "D").has_value());   // classes are per job
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, count));  // held: goes on
  EXPECT_EQ(resumed, 2);
}

// A call asked for one class never waits for another, so two workers that each supply what
// the other waits for cannot wait on each other.
TEST(PieceClassesTest, ACallAskedForAClassIsNeverParked) {
  PieceClasses classes(absl::Seconds(5), 100);
  auto never = [] { FAIL() << "not parked"; };
  EXPECT_TRUE(classes.Admit("j", {"X"}, kStart, never));
  EXPECT_TRUE(classes.Admit("j", {"Y"}, kStart, never));
  EXPECT_TRUE(classes.Admit("j", {"X", "Z"}, kStart, never));  // asked for Z, so not parked
  bool resumed = false;
  EXPECT_FALSE(classes.Admit("j", {"Z"}, kStart, [&] { resumed = true; }));  // Z was asked
  EXPECT_EQ(classes.parked(), 1);
  EXPECT_EQ(RunAll(classes.Add("j", "X", SomeClass())), 0);
  EXPECT_EQ(RunAll(classes.Add("j", "Z", SomeClass())), 1);
  EXPECT_TRUE(resumed);
}

TEST(PieceClassesTest, AWaitEndsWithItsSuppliersWaitAndTheClassIsAskedAgain) {
  PieceClasses classes(absl::Seconds(5), 100);
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, [] {}));
  bool resumed = false;
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart + absl::Seconds(1), [&] { resumed = true; }));
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(4))), 0);
  EXPECT_FALSE(resumed);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(5))), 1);
  EXPECT_TRUE(resumed);
  // The supplier never came: the next call is asked in its place.
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart + absl::Seconds(6), [] {}));
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart + absl::Seconds(6), [] {}));
  EXPECT_EQ(RunAll(classes.TakeAllParked()), 1);
}

TEST(PieceClassesTest, DroppingAJobHandsBackItsParkedCallsAndForgetsItsClasses) {
  PieceClasses classes(absl::Seconds(5), 100);
  classes.Add("j", "A", SomeClass());
  classes.Add("k", "A", SomeClass());
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, [] {}));
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, [] {}));
  EXPECT_TRUE(classes.Admit("k", {"D"}, kStart, [] {}));
  EXPECT_FALSE(classes.Admit("k", {"D"}, kStart, [] {}));
  EXPECT_EQ(RunAll(classes.DropJob("j")), 1);
  EXPECT_FALSE(classes.Find("j", "A").has_value());
  EXPECT_TRUE(classes.Find("k", "A").has_value());
  EXPECT_EQ(classes.parked(), 1);
  EXPECT_EQ(RunAll(classes.TakeAllParked()), 1);
}

TEST(PieceClassesTest, ClassesPastTheJobsBoundAreNotHeld) {
  PieceClasses classes(absl::Seconds(5), 2);
  classes.Add("j", "A", SomeClass());
  classes.Add("j", "B", SomeClass());
  classes.Add("j", "C", SomeClass());
  EXPECT_TRUE(classes.Find("j", "B").has_value());
  EXPECT_FALSE(classes.Find("j", "C").has_value());
  classes.Add("j", "A", SomeClass());  // one already held may be replaced
  EXPECT_EQ(classes.classes(), 2);
}

}  // namespace
}  // namespace ckpt::coordinator
