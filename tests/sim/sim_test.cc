// spgate-sim end to end: the live driver (local-only, and against a real in-process
// daemon) keeps every group consistent and loses no telemetry; replay is deterministic
// and exercises every gate; the sweep ranks configs on common random numbers.
#include "tools/sim/sim.h"

#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/lengths.h"
#ifdef SPGATE_HAVE_SERVER
#include "server/daemon.h"
#endif

namespace spgate::sim {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

SimOptions Small() {
  SimOptions o;
  o.groups = 6;
  o.cost.tp = 4;
  o.steps = 60;
  o.steps_per_s = 200;
  o.bucketing = false;  // both modes
  o.threads = 2;        // 24 ranks on 2 threads
  o.cost.layers = 10;   // a pipeline stage: fits 80 GiB at t = 4 in both modes
  return o;
}

int64_t Total(const Summary& s) {
  int64_t n = 0;
  for (const auto& [m, reasons] : s.decisions) {
    for (const auto& [r, c] : reasons) n += c;
  }
  return n;
}

TEST(SimRunTest, LocalOnlyGroupsAreConsistent) {
  absl::StatusOr<Summary> s = RunLive(Small());
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 60);
  EXPECT_EQ(s->local_decisions, 6 * 60);
  EXPECT_EQ(s->threads, 2);
  EXPECT_GT(s->sp.steps, 0);
  EXPECT_GT(s->tp_only.steps, 0);
  EXPECT_EQ(s->telemetry_reported, 6 * 4 * 60);
  const std::string json = s->ToJson();
  for (const char* key : {"\"steps\"", "\"decisions\"", "\"local_decisions\"",
                          "\"consistency_violations\"", "\"lost_telemetry\"",
                          "\"effective_tokens_per_s\"", "\"step_time_p95_s\"",
                          "\"peak_memory_bytes\"", "\"group_phase\": \"random\""}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
}

TEST(SimRunTest, GroupsTickAtTheirOwnPhaseOrAllAtOnce) {
  SimOptions o = Small();
  o.groups = 64;
  o.steps_per_s = 10;
  const std::vector<absl::Duration> random = GroupPhases(o);
  ASSERT_EQ(random.size(), 64u);
  int first_half = 0;
  for (absl::Duration d : random) {
    EXPECT_GE(d, absl::ZeroDuration());
    EXPECT_LT(d, absl::Milliseconds(100));
    if (d < absl::Milliseconds(50)) ++first_half;
  }
  // Spread over the period, not bunched (binomial(64, 1/2): 16..48 is > 99.99 %).
  EXPECT_GT(first_half, 16);
  EXPECT_LT(first_half, 48);
  EXPECT_EQ(GroupPhases(o), random) << "phases are seeded";
  o.seed = 2;
  EXPECT_NE(GroupPhases(o), random);
  o.group_phase = SimOptions::GroupPhase::kAligned;
  for (absl::Duration d : GroupPhases(o)) EXPECT_EQ(d, absl::ZeroDuration());

  EXPECT_THAT(ParseGroupPhase("random"), IsOkAndHolds(SimOptions::GroupPhase::kRandom));
  EXPECT_THAT(ParseGroupPhase("aligned"), IsOkAndHolds(SimOptions::GroupPhase::kAligned));
  EXPECT_THAT(ParseGroupPhase("sync"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--group_phase")));
}

TEST(SimRunTest, AlignedGroupsAreConsistentToo) {
  SimOptions o = Small();
  o.group_phase = SimOptions::GroupPhase::kAligned;
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 60);
  EXPECT_THAT(s->ToJson(), HasSubstr("\"group_phase\": \"aligned\""));
}

#ifdef SPGATE_HAVE_SERVER
TEST(SimRunTest, AgainstTheDaemonNoTelemetryIsLost) {
  server::DaemonOptions d;
  d.heartbeat_interval = absl::Milliseconds(200);
  auto daemon = server::Daemon::Start(d);
  ASSERT_THAT(daemon.status(), IsOk());
  SimOptions o = Small();
  o.controller = (*daemon)->worker_address();
  o.job_id = "sim-test";
  o.incarnation = "test-launch";
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 60);
  EXPECT_GT(s->sources["daemon"], 6 * 60 * 9 / 10) << "most decisions should be the daemon's";
  EXPECT_EQ(s->telemetry_reported, 6 * 4 * 60);
  EXPECT_EQ(s->telemetry_acked, s->telemetry_reported) << "lost telemetry";
  EXPECT_FALSE(s->decision_latency_s.empty());
  (*daemon)->Shutdown(absl::Seconds(2));
}

// A relaunched job under the same job id gets decisions for its own batches, not the
// previous launch's cached answers for the same (group, step) (docs/design.md §10). The
// first launch runs near-uniform batches (SP everywhere); the second, same job id and a
// new incarnation (each RunLive makes its own), a bimodal mix that trips the CV gate —
// before job incarnations it got the first launch's 100% "sp / gates_passed".
TEST(SimRunTest, ARelaunchUnderTheSameJobIdIsDecidedAfresh) {
  auto daemon = server::Daemon::Start({});
  ASSERT_THAT(daemon.status(), IsOk());
  SimOptions o = Small();
  o.controller = (*daemon)->worker_address();
  o.job_id = "relaunched";
  o.deadline = absl::Milliseconds(200);
  o.bucketing = false;
  o.lengths = "uniform:min=4000,max=4096";
  absl::StatusOr<Summary> first = RunLive(o);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->decisions["tp_only"]["length_cv"], 0);
  o.lengths = "bimodal:short=256,long=16000,p_long=0.5";
  absl::StatusOr<Summary> second = RunLive(o);
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_GT(second->decisions["tp_only"]["length_cv"], Total(*second) / 4)
      << "the relaunch must be decided for its own batches";
  EXPECT_GT(second->sources["daemon"], Total(*second) * 9 / 10);
  EXPECT_EQ(second->consistency_violations, 0);
  (*daemon)->Shutdown(absl::Seconds(2));
}
#endif

