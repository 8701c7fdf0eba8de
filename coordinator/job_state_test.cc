#include "coordinator/job_state.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RankLocation Loc(int worker) {
  return RankLocation{absl::StrCat("w-", worker), absl::StrCat("node", worker), 1000 + worker};
}

JoinRequest Join(int rank, int world_size = 2, OperationKind kind = OperationKind::kSave,
                 std::string path = "/ckpt/step10") {
  JoinRequest r;
  r.job = "gpt";
  r.world_size = world_size;
  r.rank = rank;
  r.kind = kind;
  r.path = std::move(path);
  r.location = Loc(rank);
  pb::PieceMeta shard;
  shard.mutable_tensor()->set_key(absl::StrCat("w", rank));
  r.shards.push_back(shard);
  return r;
}

class JobStateTest : public ::testing::Test {
 protected:
  JobStateOptions Options() {
    JobStateOptions o;
    o.arrival_deadline = absl::Seconds(10);
    o.execution_deadline = absl::Seconds(100);
    o.finished_operations_kept = 3;
    return o;
  }
  FakeClock clock_;
  JobState state_{&clock_, Options()};

  // Joins every rank of a world-size-2 save and returns the operation id (in planning).
  std::string Gathered(OperationKind kind = OperationKind::kSave) {
    auto a = state_.JoinOperation(Join(0, 2, kind));
    auto b = state_.JoinOperation(Join(1, 2, kind));
    EXPECT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*b)->phase, Phase::kPlanning);
    return (*a)->id;
  }
  std::string Executing(OperationKind kind = OperationKind::kSave) {
    std::string id = Gathered(kind);
    EXPECT_TRUE(state_.SetPlan(id, {{"part0", 100}, {"part1", 300}}).ok());
    return id;
  }
};

TEST(JobStateIncarnationTest, OperationIdsCarryTheIncarnationAndIdsOfAnotherAreUnknown) {
  FakeClock clock;
  JobState before(&clock, JobStateOptions(), "00000000000000aa");
  JobState after(&clock, JobStateOptions(), "00000000000000bb");
  auto old_op = before.JoinOperation(Join(0, 1));
  auto new_op = after.JoinOperation(Join(0, 1));
  ASSERT_TRUE(old_op.ok() && new_op.ok());
  EXPECT_EQ((*old_op)->id, "op-00000000000000aa-1");
  EXPECT_EQ((*new_op)->id, "op-00000000000000bb-1");
  const std::string old_id = (*old_op)->id;
  EXPECT_EQ(after.FindOperation(old_id), nullptr);
  EXPECT_EQ(after.FindOperation("op-1"), nullptr);
  absl::Status s = after.ReportResult(old_id, 0, absl::OkStatus());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("incarnation 00000000000000bb"));
}

TEST_F(JobStateTest, ParsesAndNamesKindsAndPhases) {
  EXPECT_EQ(*ParseOperationKind("reshard"), OperationKind::kReshard);
  EXPECT_EQ(ParseOperationKind("copy").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PhaseName(Phase::kCommitting), "committing");
  EXPECT_TRUE(IsFinal(Phase::kAborted));
  EXPECT_FALSE(IsFinal(Phase::kCommitting));
}

TEST_F(JobStateTest, AttachCreatesJobAndRejectsOtherWorldSize) {
  ASSERT_TRUE(state_.AttachRank("gpt", 4, 2, Loc(2)).ok());
  const Job* job = state_.FindJob("gpt");
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->world_size, 4);
  EXPECT_EQ(job->ranks.at(2).host, "node2");
  absl::Status s = state_.AttachRank("gpt", 8, 1, Loc(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("world size 4"));
  EXPECT_EQ(state_.AttachRank("gpt", 4, 4, Loc(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.AttachRank("gpt", 4, -1, Loc(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.AttachRank("", 4, 0, Loc(1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStateTest, TwoTrainersClaimingOneRankAreRefusedNamingTheFirst) {
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());  // same worker again: fine
  absl::Status s = state_.AttachRank("gpt", 2, 0, Loc(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("already attached (host node0"));
  EXPECT_THAT(s.message(), HasSubstr("from host node1"));
  state_.DetachRank("gpt", 0, "w-0");
  EXPECT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(1)).ok());  // after it left
}

TEST_F(JobStateTest, ARankAttachingAgainAsItWasChangesNothingAndAMovedWorkerIsRecorded) {
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());
  const uint64_t attached = state_.version();
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());  // every repeat join does this
  EXPECT_EQ(state_.version(), attached);
  RankLocation restarted = Loc(0);  // the same worker id, its process restarted
  restarted.worker_pid = 4242;
  restarted.gpu = 3;
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, restarted).ok());
  EXPECT_GT(state_.version(), attached);
  EXPECT_EQ(state_.FindJob("gpt")->ranks.at(0).worker_pid, 4242);
  EXPECT_EQ(state_.FindJob("gpt")->ranks.at(0).gpu, 3);
}

TEST_F(JobStateTest, AJobWhoseRanksAllLeftMayComeBackWithAnotherWorldSize) {
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 1, Loc(1)).ok());
  state_.DetachRank("gpt", 0, "w-0");
  state_.DetachRank("gpt", 1, "w-7");  // attached elsewhere: ignored
  EXPECT_EQ(state_.AttachRank("gpt", 3, 0, Loc(0)).code(), absl::StatusCode::kFailedPrecondition);
  state_.WorkerLost("w-1", "died");  // its trainers are gone too
  EXPECT_TRUE(state_.FindJob("gpt")->ranks.empty());
  ASSERT_TRUE(state_.AttachRank("gpt", 3, 2, Loc(2)).ok());
  EXPECT_EQ(state_.FindJob("gpt")->world_size, 3);
}

