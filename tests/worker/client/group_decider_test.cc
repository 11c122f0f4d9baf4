// GroupDecider over an in-memory broadcast: every rank gets the leader's decision, byte
// for byte, including the leader's failures; non-leaders never ask for decisions.
#include "worker/client/group_decider.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <string>
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

// A leader of another client build (its telemetry payload another size; a build from
// before the size was sent says 0) is refused on the follower, which would otherwise
// reduce a different count of doubles than the leader in every step's telemetry.
TEST(GroupDeciderTest, AFollowerRefusesALeaderOfAnotherBuild) {
  for (const uint8_t slots : {uint8_t{0}, uint8_t{14}, uint8_t{TelemetryWire::kSlots}}) {
    SCOPED_TRACE(static_cast<int>(slots));
    // The leader's verdict as the broadcast delivers it: OK, a group of 2, a max-reduce.
    BroadcastFn leader_said = [slots](std::span<uint8_t> bytes, int root) {
      EXPECT_EQ(root, 0);
      std::fill(bytes.begin(), bytes.end(), 0);
      const int32_t group_size = 2;
      std::memcpy(bytes.data() + 4, &group_size, sizeof(group_size));
      bytes[8] = 1;      // has_reduce
      bytes[9] = slots;  // telemetry_slots
      return absl::OkStatus();
    };
    MaxReduceFn reduce = [](std::span<double>, int) { return absl::OkStatus(); };
    absl::Status got = GroupDecider::Create(nullptr, 1, leader_said, reduce).status();
    if (slots == TelemetryWire::kSlots) {
      EXPECT_THAT(got, IsOk());
    } else {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("another spgate client build")));
    }
  }
}