// ---------------------------------------------------------------- batches

TEST(SimBatchesTest, EachGroupDrawsTheWorkersStreamForTheSameSeed) {
  for (bool bucketing : {false, true}) {
    SimOptions o = Small();
    o.lengths = "bimodal:short=512,long=16384,p_long=0.3";
    o.tokens_per_batch = 16384;
    o.bucketing = bucketing;
    o.seed = 7;
    for (int group : {0, 3}) {
      absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> sim = GroupBatches(o, group);
      ASSERT_THAT(sim.status(), IsOk());
      // What spgate-worker's leader of TP group `group` builds (worker/runtime/worker.cc).
      absl::StatusOr<std::unique_ptr<runtime::LengthSource>> src =
          runtime::ParseLengthSource(o.lengths, o.seed * 1000003 + group, o.tokens_per_batch);
      ASSERT_THAT(src.status(), IsOk());
      runtime::BatchBuilder worker(*std::move(src), {.tokens_per_batch = o.tokens_per_batch,
                                                     .bucketing = o.bucketing});
      for (int i = 0; i < 50; ++i) {
        ASSERT_EQ((*sim)->Next(0.15).lengths, worker.Next(0.15).lengths)
            << "bucketing " << bucketing << " group " << group << " batch " << i;
      }
    }
  }
}

TEST(SimBatchesTest, SequencesLongerThanABatchAreCut) {
  SimOptions o = Small();
  o.lengths = "uniform:min=5000,max=9000";
  o.tokens_per_batch = 4096;
  absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, 0);
  ASSERT_THAT(b.status(), IsOk());
  for (int i = 0; i < 50; ++i) EXPECT_EQ((*b)->Next(0.15).lengths, std::vector<int64_t>{4096});
}

TEST(SimBatchesTest, EveryGroupReplaysATraceFromItsOwnOffset) {
  const std::string path = ::testing::TempDir() + "/sim_trace.txt";
  std::ofstream(path) << "# a trace\n100\n200\n\n300\n400\n";
  SimOptions o = Small();
  o.lengths = "file:" + path;
  o.groups = 2;
  o.tokens_per_batch = 250;  // one sequence a batch
  auto firsts = [&](int group) {
    std::vector<int64_t> got;
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, group);
    EXPECT_THAT(b.status(), IsOk());
    if (!b.ok()) return got;
    for (int i = 0; i < 4; ++i) got.push_back((*b)->Next(0.15).lengths.at(0));
    return got;
  };
  // Lengths over the budget are cut to it (300, 400 -> 250).
  EXPECT_EQ(firsts(0), (std::vector<int64_t>{100, 200, 250, 250}));
  EXPECT_EQ(firsts(1), (std::vector<int64_t>{250, 250, 100, 200}));
}