TEST_F(JobStateTest, ARankWhoseTrainerLeftBeforeJoiningAbortsTheGatheringAtOnceNamingIt) {
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 1, Loc(1)).ok());
  auto a = state_.JoinOperation(Join(0));
  ASSERT_TRUE(a.ok());
  const std::string id = (*a)->id;
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(state_.DetachRank("gpt", 1, "w-7").empty());  // attached elsewhere: ignored
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kGathering);
  EXPECT_THAT(state_.DetachRank("gpt", 1, "w-1"), ::testing::ElementsAre(id));
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->phase, Phase::kAborted);  // not at the arrival deadline, 9 s later
  EXPECT_EQ(op->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 1 (its trainer connected through host node1"));
  EXPECT_THAT(op->status.message(), HasSubstr("then left it at 2023-11-14 22:13:21.000 UTC"));
  EXPECT_THAT(op->status.message(), HasSubstr("before joining"));
  EXPECT_THAT(op->status.message(), Not(HasSubstr("never connected")));
  EXPECT_EQ(state_.InFlight("gpt"), nullptr);
}

TEST_F(JobStateTest, ARankThatLeftBeforeAnOperationStartedIsNamedAsLeftAtItsDeadline) {
  ASSERT_TRUE(state_.AttachRank("gpt", 3, 1, Loc(1)).ok());
  ASSERT_TRUE(state_.AttachRank("gpt", 3, 2, Loc(2)).ok());
  EXPECT_TRUE(state_.DetachRank("gpt", 1, "w-1").empty());  // nothing in flight
  EXPECT_TRUE(state_.DetachRank("gpt", 2, "w-2").empty());
  ASSERT_TRUE(state_.AttachRank("gpt", 3, 2, Loc(2)).ok());  // rank 2 came back
  auto a = state_.JoinOperation(Join(0, 3));
  ASSERT_TRUE(a.ok());
  clock_.Advance(absl::Seconds(10));
  ASSERT_THAT(state_.Tick(), ::testing::ElementsAre((*a)->id));
  const Operation* op = state_.FindOperation((*a)->id);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 1 (its trainer connected through host node1"));
  EXPECT_THAT(op->status.message(), HasSubstr("rank 2 (host node2, worker w-2"));
  EXPECT_THAT(op->status.message(), Not(HasSubstr("never connected")));
}

TEST_F(JobStateTest, LastRankToJoinStartsPlanningWithEveryRanksShards) {
  auto a = state_.JoinOperation(Join(0));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->phase, Phase::kGathering);
  EXPECT_EQ((*a)->requested_by, "rank 0");
  std::string id = (*a)->id;
  auto b = state_.JoinOperation(Join(1));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->id, id);
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->phase, Phase::kPlanning);
  EXPECT_EQ(op->JoinedRanks(), 2);
  EXPECT_EQ(op->ranks[1].shards[0].tensor().key(), "w1");
  EXPECT_EQ(op->ranks[1].location.host, "node1");
}

TEST_F(JobStateTest, JoiningTwiceIsIdempotent) {
  auto a = state_.JoinOperation(Join(0));
  auto again = state_.JoinOperation(Join(0));
  ASSERT_TRUE(a.ok() && again.ok());
  EXPECT_EQ((*a)->id, (*again)->id);
  EXPECT_EQ((*again)->JoinedRanks(), 1);
  EXPECT_EQ((*again)->phase, Phase::kGathering);
}