// This rank's own checks (CreateLocal makes no collective; Create makes them first).
TEST(GroupDeciderTest, CreateChecksTheLeaderHasAClient) {
  InMemoryBroadcast group(2);
  EXPECT_THAT(GroupDecider::CreateLocal(nullptr, 0, group.ForRank(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a GateClient")));
  auto follower_client = LocalClient(/*rank=*/1);
  EXPECT_THAT(GroupDecider::CreateLocal(follower_client.get(), 0, group.ForRank(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("created for rank 1")));
  EXPECT_THAT(GroupDecider::CreateLocal(nullptr, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("broadcast")));
  EXPECT_THAT(GroupDecider::Create(nullptr, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("broadcast")));
  EXPECT_THAT(GroupDecider::CreateLocal(nullptr, 1, group.ForRank(1)).status(), IsOk());
}

// Creation is collective: the leader broadcasts its outcome, so a refusal on the leader
// fails every rank with the leader's error, and a follower whose rank or max-reduce
// disagrees with the leader's fails, each within the broadcast (the transport's timeout
// here is 20 s: no rank waits for it). Ranks are threads.
TEST(GroupDeciderTest, CreationFailsOnEveryRankWhenTheLeaderRefuses) {
  constexpr int kRanks = 4;
  auto leader_client = LocalClient(0, kRanks);
  struct Case {
    const char* name;
    bool leader_client;
    int reduce_missing_on;  // -1: every rank has the max-reduce
    int bad_rank_on;        // -1: every rank its own; else that rank claims kRanks
    std::vector<absl::StatusCode> want;
    std::vector<std::string> message;
  };
  const absl::StatusCode kOk = absl::StatusCode::kOk;
  const absl::StatusCode kBad = absl::StatusCode::kInvalidArgument;
  const Case cases[] = {
      {"every rank agrees", true, -1, -1, {kOk, kOk, kOk, kOk}, {"", "", "", ""}},
      {"the leader refuses", false, -1, -1, {kBad, kBad, kBad, kBad},
       {"needs a GateClient", "leader refused its GroupDecider: the group leader (rank 0) needs",
        "leader refused", "leader refused"}},
      {"a follower without the leader's max-reduce", true, 2, -1, {kOk, kOk, kBad, kOk},
       {"", "", "every rank of a group passes one, or none", ""}},
      {"a follower outside the leader's group", true, -1, 3, {kOk, kOk, kOk, kBad},
       {"", "", "", "the leader's group has 4 ranks"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    InMemoryBroadcast group(kRanks, absl::Seconds(20));
    std::vector<absl::Status> got(kRanks);
    std::vector<absl::Duration> took(kRanks);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kRanks; ++rank) {
      threads.emplace_back([&, rank] {
        const absl::Time start = absl::Now();
        GateClient* client = rank == 0 && c.leader_client ? leader_client.get() : nullptr;
        const int claimed = rank == c.bad_rank_on ? kRanks : rank;
        got[rank] = GroupDecider::Create(client, claimed, group.ForRank(rank),
                                         rank == c.reduce_missing_on ? MaxReduceFn{}
                                                                     : group.ReduceForRank(rank))
                        .status();
        took[rank] = absl::Now() - start;
      });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < kRanks; ++rank) {
      SCOPED_TRACE(rank);
      EXPECT_EQ(got[rank].code(), c.want[rank]) << got[rank];
      EXPECT_THAT(std::string(got[rank].message()), HasSubstr(c.message[rank]));
      EXPECT_LT(took[rank], absl::Seconds(5)) << "no rank waits for the transport's timeout";
    }
  }
}

TEST(GroupDeciderTest, NonLeadersNeverAskForDecisions) {
  auto follower = LocalClient(/*rank=*/2);
  const int64_t lengths[] = {100, 200};
  EXPECT_THAT(follower->SubmitPlan({.step = 1, .lengths = lengths}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only the group leader")));
  EXPECT_THAT(follower->AwaitDecision(1), StatusIs(absl::StatusCode::kFailedPrecondition));
  InMemoryBroadcast group(3);
  auto d = GroupDecider::CreateLocal(follower.get(), 2, group.ForRank(2));
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

// The in-group reduction: the element-wise max of the ranks' payloads is the group's
// record, with the slowest and the peak-memory ranks, each share the largest rank's.
// Step plans: every rank gets the leader's micro-batch decisions, in the decision's one
// broadcast; a count out of range is refused on every rank before any broadcast.
TEST(GroupDeciderTest, EveryRankGetsTheLeadersMicrobatchDecisions) {
  constexpr int kRanks = 3;
  constexpr int kMicrobatches = 4;
  GateClientOptions o;
  o.group_size = kRanks;
  o.layout = JobLayout{.tp = kRanks, .pp = 2, .microbatches = kMicrobatches};
  o.initial_config.max_length_cv = 0.5;
  auto leader_client = GateClient::Create(o);
  ASSERT_THAT(leader_client.status(), IsOk());
  InMemoryBroadcast group(kRanks);
  std::vector<std::vector<GateDecision>> seen(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto decider = GroupDecider::Create(rank == 0 ? leader_client->get() : nullptr, rank,
                                          group.ForRank(rank));
      ASSERT_THAT(decider.status(), IsOk());
      const std::vector<int64_t> uniform = {4096, 4000}, mixed = {100, 100, 8000};
      for (int64_t step = 0; step < 200; ++step) {
        std::vector<MicrobatchPlanInput> mbs;
        for (int id = 0; id < kMicrobatches; ++id) {
          mbs.push_back({.id = id, .lengths = (step + id) % 3 == 0 ? mixed : uniform});
        }
        ASSERT_THAT((*decider)->SubmitPlan({.step = step, .microbatches = mbs}), IsOk());
        auto d = (*decider)->Decide(step, kMicrobatches);
        ASSERT_THAT(d.status(), IsOk());
        seen[rank].push_back(*d);
      }
    });
  }
  for (auto& t : threads) t.join();
  int tp = 0;
  for (size_t step = 0; step < seen[0].size(); ++step) {
    ASSERT_EQ(seen[0][step].microbatches.size(), static_cast<size_t>(kMicrobatches));
    for (int rank = 1; rank < kRanks; ++rank) {
      ASSERT_EQ(seen[rank][step].microbatches, seen[0][step].microbatches) << "step " << step;
      ASSERT_EQ(seen[rank][step].source, seen[0][step].source);
    }
    for (const Decision& m : seen[0][step].microbatches) tp += m.mode == Mode::kTensorParallelOnly;
  }
  EXPECT_GT(tp, 0);
  EXPECT_LT(tp, 200 * kMicrobatches);

  // A follower alone: any broadcast would wait for the leader (60 s), so these return
  // before one.
  auto lone = GroupDecider::CreateLocal(nullptr, 1, group.ForRank(1));
  ASSERT_THAT(lone.status(), IsOk());
  EXPECT_THAT((*lone)->Decide(0, kMaxMicrobatches + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("microbatches")));
  EXPECT_THAT((*lone)->Decide(0, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got -1")));
}

// A step planned with micro-batches but decided as a plain plan (count 0): the leader's
// answer lists micro-batches the others' broadcast cannot carry, so every rank fails the
// step alike instead of the leader running micro-batch modes its group did not get.
TEST(GroupDeciderTest, ACountThatDisagreesWithThePlanFailsEveryRank) {
  constexpr int kRanks = 2;
  GateClientOptions o;
  o.group_size = kRanks;
  o.layout = JobLayout{.tp = kRanks, .pp = 2, .microbatches = 2};
  auto leader_client = GateClient::Create(o);
  ASSERT_THAT(leader_client.status(), IsOk());
  InMemoryBroadcast group(kRanks);
  std::vector<absl::Status> got(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto decider = GroupDecider::Create(rank == 0 ? leader_client->get() : nullptr, rank,
                                          group.ForRank(rank));
      ASSERT_THAT(decider.status(), IsOk());
      const std::vector<int64_t> lengths = {512, 512};
      std::vector<MicrobatchPlanInput> mbs = {{.id = 0, .lengths = lengths},
                                              {.id = 1, .lengths = lengths}};
      ASSERT_THAT((*decider)->SubmitPlan({.step = 0, .microbatches = mbs}), IsOk());
      got[rank] = (*decider)->Decide(0, 0).status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("decided for 2 micro-batches, not 0")));
  EXPECT_THAT(got[1], StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("the group leader could not decide step 0 "
                                         "(FAILED_PRECONDITION there: the leader's own error "
                                         "says why")));
}

TEST(TelemetryWireTest, MicrobatchSlotsReduceToTheGroupsRecords) {
  const std::vector<MicrobatchTelemetryValues> a{
      {.id = 1, .mode = Mode::kTensorParallelOnly, .forward_s = 0.5, .backward_s = 1,
       .rs_wait_s = 0, .all_gather_s = 0.25, .effective_tokens = 7},
      {.id = 0, .forward_s = 0.1, .backward_s = 0.2, .rs_wait_s = 0.05, .effective_tokens = 9}};
  std::vector<MicrobatchTelemetryValues> b = a;
  b[0].forward_s = 0.75;  // rank b is slower on micro-batch 1's forward
  b[1].rs_wait_s = 0.07;  // and waits longer in micro-batch 0's reduce-scatters
  std::vector<double> sa(2 * kMicrobatchTelemetrySlots), sb(sa.size());
  PackMicrobatchTelemetry(a, sa);
  PackMicrobatchTelemetry(b, sb);
  for (size_t i = 0; i < sa.size(); ++i) sa[i] = std::max(sa[i], sb[i]);
  auto group = MicrobatchesFromReduced(sa, 2, 5);
  ASSERT_THAT(group.status(), IsOk());
  ASSERT_EQ(group->size(), 2u);
  EXPECT_EQ((*group)[0], (MicrobatchTelemetryValues{.id = 0, .forward_s = 0.1, .backward_s = 0.2,
                                                    .rs_wait_s = 0.07, .effective_tokens = 9}));
  EXPECT_EQ((*group)[1], (MicrobatchTelemetryValues{.id = 1, .mode = Mode::kTensorParallelOnly,
                                                    .forward_s = 0.75, .backward_s = 1,
                                                    .all_gather_s = 0.25, .effective_tokens = 7}));
  // Ranks that ran micro-batch 0 in different modes.
  b[1].mode = Mode::kTensorParallelOnly;
  PackMicrobatchTelemetry(b, sb);
  for (size_t i = 0; i < sa.size(); ++i) sa[i] = std::max(sa[i], sb[i]);
  EXPECT_THAT(MicrobatchesFromReduced(sa, 2, 5),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("step 5: the group's ranks ran "
                                                              "micro-batch 0 in different modes")));
  EXPECT_THAT(MicrobatchesFromReduced(sa, 3, 5), StatusIs(absl::StatusCode::kInvalidArgument));
}

// A step plan's telemetry: every rank's micro-batch records in the one reduction; a rank
// without them, or ranks that disagree on a micro-batch's mode, send nothing and nobody
// is left waiting.
TEST(GroupDeciderTest, StepPlanTelemetryCarriesEveryMicrobatch) {
  constexpr int kRanks = 2;
  constexpr int kMicrobatches = 3;
  GateClientOptions o;
  o.group_size = kRanks;
  o.layout = JobLayout{.tp = kRanks, .pp = 2, .microbatches = kMicrobatches};
  auto leader_client = GateClient::Create(o);
  ASSERT_THAT(leader_client.status(), IsOk());
  InMemoryBroadcast group(kRanks, absl::Seconds(20));
  std::vector<std::vector<absl::Status>> got(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto decider = GroupDecider::Create(rank == 0 ? leader_client->get() : nullptr, rank,
                                          group.ForRank(rank), group.ReduceForRank(rank));
      ASSERT_THAT(decider.status(), IsOk());
      const std::vector<int64_t> lengths = {100, 300};
      for (int64_t step = 0; step < 3; ++step) {
        std::vector<MicrobatchPlanInput> mbs;
        for (int id = 0; id < kMicrobatches; ++id) mbs.push_back({.id = id, .lengths = lengths});
        ASSERT_THAT((*decider)->SubmitPlan({.step = step, .microbatches = mbs}), IsOk());
        auto d = (*decider)->Decide(step, kMicrobatches);
        ASSERT_THAT(d.status(), IsOk());
        StepTelemetryInput t{.step = step, .step_time_s = 1, .effective_tokens = 1200};
        for (int id = 0; id < kMicrobatches; ++id) {
          t.microbatches.push_back({.id = id, .mode = d->microbatches[id].mode,
                                    .forward_s = 0.1 * (rank + 1), .backward_s = 0.2,
                                    .effective_tokens = 400});
        }
        if (step == 1 && rank == 1) {  // ran micro-batch 2 in the other mode
          MicrobatchTelemetryValues& m = t.microbatches[2];
          m.mode = m.mode == Mode::kSequenceParallel ? Mode::kTensorParallelOnly
                                                     : Mode::kSequenceParallel;
        }
        if (step == 2 && rank == 1) t.microbatches.clear();
        got[rank].push_back((*decider)->ReportTelemetry(t));
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(got[0].size(), 3u);
  EXPECT_THAT(got[0][0], IsOk());
  EXPECT_THAT(got[1][0], IsOk());
  EXPECT_THAT(got[0][1], StatusIs(absl::StatusCode::kInternal, HasSubstr("micro-batch 2")));
  EXPECT_THAT(got[1][1], IsOk());
  EXPECT_THAT(got[0][2], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("refused")));
  EXPECT_THAT(got[1][2], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got none")));
  EXPECT_EQ((*leader_client)->stats().telemetry_reported, 1);
}

TEST(TelemetryWireTest, TheMaxOfTheRanksIsTheGroupsRecord) {
  const std::vector<StepTelemetryInput> ranks = {
      {.step = 9, .mode = Mode::kSequenceParallel, .reason = Reason::kGatesPassed,
       .step_time_s = 1.0, .rs_wait_s = 0.30, .all_gather_s = 0.05, .norm_stall_s = 0.01,
       .effective_tokens = 16000, .padding_tokens = 12, .peak_memory_bytes = 80ull << 30},
      {.step = 9, .mode = Mode::kSequenceParallel, .reason = Reason::kGatesPassed,
       .step_time_s = 1.25, .rs_wait_s = 0.25, .all_gather_s = 0.07, .norm_stall_s = 0.05,
       .effective_tokens = 16000, .padding_tokens = 12, .peak_memory_bytes = (80ull << 30) + 7},
      {.step = 9, .mode = Mode::kSequenceParallel, .reason = Reason::kGatesPassed,
       .step_time_s = 1.1, .rs_wait_s = 0.1, .all_gather_s = 0.02, .norm_stall_s = 0,
       .effective_tokens = 16000, .padding_tokens = 12, .peak_memory_bytes = 1}};
  TelemetryWire acc = ToTelemetryWire(ranks[0], 0);
  for (int r = 1; r < 3; ++r) {
    const TelemetryWire w = ToTelemetryWire(ranks[r], r);
    for (int i = 0; i < TelemetryWire::kSlots; ++i) acc.v[i] = std::max(acc.v[i], w.v[i]);
  }
  auto g = GroupTelemetryFromWire(acc, 3);
  ASSERT_THAT(g.status(), IsOk());
  EXPECT_EQ(g->step, 9);
  EXPECT_EQ(g->mode, Mode::kSequenceParallel);
  EXPECT_EQ(g->reason, Reason::kGatesPassed);
  EXPECT_EQ(g->ranks, 3);
  // Rank 1's step is the longest, but rank 2 spent the most of its step outside the
  // collective waits (1.1 - 0.1 - 0.02 = 0.98 s against 0.88 and 0.64): the others
  // waited for it.
  EXPECT_EQ(g->slowest_rank, 2);
  EXPECT_NEAR(g->step_time_s, 1.25, 1e-9) << "the longest step, exactly";
  EXPECT_EQ(g->peak_memory_rank, 1);
  EXPECT_EQ(g->peak_memory_bytes, (80ull << 30) + 7) << "exact below 1 TiB";
  // The daemon's share rs_wait_s / step_time_s is the largest rank's (rank 0: 0.30 / 1.0).
  EXPECT_NEAR(g->rs_wait_s / g->step_time_s, 0.30, 1e-9);
  EXPECT_NEAR(g->norm_stall_s / g->step_time_s, 0.04, 1e-9);
  EXPECT_NEAR(g->all_gather_s, 0.07, 1e-12);
  EXPECT_EQ(g->effective_tokens, 16000);
  EXPECT_EQ(g->padding_tokens, 12);

  // Ranks out of step, ranks that ran different modes, a refused record.
  TelemetryWire skew = acc;
  const TelemetryWire later = ToTelemetryWire({.step = 10, .mode = Mode::kSequenceParallel,
                                               .reason = Reason::kGatesPassed, .step_time_s = 1},
                                              2);
  for (int i = 0; i < TelemetryWire::kSlots; ++i) skew.v[i] = std::max(skew.v[i], later.v[i]);
  EXPECT_THAT(GroupTelemetryFromWire(skew, 3),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("steps 9 to 10")));
  TelemetryWire modes = acc;
  const TelemetryWire tp = ToTelemetryWire({.step = 9, .mode = Mode::kTensorParallelOnly,
                                            .reason = Reason::kGatesPassed, .step_time_s = 1},
                                           2);
  for (int i = 0; i < TelemetryWire::kSlots; ++i) modes.v[i] = std::max(modes.v[i], tp.v[i]);
  EXPECT_THAT(GroupTelemetryFromWire(modes, 3),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("different modes")));
  TelemetryWire refused = acc;
  const TelemetryWire bad = ToTelemetryWire({.step = 9}, 2, /*valid=*/false);
  for (int i = 0; i < TelemetryWire::kSlots; ++i) refused.v[i] = std::max(refused.v[i], bad.v[i]);
  EXPECT_THAT(GroupTelemetryFromWire(refused, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("was refused")));
}

// The ranks' busy times travel in their own slots (each rank's, the others 0), so the
// maximum is every rank's, and the leader takes the group's straggler delays from them:
// the slowest rank's busy time less the median rank's (docs/design.md §2), per step and,
// within kMaxStragglerBusyValues, per micro-batch; TP-only's all-reduce counts as a wait.
TEST(TelemetryWireTest, StragglerSlotsGiveTheGroupsDelays) {
  constexpr int kRanks = 4;
  EXPECT_EQ(StragglerSlots(kRanks, 0), 4u);
  EXPECT_EQ(StragglerSlots(kRanks, 2), 12u);
  EXPECT_EQ(StragglerSlots(8, 512), 8u + 4096u) << "at the bound";
  EXPECT_EQ(StragglerSlots(8, 513), 8u) << "past it: the step's alone";
  // TP-only steps of 1 s; rank 2 busy 1.0 s (no all-reduce wait), the others 0.6 s.
  std::vector<double> reduced(StragglerSlots(kRanks, 2), 0.0);
  for (int rank = 0; rank < kRanks; ++rank) {
    StepTelemetryInput t{.step = 3, .mode = Mode::kTensorParallelOnly, .step_time_s = 1.0,
                         .all_reduce_s = rank == 2 ? 0.0 : 0.4};
    for (int id = 0; id < 2; ++id) {
      t.microbatches.push_back({.id = id, .mode = Mode::kTensorParallelOnly, .forward_s = 0.2,
                                .backward_s = 0.3,
                                .all_reduce_s = id == 1 && rank == 0 ? 0.0 : 0.1});
    }
    std::vector<double> mine(reduced.size(), -1.0);
    PackStragglerSlots(t, rank, kRanks, mine);
    for (size_t i = 0; i < mine.size(); ++i) reduced[i] = std::max(reduced[i], mine[i]);
  }
  StepTelemetryInput group{.microbatches = {{.id = 0}, {.id = 1}}};
  StragglersFromReduced(reduced, kRanks, group);
  EXPECT_NEAR(group.straggler_s, 0.4, 1e-12);
  EXPECT_NEAR(group.microbatches[0].straggler_s, 0.0, 1e-12) << "every rank alike";
  EXPECT_NEAR(group.microbatches[1].straggler_s, 0.1, 1e-12) << "rank 0 waited for none";
  // Past the bound no micro-batch slots were sent: the step's delay is measured, the
  // micro-batches' are left as they were (0 on the wire: not measured).
  std::vector<double> step_only = {0.5, 0.9, 0.5, 0.5};
  StepTelemetryInput big{.microbatches = {{.id = 0, .straggler_s = 0.123}}};
  StragglersFromReduced(step_only, kRanks, big);
  EXPECT_NEAR(big.straggler_s, 0.4, 1e-12);
  EXPECT_EQ(big.microbatches[0].straggler_s, 0.123);
}

// A rank that reduces must know the group's size (its slot among the busy times): the
// client's, or the one CreateLocal is given.
TEST(GroupDeciderTest, CreateLocalNeedsTheGroupsSizeToReduce) {
  InMemoryBroadcast group(4, absl::Seconds(1));
  EXPECT_THAT(GroupDecider::CreateLocal(nullptr, 2, group.ForRank(2), group.ReduceForRank(2)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("group_size: a rank that reduces the group's telemetry needs "
                                 "the group's size, in [rank_in_group + 1, 4096] (here 3")));
  EXPECT_THAT(
      GroupDecider::CreateLocal(nullptr, 2, group.ForRank(2), group.ReduceForRank(2), 2),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 2")));
  EXPECT_THAT(
      GroupDecider::CreateLocal(nullptr, 2, group.ForRank(2), group.ReduceForRank(2), 4)
          .status(),
      IsOk());
  EXPECT_THAT(GroupDecider::CreateLocal(nullptr, 2, group.ForRank(2)).status(), IsOk())
      << "no reduction: no size needed";
  auto client = LocalClient(0, 4);
  EXPECT_THAT(GroupDecider::CreateLocal(client.get(), 0, group.ForRank(0),
                                        group.ReduceForRank(0), 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("group_size: 8, but the client's group_size is 4")));
  EXPECT_THAT(GroupDecider::CreateLocal(client.get(), 0, group.ForRank(0),
                                        group.ReduceForRank(0), 4)
                  .status(),
              IsOk());
}

// Ranks are threads. The leader's (local-only) client gets one record a step for the group,
// and its fallback the group's wait share; a rank's bad record fails that rank and the
// leader, nobody waits forever, and the next step goes on.
TEST(GroupDeciderTest, ReportTelemetryReducesIntoOneRecordAStep) {
  constexpr int kRanks = 4;
  constexpr int kSteps = 200;
  auto leader_client = LocalClient(0, kRanks);
  InMemoryBroadcast group(kRanks, absl::Seconds(20));
  std::vector<absl::Status> bad_step(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto decider = GroupDecider::Create(rank == 0 ? leader_client.get() : nullptr, rank,
                                          group.ForRank(rank), group.ReduceForRank(rank));
      ASSERT_THAT(decider.status(), IsOk());
      std::mt19937 rng(rank);
      for (int64_t step = 0; step < kSteps; ++step) {
        if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        StepTelemetryInput t{.step = step, .step_time_s = 1.0 + 0.01 * rank,
                             .rs_wait_s = 0.1, .effective_tokens = 100};
        if (step == 50 && rank == 2) t.step_time_s = 0;  // refused
        const absl::Status s = (*decider)->ReportTelemetry(t);
        if (step == 50) {
          bad_step[rank] = s;
        } else {
          ASSERT_THAT(s, IsOk()) << "rank " << rank << " step " << step;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(bad_step[0], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("refused")));
  EXPECT_THAT(bad_step[1], IsOk());
  EXPECT_THAT(bad_step[2], StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step_time_s")));
  EXPECT_THAT(bad_step[3], IsOk());
  EXPECT_EQ(leader_client->stats().telemetry_reported, kSteps - 1);
}

TEST(GroupDeciderTest, AGroupSessionNeedsTheReduction) {
  GateClientOptions o;
  o.controller = "127.0.0.1:1";
  o.job_id = "j";
  o.incarnation = "test-launch";
  o.launch_credential = "0123456789abcdef0123456789abcdef";
  o.group_size = 4;
  auto leader = GateClient::Create(o);
  ASSERT_THAT(leader.status(), IsOk());
  InMemoryBroadcast group(4);
  EXPECT_THAT(GroupDecider::CreateLocal(leader->get(), 0, group.ForRank(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max-reduce")));
  EXPECT_THAT(
      GroupDecider::CreateLocal(leader->get(), 0, group.ForRank(0), group.ReduceForRank(0))
          .status(),
      IsOk());
  // Followers have no client in a group session: the option table's default refuses one.
  o.rank_in_group = 2;
  EXPECT_THAT(GateClient::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("only the group's leader")));
  // Per-rank sessions: every rank's own client, and no reduction.
  o.group_session = false;
  auto own = GateClient::Create(o);
  ASSERT_THAT(own.status(), IsOk());
  o.rank_in_group = 0;
  auto per_rank_leader = GateClient::Create(o);
  ASSERT_THAT(per_rank_leader.status(), IsOk());
  EXPECT_THAT(GroupDecider::CreateLocal(per_rank_leader->get(), 0, group.ForRank(0),
                                   group.ReduceForRank(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group_session=false")));
  auto follower = GroupDecider::CreateLocal(own->get(), 2, group.ForRank(2));
  ASSERT_THAT(follower.status(), IsOk());
  EXPECT_THAT((*follower)->ReportTelemetry({.step = 0, .step_time_s = 1}), IsOk());
  EXPECT_EQ((*own)->stats().telemetry_reported, 1);
  EXPECT_THAT(GroupDecider::CreateLocal(own->get(), 1, group.ForRank(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("created for rank 2")));
  auto bare = GroupDecider::CreateLocal(nullptr, 3, group.ForRank(3));
  EXPECT_THAT((*bare)->ReportTelemetry({.step = 0, .step_time_s = 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("neither")));
}

TEST(InMemoryBroadcastTest, ReduceTimesOutWithoutEveryRank) {
  InMemoryBroadcast group(3, absl::Milliseconds(20));
  TelemetryWire w;
  EXPECT_THAT(group.MaxReduce(1, w.v, 0), IsOk()) << "a contributor never waits";
  EXPECT_THAT(group.MaxReduce(0, w.v, 0),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("2 of 3")));
}

TEST(InMemoryBroadcastTest, ReceiverTimesOutWithoutARoot) {
  InMemoryBroadcast group(2, absl::Milliseconds(20));
  uint8_t bytes[24] = {};
  EXPECT_THAT(group.Broadcast(1, bytes, 0), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

// Ranks that disagree on a reduction's root or length: the root already waiting fails at
// once with the rank that disagreed, not at the (60 s) timeout; so do later arrivals.
TEST(InMemoryBroadcastTest, ReduceFailsFastWhenTheRanksDisagree) {
  struct Case {
    const char* name;
    int late_root;
    size_t late_length;
    const char* error;
  };
  const Case cases[] = {{"root", 1, 14, "rank 1 reduces into rank 1, an earlier rank into rank 0"},
                        {"length", 0, 21, "rank 1 reduces 21 values, an earlier rank 14"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    InMemoryBroadcast group(3, absl::Seconds(60));
    absl::Status root_status;
    const absl::Time start = absl::Now();
    std::thread root([&] {
      std::vector<double> v(14, 1.0);
      root_status = group.MaxReduce(0, v, 0);
    });
    // The root waits first: a loaded machine may start its thread late, and then the
    // messages name the ranks the other way round.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<double> late(c.late_length, 2.0);
    EXPECT_THAT(group.MaxReduce(1, late, c.late_root),
                StatusIs(absl::StatusCode::kInternal, HasSubstr(c.error)));
    root.join();
    EXPECT_THAT(root_status, StatusIs(absl::StatusCode::kInternal, HasSubstr(c.error)));
    std::vector<double> last(14, 3.0);
    EXPECT_THAT(group.MaxReduce(2, last, 0), StatusIs(absl::StatusCode::kInternal));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  }
}

TEST(InMemoryBroadcastTest, BroadcastRefusesAnotherLengthOrRoot) {
  InMemoryBroadcast group(3, absl::Seconds(60));
  uint8_t sent[25] = {7};
  ASSERT_THAT(group.Broadcast(0, sent, 0), IsOk());
  uint8_t shorter[24] = {};
  EXPECT_THAT(group.Broadcast(1, shorter, 0),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("expected 24 broadcast bytes, the "
                                                              "root sent 25")));
  uint8_t same[25] = {};
  EXPECT_THAT(group.Broadcast(2, same, 1),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("expected root 1")));
  // Two ranks that both send as the root of one broadcast.
  ASSERT_THAT(group.Broadcast(0, sent, 0), IsOk());
  EXPECT_THAT(group.Broadcast(1, sent, 1),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("rank 0 already did")));
  // The receivers that agree get the root's bytes.
  EXPECT_THAT(group.Broadcast(2, same, 0), IsOk());
  EXPECT_EQ(same[0], 7);
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
  // A token no header can carry: refused before any call (gRPC aborted the process at the
  // first one, printing the header), without the token in the message.
  o.worker_token = std::string("LEAK\x01ME", 7);
  const auto bad_token = GateClient::Create(o);
  EXPECT_THAT(bad_token.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("worker_token: the token's character 5 is byte 0x01")));
  EXPECT_THAT(bad_token.status().message(), ::testing::Not(HasSubstr("LEAK")));
  o.worker_token = "";
  o.initial_config.window_steps = 0;
  EXPECT_THAT(GateClient::Create(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("window_steps")));
}

}  // namespace
}  // namespace spgate::client
