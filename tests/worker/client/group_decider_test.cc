// GroupDecider over an in-memory broadcast: every rank gets the leader's decision, byte
// for byte, including the leader's failures; non-leaders never ask for decisions.
#include "worker/client/group_decider.h"

#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/status_matchers.h"
#include "worker/client/gate_client.h"
#include "worker/client/in_memory_broadcast.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<GateClient> LocalClient(int rank = 0, int size = 4) {
  GateClientOptions o;
  o.job_id = "j";
  o.incarnation = "test-launch";
  o.rank_in_group = rank;
  o.group_size = size;
  auto c = GateClient::Create(o);
  EXPECT_THAT(c.status(), IsOk());
  return std::move(*c);
}

TEST(DecisionWireTest, RoundTripsAndRejectsGarbage) {
  GateDecision d{.step = 77,
                 .mode = Mode::kTensorParallelOnly,
                 .reason = Reason::kControllerUnavailable,
                 .policy_reason = Reason::kLengthCv,
                 .source = DecisionSource::kFallback,
                 .config_version = 9};
  auto back = FromWire(ToWire(d));
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(*back, d);
  DecisionWire junk;
  junk.mode = 7;
  EXPECT_THAT(FromWire(junk), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("not a decision")));
  // Every rank learns that the leader's memory gate overrode the daemon.
  GateDecision overridden{.step = 78,
                          .mode = Mode::kSequenceParallel,
                          .reason = Reason::kMemoryRequiresSp,
                          .policy_reason = Reason::kMemoryRequiresSp,
                          .source = DecisionSource::kMemoryOverride,
                          .config_version = 9};
  auto back2 = FromWire(ToWire(overridden));
  ASSERT_THAT(back2.status(), IsOk());
  EXPECT_EQ(*back2, overridden);
  DecisionWire unknown_source = ToWire(overridden);
  unknown_source.source = 5;
  EXPECT_THAT(FromWire(unknown_source), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 HasSubstr("source 5")));
}

TEST(GroupDeciderTest, CreateChecksTheLeaderHasAClient) {
  InMemoryBroadcast group(2);
  EXPECT_THAT(GroupDecider::Create(nullptr, 0, group.ForRank(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a GateClient")));
  auto follower_client = LocalClient(/*rank=*/1);
  EXPECT_THAT(GroupDecider::Create(follower_client.get(), 0, group.ForRank(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("created for rank 1")));
  EXPECT_THAT(GroupDecider::Create(nullptr, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("broadcast")));
  EXPECT_THAT(GroupDecider::Create(nullptr, 1, group.ForRank(1)).status(), IsOk());
}

TEST(GroupDeciderTest, NonLeadersNeverAskForDecisions) {
  auto follower = LocalClient(/*rank=*/2);
  const int64_t lengths[] = {100, 200};
  EXPECT_THAT(follower->SubmitPlan({.step = 1, .lengths = lengths}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only the group leader")));
  EXPECT_THAT(follower->AwaitDecision(1), StatusIs(absl::StatusCode::kFailedPrecondition));
  InMemoryBroadcast group(3);
  auto d = GroupDecider::Create(follower.get(), 2, group.ForRank(2));
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_THAT((*d)->SubmitPlan({.step = 1, .lengths = lengths}), IsOk());  // a no-op
  EXPECT_EQ(follower->stats().plans_submitted, 0);
}

// Ranks are threads; random delays before each call shuffle who arrives first.
TEST(GroupDeciderTest, EveryRankGetsTheLeadersDecision) {
  constexpr int kRanks = 4;
  constexpr int kSteps = 2000;
  auto leader_client = LocalClient();
  InMemoryBroadcast group(kRanks);
  std::vector<std::vector<GateDecision>> seen(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto decider = GroupDecider::Create(rank == 0 ? leader_client.get() : nullptr, rank,
                                          group.ForRank(rank));
      ASSERT_THAT(decider.status(), IsOk());
      std::mt19937 rng(rank);
      std::vector<int64_t> lengths;
      for (int64_t step = 0; step < kSteps; ++step) {
        // Alternate uniform and mixed batches so both modes appear.
        lengths = step % 3 == 0 ? std::vector<int64_t>{512, 8192, 1024, 4096}
                                : std::vector<int64_t>{4096, 4000, 4100, 4050};
        ASSERT_THAT((*decider)->SubmitPlan({.step = step, .lengths = lengths}), IsOk());
        if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        auto d = (*decider)->Decide(step);
        ASSERT_THAT(d.status(), IsOk());
        seen[rank].push_back(*d);
      }
    });
  }
  for (auto& t : threads) t.join();
  int sp = 0, tp = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int rank = 1; rank < kRanks; ++rank) {
      ASSERT_EQ(seen[rank][step], seen[0][step]) << "rank " << rank << " step " << step;
    }
    EXPECT_EQ(seen[0][step].source, DecisionSource::kLocalOnly);
    (seen[0][step].mode == Mode::kSequenceParallel ? sp : tp)++;
  }
  EXPECT_GT(sp, 0);
  EXPECT_GT(tp, 0);
  EXPECT_EQ(leader_client->stats().local_decisions, kSteps);
}

// A leader that cannot decide (no plan for the step) must not leave its peers blocked in
// the broadcast: every rank returns the same error.
TEST(GroupDeciderTest, LeaderFailureReachesEveryRank) {
  constexpr int kRanks = 3;
  auto leader_client = LocalClient(0, kRanks);
  InMemoryBroadcast group(kRanks, absl::Seconds(10));
  std::vector<absl::Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto decider = GroupDecider::Create(rank == 0 ? leader_client.get() : nullptr, rank,
                                          group.ForRank(rank));
      ASSERT_THAT(decider.status(), IsOk());
      results[rank] = (*decider)->Decide(5).status();  // nobody submitted a plan for 5
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kFailedPrecondition,
                                   HasSubstr("no plan was submitted for step 5")));
  for (int rank = 1; rank < kRanks; ++rank) {
    EXPECT_THAT(results[rank], StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("leader could not decide step 5")));
  }
}