TEST_F(JobStateTest, MismatchedKindOrPathIsRejectedNamingBoth) {
  ASSERT_TRUE(state_.JoinOperation(Join(0)).ok());
  auto wrong_path = state_.JoinOperation(Join(1, 2, OperationKind::kSave, "/other"));
  EXPECT_EQ(wrong_path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_path.status().message(), HasSubstr("/other"));
  EXPECT_THAT(wrong_path.status().message(), HasSubstr("/ckpt/step10"));
  auto wrong_kind = state_.JoinOperation(Join(1, 2, OperationKind::kLoad));
  EXPECT_THAT(wrong_kind.status().message(), HasSubstr("rank 1 asked to load"));
}

TEST_F(JobStateTest, MissingRankAbortsAtArrivalDeadlineNamingRankAndHost) {
  ASSERT_TRUE(state_.AttachRank("gpt", 3, 2, Loc(2)).ok());
  auto a = state_.JoinOperation(Join(0, 3));
  ASSERT_TRUE(a.ok());
  std::string id = (*a)->id;
  clock_.Advance(absl::Seconds(9));
  EXPECT_TRUE(state_.Tick().empty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(state_.Tick(), ::testing::ElementsAre(id));
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->phase, Phase::kAborted);
  EXPECT_EQ(op->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 1 (its trainer never connected"));
  EXPECT_THAT(op->status.message(), HasSubstr("rank 2 (host node2, worker w-2"));
  EXPECT_THAT(op->status.message(), HasSubstr("did not join within 10s"));
  EXPECT_THAT(op->status.message(), Not(HasSubstr("rank 0")));
  EXPECT_EQ(state_.InFlight("gpt"), nullptr);
  // A late rank learns the diagnosis when it names the operation; otherwise it starts anew.
  JoinRequest late = Join(1, 3);
  late.operation_id = id;
  EXPECT_EQ(state_.JoinOperation(late).status(), op->status);
}

TEST_F(JobStateTest, PlanMovesToExecutingAndTracksProgress) {
  std::string id = Executing();
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->phase, Phase::kExecuting);
  EXPECT_EQ(op->BytesTotal(), 400);
  EXPECT_EQ(op->ranks[1].plan_part, "part1");
  ASSERT_TRUE(state_.ReportProgress(id, 1, 120).ok());
  ASSERT_TRUE(state_.ReportProgress(id, 1, 50).ok());    // never goes backwards
  ASSERT_TRUE(state_.ReportProgress(id, 0, 1000).ok());  // capped at the rank's total
  EXPECT_EQ(op->BytesDone(), 220);
  EXPECT_EQ(state_.ReportProgress(id, 2, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStateTest, SetPlanNeedsOnePartPerRankInPlanning) {
  auto a = state_.JoinOperation(Join(0));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(state_.SetPlan((*a)->id, {{"", 0}, {"", 0}}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(state_.JoinOperation(Join(1)).ok());
  EXPECT_EQ(state_.SetPlan((*a)->id, {{"", 0}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.SetPlan((*a)->id, {{"", 0}, {"", -1}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.SetPlan("op-77", {}).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStateTest, ServingParticipantsJoinWithThePlanAndMustAllReportOrDie) {
  // A receive (live transfer): two destination ranks plus one serving participant on a worker
  // of another job, added by the plan.
  const std::string id = Gathered(OperationKind::kLoad);
  std::vector<RankPlan> plans = {{"part0", 10}, {"part1", 10}, {"serve", 20}};
  EXPECT_EQ(state_.SetPlan(id, plans).code(), absl::StatusCode::kInvalidArgument);  // no worker
  RankLocation source;
  source.worker_id = "w-src";
  source.host = "hostA";
  plans[2].serving = source;
  plans[2].serving_source = "xfer://p@1";
  plans[2].reused = true;
  plans[0].serving = source;  // a job rank cannot be a serving one
  EXPECT_EQ(state_.SetPlan(id, plans).code(), absl::StatusCode::kInvalidArgument);
  plans[0].serving.reset();
  ASSERT_TRUE(state_.SetPlan(id, plans).ok());
  const Operation* op = state_.FindOperation(id);
  ASSERT_EQ(op->ranks.size(), 3u);
  EXPECT_EQ(op->world_size, 2);
  EXPECT_EQ(op->serving_ranks, 1);
  EXPECT_TRUE(op->plan_reused);
  EXPECT_TRUE(op->ranks[2].serving && op->ranks[2].joined);
  EXPECT_EQ(op->BytesTotal(), 40);
  // The destination ranks alone do not end it: the serving rank must report too.
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus()).ok());
  EXPECT_EQ(op->phase, Phase::kExecuting);
  ASSERT_TRUE(state_.ReportProgress(id, 2, 5).ok());
  ASSERT_TRUE(state_.ReportResult(id, 2, absl::OkStatus()).ok());
  EXPECT_EQ(op->phase, Phase::kDone);

  // The serving worker dies mid-way: the receive aborts naming the serving rank and worker.
  const std::string again = Gathered(OperationKind::kLoad);
  plans[2].reused = false;
  ASSERT_TRUE(state_.SetPlan(again, plans).ok());
  EXPECT_EQ(state_.WorkerLost("w-src", "missed its lease"), std::vector<std::string>{again});
  const Operation* aborted = state_.FindOperation(again);
  EXPECT_EQ(aborted->phase, Phase::kAborted);
  EXPECT_THAT(aborted->status.message(), HasSubstr("serving rank 2"));
  EXPECT_THAT(aborted->status.message(), HasSubstr("w-src"));
  EXPECT_THAT(aborted->status.message(), HasSubstr("xfer://p@1"));
}

TEST_F(JobStateTest, SaveCommitsOnlyAfterEveryRankSucceeded) {
  std::string id = Executing();
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus()).ok());
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kExecuting);
  EXPECT_EQ(state_.FinishCommit(id, absl::OkStatus()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus()).ok());
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kCommitting);
  EXPECT_EQ(state_.FindOperation(id)->BytesDone(), 400);
  ASSERT_TRUE(state_.FinishCommit(id, absl::OkStatus()).ok());
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kDone);
  EXPECT_TRUE(state_.FindOperation(id)->status.ok());
  EXPECT_EQ(state_.InFlight("gpt"), nullptr);
}

TEST_F(JobStateTest, LoadIsDoneWithoutCommit) {
  std::string id = Executing(OperationKind::kLoad);
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus()).ok());
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kDone);
}

