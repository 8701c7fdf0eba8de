#include "coordinator/piece_classes.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);
const absl::Time kNever = absl::InfiniteFuture();  // a call parked without a latest

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
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, kNever, count));   // asked: goes on now
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, kNever, count));  // waits for the supplier
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, kNever, count));
  EXPECT_EQ(classes.parked(), 2);
  EXPECT_FALSE(classes.Find("j", "D").has_value());
  EXPECT_EQ(RunAll(classes.Add("j", "D", SomeClass())), 2);
  EXPECT_EQ(resumed, 2);
  EXPECT_EQ(classes.parked(), 0);
  ASSERT_TRUE(classes.Find("j", "D").has_value());
  EXPECT_EQ(*classes.Find("j", "D")->rest, "rest");
  EXPECT_FALSE(classes.Find("other", "D").has_value());           // classes are per job
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, kNever, count));  // held: goes on
  EXPECT_EQ(resumed, 2);
}

// A call asked for one class never waits for another, so two workers that each supply what
// the other waits for cannot wait on each other.
TEST(PieceClassesTest, ACallAskedForAClassIsNeverParked) {
  PieceClasses classes(absl::Seconds(5), 100);
  auto never = [] { FAIL() << "not parked"; };
  EXPECT_TRUE(classes.Admit("j", {"X"}, kStart, kNever, never));
  EXPECT_TRUE(classes.Admit("j", {"Y"}, kStart, kNever, never));
  EXPECT_TRUE(classes.Admit("j", {"X", "Z"}, kStart, kNever, never));  // asked for Z, so not parked
  bool resumed = false;
  EXPECT_FALSE(classes.Admit("j", {"Z"}, kStart, kNever, [&] { resumed = true; }));  // Z was asked
  EXPECT_EQ(classes.parked(), 1);
  EXPECT_EQ(RunAll(classes.Add("j", "X", SomeClass())), 0);
  EXPECT_EQ(RunAll(classes.Add("j", "Z", SomeClass())), 1);
  EXPECT_TRUE(resumed);
}

// The supplier never came: the first call waiting for it is asked in its place when its wait
// passes, and the calls that come later wait for that one.
TEST(PieceClassesTest, AWaitEndsWithItsSuppliersWaitAndTheWaiterIsAskedInItsPlace) {
  PieceClasses classes(absl::Seconds(5), 100);
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, kNever, [] {}));
  bool resumed = false;
  EXPECT_FALSE(
      classes.Admit("j", {"D"}, kStart + absl::Seconds(1), kNever, [&] { resumed = true; }));
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(4))), 0);
  EXPECT_FALSE(resumed);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(5))), 1);
  EXPECT_TRUE(resumed);
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart + absl::Seconds(6), kNever, [] {}));
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(9))), 0);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(10))), 1);  // asked in its turn
  // Nobody waits for a supplier now overdue: the next call is asked at once.
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart + absl::Seconds(16), kNever, [] {}));
}

// A burst delays the supplier past its wait: one waiting call is asked in its place, the others
// keep waiting (one more full description, not one per waiting call), and the late class
// hands them back when it arrives.
TEST(PieceClassesTest, ALateSupplierIsReplacedByOneWaiterAndTheOthersWaitOn) {
  PieceClasses classes(absl::Seconds(5), 100);
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, kNever, [] {}));
  int resumed = 0;
  auto count = [&] { ++resumed; };
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(classes.Admit("j", {"D"}, kStart + absl::Seconds(1), kNever, count));
  }
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(5))), 1);
  EXPECT_EQ(classes.parked(), 3);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(9))), 0);
  EXPECT_EQ(RunAll(classes.Add("j", "D", SomeClass())), 3);  // the first supplier, late
  EXPECT_EQ(resumed, 4);
  EXPECT_EQ(classes.parked(), 0);
}

// A call is handed back at its latest (its RPC's deadline) whatever it waits for, and one whose
// latest has passed is never parked.
TEST(PieceClassesTest, ACallIsNeverParkedPastItsLatest) {
  PieceClasses classes(absl::Seconds(5), 100);
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, kNever, [] {}));
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, kStart + absl::Seconds(2), [] {}));
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, kStart + absl::Seconds(7), [] {}));
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(1))), 0);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(2))), 1);
  // The third is asked in place of the overdue supplier at 5; a fourth's latest (7) comes
  // before the new supplier's wait ends (10).
  EXPECT_FALSE(
      classes.Admit("j", {"D"}, kStart + absl::Seconds(3), kStart + absl::Seconds(7), [] {}));
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(5))), 1);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(6))), 0);
  EXPECT_EQ(RunAll(classes.Expire(kStart + absl::Seconds(7))), 1);
  EXPECT_EQ(classes.parked(), 0);
  EXPECT_TRUE(
      classes.Admit("j", {"D"}, kStart + absl::Seconds(8), kStart + absl::Seconds(8), [] {}));
}

TEST(PieceClassesTest, DroppingAJobHandsBackItsParkedCallsAndForgetsItsClasses) {
  PieceClasses classes(absl::Seconds(5), 100);
  classes.Add("j", "A", SomeClass());
  classes.Add("k", "A", SomeClass());
  EXPECT_TRUE(classes.Admit("j", {"D"}, kStart, kNever, [] {}));
  EXPECT_FALSE(classes.Admit("j", {"D"}, kStart, kNever, [] {}));
  EXPECT_TRUE(classes.Admit("k", {"D"}, kStart, kNever, [] {}));
  EXPECT_FALSE(classes.Admit("k", {"D"}, kStart, kNever, [] {}));
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

// A class past the bound is not held, so the calls waiting for it go on at once (their ranks
// send in full) instead of waiting out their supplier's wait.
TEST(PieceClassesTest, AClassPastTheBoundHandsBackItsWaiters) {
  PieceClasses classes(absl::Seconds(5), 1);
  classes.Add("j", "A", SomeClass());
  EXPECT_TRUE(classes.Admit("j", {"X"}, kStart, kNever, [] {}));
  EXPECT_FALSE(classes.Admit("j", {"X"}, kStart, kNever, [] {}));
  EXPECT_FALSE(classes.Admit("j", {"A", "X"}, kStart, kNever, [] {}));
  EXPECT_EQ(RunAll(classes.Add("j", "X", SomeClass())), 2);
  EXPECT_FALSE(classes.Find("j", "X").has_value());
  EXPECT_EQ(classes.parked(), 0);
}

}  // namespace
}  // namespace ckpt::coordinator