// ---------------------------------------------------------------- replay

TEST(SimReplayTest, IsDeterministic) {
  SimOptions o = Small();
  o.steps = 500;
  absl::StatusOr<Summary> a = Replay(o, GateConfig{});
  absl::StatusOr<Summary> b = Replay(o, GateConfig{});
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  a->wall_s = b->wall_s = 0;
  EXPECT_EQ(a->ToJson(), b->ToJson());
}

TEST(SimReplayTest, StragglersTripTheWaitShareGateAndProbes) {
  SimOptions o = Small();
  o.bucketing = true;
  o.steps = 3000;
  o.groups = 1;
  o.cost.straggler_prob = 0.3;
  o.cost.straggler_slowdown = 0.6;
  GateConfig c;
  c.probe_interval_steps = 20;
  c.min_dwell_steps = 5;
  c.window_steps = 10;
  absl::StatusOr<Summary> s = Replay(o, c);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_GT(s->decisions["tp_only"]["rs_wait"], 0);
  EXPECT_GT(s->decisions["sp"]["probe"], 0);
  EXPECT_GT(s->decisions["sp"]["gates_passed"], 0);
}

TEST(SimReplayTest, SmallDevicesNeedSp) {
  SimOptions o = Small();
  o.steps = 200;
  o.tokens_per_batch = 32768;
  // 12.6 GB of weights and optimizer state; activations 26.8 GB under TP-only, 14.3 GB
  // under SP: only SP fits 32 GiB x 0.9.
  o.cost.device_memory_gib = 32;
  absl::StatusOr<Summary> s = Replay(o, GateConfig{});
  ASSERT_THAT(s.status(), IsOk());
  // Full batches must run SP; TP-only only ever ran where it fit.
  EXPECT_GT(s->decisions["sp"]["memory_requires_sp"], s->all.steps / 2);
  EXPECT_LE(static_cast<double>(s->tp_only.peak_memory), 0.9 * 32 * (1ull << 30));
  EXPECT_EQ(s->decisions["sp"]["memory_over_budget"], 0);
}

TEST(SimSweepTest, RanksConfigsByThroughput) {
  SimOptions o = Small();
  o.steps = 300;
  o.groups = 1;
  auto cv = ParseSweepAxis("sweep_max_length_cv", "0.05:0.45:0.2");
  auto rs = ParseSweepAxis("sweep_max_rs_wait_share", "0.02:0.3:0.14");
  ASSERT_THAT(cv.status(), IsOk());
  ASSERT_THAT(rs.status(), IsOk());
  absl::StatusOr<std::vector<SweepPoint>> pts = Sweep(o, GateConfig{}, *cv, *rs);
  ASSERT_THAT(pts.status(), IsOk());
  // 3 × 3 grid minus max_rs_wait_share 0.02 (not above the 0.03 re-enable margin).
  EXPECT_EQ(pts->size(), 6u);
  for (size_t i = 1; i < pts->size(); ++i) {
    const Summary& a = (*pts)[i - 1].summary;
    const Summary& b = (*pts)[i].summary;
    EXPECT_GE(a.all.tokens / a.all.time_s, b.all.tokens / b.all.time_s);
  }
  EXPECT_THAT(SweepTable(*pts, 1), HasSubstr("| max_length_cv |"));
  EXPECT_THAT(ParseSweepAxis("sweep_max_length_cv", "0.5:0.1:0.1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--sweep_max_length_cv")));
}

TEST(SimRunTest, RejectsBadOptions) {
  SimOptions o = Small();
  o.groups = 0;
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--groups")));
  o = Small();
  o.lengths = "weird";
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lengths")));
}

}  // namespace
}  // namespace spgate::sim