TEST_F(JobStateTest, FailedRankResultAbortsNamingRankHostAndCauseAndNeverCommits) {
  std::string id = Executing();
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::ResourceExhaustedError("disk full")).ok());
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->phase, Phase::kAborted);
  EXPECT_EQ(op->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 1 (host node1"));
  EXPECT_THAT(op->status.message(), HasSubstr("disk full"));
  EXPECT_EQ(state_.FinishCommit(id, absl::OkStatus()).code(),
            absl::StatusCode::kFailedPrecondition);
  // Later reports of other ranks get the diagnosis.
  EXPECT_EQ(state_.ReportResult(id, 0, absl::OkStatus()), op->status);
  EXPECT_EQ(state_.ReportProgress(id, 0, 1), op->status);
}

TEST_F(JobStateTest, LostWorkerAbortsOperationsWithRanksOnIt) {
  std::string id = Executing();
  ASSERT_TRUE(state_.AttachRank("other", 1, 0, Loc(5)).ok());
  auto other = state_.JoinOperation([] {
    JoinRequest r = Join(0, 1);
    r.job = "other";
    r.location = Loc(5);
    return r;
  }());
  ASSERT_TRUE(other.ok());
  std::string other_id = (*other)->id;
  auto aborted = state_.WorkerLost("w-1", "missed its lease of 5s");
  EXPECT_THAT(aborted, ::testing::ElementsAre(id));
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 1 (host node1, worker w-1 (pid 1001))"));
  EXPECT_THAT(op->status.message(), HasSubstr("missed its lease"));
  // The other job is untouched.
  EXPECT_EQ(state_.FindOperation(other_id)->phase, Phase::kPlanning);
}

TEST_F(JobStateTest, LostWorkerOfAttachedButNotJoinedRankAbortsGathering) {
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 1, Loc(1)).ok());
  auto a = state_.JoinOperation(Join(0));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(state_.WorkerLost("w-1", "died").size(), 1u);
  EXPECT_THAT(state_.FindOperation((*a)->id)->status.message(), HasSubstr("rank 1 (host node1"));
}

TEST_F(JobStateTest, CommittingIsNotAbortedByWorkerLossOrDeadline) {
  std::string id = Executing();
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus()).ok());
  EXPECT_TRUE(state_.WorkerLost("w-0", "died").empty());
  clock_.Advance(absl::Hours(10));
  EXPECT_TRUE(state_.Tick().empty());
  EXPECT_EQ(state_.Abort(id, absl::CancelledError("operator")).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(state_.FinishCommit(id, absl::InternalError("rename failed")).ok());
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kAborted);
  EXPECT_THAT(state_.FindOperation(id)->status.message(), HasSubstr("commit failed: rename"));
}