TEST(GroupDeciderTest, RanksOutOfStepAreReported) {
  auto leader_client = LocalClient(0, 2);
  InMemoryBroadcast group(2);
  auto leader = GroupDecider::Create(leader_client.get(), 0, group.ForRank(0));
  auto follower = GroupDecider::Create(nullptr, 1, group.ForRank(1));
  const int64_t lengths[] = {1000};
  ASSERT_THAT((*leader)->SubmitPlan({.step = 3, .lengths = lengths}), IsOk());
  ASSERT_THAT((*leader)->Decide(3).status(), IsOk());
  EXPECT_THAT((*follower)->Decide(4), StatusIs(absl::StatusCode::kInternal,
                                               HasSubstr("out of step")));
}

TEST(InMemoryBroadcastTest, ReceiverTimesOutWithoutARoot) {
  InMemoryBroadcast group(2, absl::Milliseconds(20));
  DecisionWire w;
  EXPECT_THAT(group.Broadcast(1, w, 0), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(GateClientLocalTest, StepsMustIncreaseAndDecisionsAreCommitted) {
  auto c = LocalClient(0, 1);
  const int64_t lengths[] = {1000, 1000};
  ASSERT_THAT(c->SubmitPlan({.step = 10, .lengths = lengths}), IsOk());
  EXPECT_THAT(c->SubmitPlan({.step = 10, .lengths = lengths}),
              StatusIs(absl::StatusCode::kAlreadyExists));
  auto first = c->AwaitDecision(10);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->source, DecisionSource::kLocalOnly);
  EXPECT_EQ(first->reason, Reason::kGatesPassed);
  auto again = c->AwaitDecision(10);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(*again, *first);
  EXPECT_THAT(c->SubmitPlan({.step = 9, .lengths = lengths}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already decided")));
  EXPECT_THAT(c->AwaitDecision(9), StatusIs(absl::StatusCode::kFailedPrecondition));
  const int64_t bad[] = {0};
  EXPECT_THAT(c->SubmitPlan({.step = 11, .lengths = bad}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lengths[0]")));
  EXPECT_THAT(c->ReportTelemetry({.step = 1, .step_time_s = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step_time_s")));
}

TEST(GateClientLocalTest, OptionsAreValidated) {
  GateClientOptions o;
  o.controller = "127.0.0.1:1";
  EXPECT_THAT(GateClient::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("job_id")));
  o.job_id = "j";
  o.incarnation = "test-launch";
  EXPECT_THAT(GateClient::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("launch_credential must be set")));
  o.launch_credential = "0123456789abcdef0123456789abcdef";
  o.rank_in_group = 4;
  o.group_size = 4;
  EXPECT_THAT(GateClient::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("rank_in_group")));
  o.rank_in_group = 0;
  o.initial_config.window_steps = 0;
  EXPECT_THAT(GateClient::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("window_steps")));
}

}  // namespace
}  // namespace spgate::client