TEST_F(JobStateTest, ExecutionDeadlineNamesRanksWithoutResult) {
  std::string id = Executing();
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus()).ok());
  clock_.Advance(absl::Seconds(100));
  EXPECT_THAT(state_.Tick(), ::testing::ElementsAre(id));
  const Operation* op = state_.FindOperation(id);
  EXPECT_EQ(op->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 0 (host node0"));
  EXPECT_THAT(op->status.message(), Not(HasSubstr("rank 1")));
}

TEST_F(JobStateTest, OperatorRequestIsPendingUntilEachRankJoins) {
  EXPECT_EQ(state_.RequestOperation("gpt", OperationKind::kSave, "/x", absl::ZeroDuration())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());
  auto id = state_.RequestOperation("gpt", OperationKind::kLoad, "/x", absl::Seconds(30));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(state_.RequestOperation("gpt", OperationKind::kSave, "/y", absl::ZeroDuration())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  const Operation* pending = state_.PendingForRank("gpt", 0);
  ASSERT_NE(pending, nullptr);
  EXPECT_EQ(pending->kind, OperationKind::kLoad);
  EXPECT_EQ(pending->requested_by, "operator");
  JoinRequest r = Join(0, 2, OperationKind::kLoad, "/x");
  r.operation_id = *id;
  ASSERT_TRUE(state_.JoinOperation(r).ok());
  EXPECT_EQ(state_.PendingForRank("gpt", 0), nullptr);
  EXPECT_NE(state_.PendingForRank("gpt", 1), nullptr);
  // The operator's longer arrival deadline applies.
  clock_.Advance(absl::Seconds(29));
  EXPECT_TRUE(state_.Tick().empty());
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(state_.Tick().size(), 1u);
}

TEST_F(JobStateTest, ATrainersShorterArrivalDeadlineAppliesAndALongerOneIsCapped) {
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 0, Loc(0)).ok());
  JoinRequest r = Join(0, 2, OperationKind::kSave, "/x");
  r.arrival_deadline = absl::Seconds(3);
  ASSERT_TRUE(state_.JoinOperation(r).ok());
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(state_.Tick().empty());
  clock_.Advance(absl::Seconds(1));
  ASSERT_EQ(state_.Tick().size(), 1u);  // rank 1 never came: aborted at the trainer's 3 s

  JoinRequest longer = Join(0, 2, OperationKind::kSave, "/y");
  longer.arrival_deadline = absl::Hours(1);
  ASSERT_TRUE(state_.JoinOperation(longer).ok());
  clock_.Advance(absl::Seconds(10));  // the coordinator's own deadline (fixture: 10 s)
  EXPECT_EQ(state_.Tick().size(), 1u);
}

TEST_F(JobStateTest, JoiningANamedOperationThatEndedFails) {
  std::string id = Executing(OperationKind::kLoad);
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus()).ok());
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus()).ok());
  JoinRequest r = Join(0, 2, OperationKind::kLoad);
  r.operation_id = id;
  EXPECT_EQ(state_.JoinOperation(r).status().code(), absl::StatusCode::kFailedPrecondition);
  r.operation_id = "op-999";
  EXPECT_EQ(state_.JoinOperation(r).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStateTest, AfterAnAbortAJoinStartsAFreshOperation) {
  auto a = state_.JoinOperation(Join(0));
  ASSERT_TRUE(a.ok());
  std::string first = (*a)->id;
  clock_.Advance(absl::Seconds(10));
  ASSERT_EQ(state_.Tick().size(), 1u);
  auto b = state_.JoinOperation(Join(1));
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)->id, first);
  EXPECT_EQ((*b)->phase, Phase::kGathering);
  EXPECT_EQ((*b)->JoinedRanks(), 1);
}

TEST_F(JobStateTest, TwoJobsRunIndependently) {
  auto a = state_.JoinOperation(Join(0, 1));
  JoinRequest b_req = Join(0, 1, OperationKind::kLoad, "/other");
  b_req.job = "bert";
  auto b = state_.JoinOperation(b_req);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->id, (*b)->id);
  EXPECT_EQ((*a)->phase, Phase::kPlanning);
  EXPECT_EQ((*b)->phase, Phase::kPlanning);
  ASSERT_TRUE(state_.Abort((*a)->id, absl::CancelledError("operator cancelled")).ok());
  EXPECT_EQ(state_.FindOperation((*b)->id)->phase, Phase::kPlanning);
  EXPECT_EQ(state_.Jobs().size(), 2u);
}

TEST_F(JobStateTest, OnlyRecentFinishedOperationsAreKept) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto a = state_.JoinOperation(Join(0, 1));
    ASSERT_TRUE(a.ok());
    ids.push_back((*a)->id);
    ASSERT_TRUE(state_.Abort(ids.back(), absl::CancelledError("x")).ok());
  }
  EXPECT_EQ(state_.FindOperation(ids[0]), nullptr);
  EXPECT_EQ(state_.FindOperation(ids[1]), nullptr);
  EXPECT_NE(state_.FindOperation(ids[2]), nullptr);
  EXPECT_EQ(state_.Operations().size(), 3u);
}

TEST_F(JobStateTest, VersionChangesOnEveryTransition) {
  uint64_t v0 = state_.version();
  ASSERT_TRUE(state_.JoinOperation(Join(0)).ok());
  uint64_t v1 = state_.version();
  uint64_t p1 = state_.phase_version();
  EXPECT_GT(v1, v0);
  ASSERT_TRUE(state_.AttachRank("gpt", 2, 1, Loc(1)).ok());
  EXPECT_GT(state_.version(), v1);
  EXPECT_EQ(state_.phase_version(), p1);  // no phase changed
  clock_.Advance(absl::Seconds(11));
  state_.Tick();
  EXPECT_GT(state_.version(), v1);
  EXPECT_GT(state_.phase_version(), p1);
}

}  // namespace
}  // namespace ckpt::coordinator

namespace ckpt::coordinator {
namespace {

class StartReshardTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  JobState state_{&clock_, JobStateOptions()};
  ReshardSpec Spec() {
    ReshardSpec s;
    s.source = "/ckpt/src";
    s.layout_json = "{}";
    return s;
  }
};

TEST_F(StartReshardTest, SkipsGatheringAndPlansAtOnce) {
  auto id = state_.StartReshard("/ckpt/dst", Spec(), {Loc(0), Loc(1), Loc(0)});
  ASSERT_TRUE(id.ok()) << id.status();
  const Operation* op = state_.FindOperation(*id);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->kind, OperationKind::kReshard);
  EXPECT_EQ(op->phase, Phase::kPlanning);
  EXPECT_EQ(op->job, "reshard:/ckpt/dst");
  EXPECT_EQ(op->world_size, 3);
  EXPECT_EQ(op->JoinedRanks(), 3);
  EXPECT_EQ(op->ranks[2].location.worker_id, "w-0");
  EXPECT_EQ(op->reshard.source, "/ckpt/src");
  // Executes and commits like a save.
  ASSERT_TRUE(state_.SetPlan(*id, {{"a", 1}, {"b", 1}, {"c", 1}}).ok());
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(state_.ReportResult(*id, r, absl::OkStatus()).ok());
  EXPECT_EQ(state_.FindOperation(*id)->phase, Phase::kCommitting);
}

TEST_F(StartReshardTest, OneReshardPerDestinationAtATime) {
  auto first = state_.StartReshard("/ckpt/dst", Spec(), {Loc(0)});
  ASSERT_TRUE(first.ok());
  auto second = state_.StartReshard("/ckpt/dst", Spec(), {Loc(0), Loc(1)});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("already in flight"));
  // Another destination is independent; after the first ends, the destination is free again
  // (with another world size).
  EXPECT_TRUE(state_.StartReshard("/ckpt/other", Spec(), {Loc(1)}).ok());
  ASSERT_TRUE(state_.Abort(*first, absl::CancelledError("operator")).ok());
  EXPECT_TRUE(state_.StartReshard("/ckpt/dst", Spec(), {Loc(0), Loc(1)}).ok());
}

TEST_F(StartReshardTest, AnEndedReshardLeavesNoRanksBehind) {
  auto id = state_.StartReshard("/ckpt/dst", Spec(), {Loc(0), Loc(1), Loc(0)});
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(state_.FindJob("reshard:/ckpt/dst")->ranks.size(), 3u);
  ASSERT_TRUE(state_.Abort(*id, absl::InvalidArgumentError("planner refused")).ok());
  EXPECT_TRUE(state_.FindJob("reshard:/ckpt/dst")->ranks.empty());
  EXPECT_EQ(state_.FindOperation(*id)->ranks[1].location.worker_id, "w-1");  // still reported
}

TEST_F(StartReshardTest, RejectsEmptyRequests) {
  EXPECT_EQ(state_.StartReshard("", Spec(), {Loc(0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ReshardSpec no_source = Spec();
  no_source.source.clear();
  EXPECT_EQ(state_.StartReshard("/d", no_source, {Loc(0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.StartReshard("/d", Spec(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.StartReshard("/d", Spec(), {RankLocation{}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StartReshardTest, LostWorkerAbortsNamingItsRanks) {
  auto id = state_.StartReshard("/ckpt/dst", Spec(), {Loc(0), Loc(1)});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(state_.SetPlan(*id, {{"a", 1}, {"b", 1}}).ok());
  std::vector<std::string> aborted = state_.WorkerLost("w-1", "missed its lease");
  ASSERT_EQ(aborted, std::vector<std::string>{*id});
  const Operation* op = state_.FindOperation(*id);
  EXPECT_EQ(op->phase, Phase::kAborted);
  EXPECT_THAT(op->status.message(), HasSubstr("rank 1"));
  EXPECT_THAT(op->status.message(), HasSubstr("missed its lease"));
}

}  // namespace
}  // namespace ckpt::coordinator

namespace ckpt::coordinator {
namespace {

TEST_F(JobStateTest, LendGatheredMovesThePiecesOutWithoutCopyingAndReturnLentPutsThemBack) {
  const std::string id = Gathered();
  const SharedPieceList* gathered = state_.FindOperation(id)->ranks[1].shards.list();
  absl::StatusOr<Operation> lent = state_.LendGathered(id);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(lent->ranks[1].shards.list(), gathered);  // the same pieces, moved
  EXPECT_EQ(lent->ranks[1].shards[0].tensor().key(), "w1");
  EXPECT_EQ(lent->phase, Phase::kPlanning);
  EXPECT_TRUE(state_.FindOperation(id)->ranks[1].shards.empty());
  EXPECT_TRUE(state_.FindOperation(id)->ranks[1].joined);  // only the bulky data left
  state_.ReturnLent(id, *std::move(lent));
  EXPECT_EQ(state_.FindOperation(id)->ranks[1].shards.list(), gathered);
  EXPECT_EQ(state_.LendGathered("op-999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStateTest, CopyWithoutRanksCopiesTheOperationAndLeavesItsRanksInPlace) {
  const std::string id = Gathered();
  const Operation* op = state_.FindOperation(id);
  const SharedPieceList* gathered = op->ranks[1].shards.list();
  absl::StatusOr<Operation> header = state_.CopyWithoutRanks(id);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->id, id);
  EXPECT_EQ(header->path, op->path);
  EXPECT_EQ(header->world_size, op->world_size);
  EXPECT_EQ(header->phase, Phase::kPlanning);
  EXPECT_TRUE(header->ranks.empty());
  ASSERT_EQ(static_cast<int>(op->ranks.size()), op->world_size);
  EXPECT_EQ(op->ranks[1].shards.list(), gathered);
  EXPECT_EQ(state_.CopyWithoutRanks("op-999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStateTest, RanksDescribingTheSamePiecesShareOneListAndKeepTheirOwnReplicaIds) {
  auto join = [&](int rank, int64_t replica) {
    JoinRequest r = Join(rank, 4);
    r.shards[0].mutable_tensor()->set_key("w");      // every rank: the same piece ...
    r.shards[0].add_replica_id(replica);             // ... as its own replica
    if (rank == 3) r.pieces = RankPieces(r.shards);  // split by the caller, interned by Join
    return state_.JoinOperation(std::move(r));
  };
  std::string id;
  for (int rank = 0; rank < 4; ++rank) {
    absl::StatusOr<const Operation*> joined = join(rank, rank);
    ASSERT_TRUE(joined.ok()) << joined.status();
    id = (*joined)->id;
  }
  const Operation* op = state_.FindOperation(id);
  ASSERT_NE(op, nullptr);
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(op->ranks[rank].shards.list(), op->ranks[0].shards.list()) << rank;
    EXPECT_EQ(op->ranks[rank].shards.Piece(0).replica_id(0), rank);
  }
  EXPECT_TRUE(op->ranks[0].shards.is_main_replica(0));
  EXPECT_FALSE(op->ranks[2].shards.is_main_replica(0));
}

TEST_F(JobStateTest, LendingKeepsThePlanPartsWithTheOperation) {
  const std::string id = Executing();
  absl::StatusOr<Operation> lent = state_.LendGathered(id);
  ASSERT_TRUE(lent.ok());
  EXPECT_TRUE(lent->ranks[0].plan_part.empty());
  EXPECT_EQ(state_.FindOperation(id)->ranks[0].plan_part, "part0");
  EXPECT_EQ(lent->ranks[0].shards.size(), 1);
  state_.ReturnLent(id, *std::move(lent));
  EXPECT_EQ(state_.FindOperation(id)->ranks[0].shards.size(), 1);
}

}  // namespace
}  // namespace ckpt::coordinator

namespace ckpt::coordinator {
namespace {

// The brute-force twin of Operation::Totals: sums over every rank's entry.
void ExpectTotalsMatchRanks(const Operation& op) {
  int joined = 0, reported = 0;
  int64_t done = 0, total = 0, read = 0;
  for (const RankEntry& e : op.ranks) {
    joined += e.joined;
    reported += e.result.has_value();
    done += e.bytes_done;
    total += e.bytes_total;
    read += e.bytes_read;
  }
  EXPECT_EQ(op.JoinedRanks(), joined);
  EXPECT_EQ(op.ReportedRanks(), reported);
  EXPECT_EQ(op.BytesDone(), done);
  EXPECT_EQ(op.BytesTotal(), total);
  EXPECT_EQ(op.BytesRead(), read);
}

TEST_F(JobStateTest, RunningTotalsEqualSumsOverRanksThroughAWholeOperation) {
  constexpr int kWorld = 5;
  std::string id;
  for (int r : {3, 0, 3, 4, 1, 2}) {  // rank 3 joins twice (an idempotent retry)
    auto op = state_.JoinOperation(Join(r, kWorld, OperationKind::kLoad));
    ASSERT_TRUE(op.ok()) << op.status();
    id = (*op)->id;
    ExpectTotalsMatchRanks(**op);
  }
  std::vector<RankPlan> plans;
  for (int r = 0; r < kWorld; ++r) plans.push_back({"p", 100 * (r + 1)});
  ASSERT_TRUE(state_.SetPlan(id, plans).ok());
  ExpectTotalsMatchRanks(*state_.FindOperation(id));
  const int64_t progress[][2] = {{0, 50}, {0, 20}, {2, 999}, {1, -5}, {4, 499}};
  for (const auto& [rank, bytes] : progress) {
    ASSERT_TRUE(state_.ReportProgress(id, static_cast<int>(rank), bytes).ok());
    ExpectTotalsMatchRanks(*state_.FindOperation(id));
  }
  for (int r : {4, 0, 0, 2, 1, 3}) {  // rank 0 reports twice
    ASSERT_TRUE(state_.ReportResult(id, r, absl::OkStatus(), "", 7 * r).ok());
    ExpectTotalsMatchRanks(*state_.FindOperation(id));
  }
  EXPECT_EQ(state_.FindOperation(id)->phase, Phase::kDone);
  EXPECT_EQ(state_.FindOperation(id)->BytesTotal(), 1500);
}

}  // namespace
}  // namespace ckpt::coordinator

namespace ckpt::coordinator {
namespace {

TEST_F(JobStateTest, AnEndedOperationKeepsNoPiecesRecordsOrPlanPartsButKeepsItsTotals) {
  const std::string id = Executing();
  ASSERT_TRUE(state_.ReportResult(id, 0, absl::OkStatus(), "record0").ok());
  ASSERT_TRUE(state_.ReportResult(id, 1, absl::OkStatus(), "record1").ok());
  ASSERT_EQ(state_.FindOperation(id)->phase, Phase::kCommitting);
  EXPECT_EQ(state_.FindOperation(id)->ranks[1].written, "record1");  // the committer's input
  ASSERT_TRUE(state_.FinishCommit(id, absl::OkStatus()).ok());
  const Operation* op = state_.FindOperation(id);
  ASSERT_EQ(op->phase, Phase::kDone);
  for (const RankEntry& e : op->ranks) {
    EXPECT_TRUE(e.shards.empty());
    EXPECT_TRUE(e.written.empty());
    EXPECT_TRUE(e.plan_part.empty());
  }
  EXPECT_EQ(op->JoinedRanks(), 2);
  EXPECT_EQ(op->BytesTotal(), 400);
  EXPECT_EQ(op->BytesDone(), 400);
  // What it no longer keeps is handed over once, for its caller to destroy without its lock.
  std::vector<std::vector<RankEntry>> released = state_.TakeReleased();
  ASSERT_EQ(released.size(), 1u);
  ASSERT_EQ(released[0].size(), 2u);
  EXPECT_EQ(released[0][1].written, "record1");
  EXPECT_FALSE(released[0][0].shards.empty());
  EXPECT_FALSE(released[0][0].plan_part.empty());
  EXPECT_TRUE(state_.TakeReleased().empty());
}

TEST_F(JobStateTest, PiecesLentToAPlannerAreDroppedWhenTheOperationEndedMeanwhile) {
  const std::string id = Gathered();
  absl::StatusOr<Operation> lent = state_.LendGathered(id);
  ASSERT_TRUE(lent.ok());
  ASSERT_TRUE(state_.Abort(id, absl::CancelledError("operator")).ok());
  state_.ReturnLent(id, *std::move(lent));
  EXPECT_TRUE(state_.FindOperation(id)->ranks[0].shards.empty());
}

}  // namespace
}  // namespace ckpt::coordinator
