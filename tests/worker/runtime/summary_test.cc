// The run summary (worker/runtime/summary.h): switch costs, aggregation over groups,
// ranks and modes, memory overrides, and its JSON keys.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/types.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/summary.h"

namespace spgate::runtime {
namespace {

using ::testing::HasSubstr;

StepRecord Rec(int64_t step, Mode mode, Reason reason, StepSource src, double t, int64_t tokens) {
  StepRecord r;
  r.step = step;
  r.mode = static_cast<uint8_t>(mode);
  r.reason = static_cast<uint8_t>(reason);
  r.source = static_cast<uint8_t>(src);
  r.step_time_s = t;
  r.tokens = tokens;
  r.peak_bytes = 1000;
  r.predicted_peak_bytes = 1040;
  r.rs_wait_s = t * 0.1;
  return r;
}

// The switch cost: per token, the first step after a switch against the mode's others.
TEST(SummaryTest, SwitchCostIsTheFirstStepAfterASwitchPerTokenOverTheRest) {
  constexpr Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
  const auto f = StepSource::kFlag;
  const auto r = Reason::kPinned;
  // One group of one rank: SP SP TP TP TP TP SP SP. Switches at steps 2 (to TP) and 6 (to
  // SP). Medians: the preempted TP step 5 (0.1 s/token) does not move the steady figure.
  std::vector<std::vector<StepRecord>> recs(1);
  recs[0] = {Rec(0, kSp, r, f, 1.0, 100), Rec(1, kSp, r, f, 2.0, 200),
             Rec(2, kTp, r, f, 3.0, 100),  // 0.03 s/token after the switch
             Rec(3, kTp, r, f, 1.0, 100), Rec(4, kTp, r, f, 2.0, 200),  // 0.01 steady
             Rec(5, kTp, r, f, 10.0, 100),  // an outlier
             Rec(6, kSp, r, f, 1.5, 100),  // 0.015 after the switch
             Rec(7, kSp, r, f, 1.0, 100)};  // steady SP: 0.01 (step 0 has no previous step)
  recs[0][2].device_allocated_bytes = 4096;  // the switch step took new blocks
  recs[0][3].device_allocated_bytes = 1024;
  RunDescription run;
  run.tp = 1;
  const RunSummary s = Summarize(run, recs, {{}});
  EXPECT_DOUBLE_EQ(s.switch_cost_ratio.at("tp_only"), 3.0);
  EXPECT_DOUBLE_EQ(s.switch_cost_ratio.at("sp"), 1.5);
  EXPECT_EQ(s.switch_steps.at("tp_only"), 1);
  EXPECT_EQ(s.switch_steps.at("sp"), 1);
  EXPECT_DOUBLE_EQ(s.switch_device_alloc_bytes.at("tp_only"), 4096);
  EXPECT_DOUBLE_EQ(s.steady_device_alloc_bytes.at("tp_only"), 1024.0 / 3);
  EXPECT_DOUBLE_EQ(s.switch_device_alloc_bytes.at("sp"), 0);
  EXPECT_THAT(SummaryJson(s), HasSubstr("\"switch_cost_ratio\": {\"sp\": 1.5"));
  // A run that never switches has no switch figures.
  recs[0] = {Rec(0, kSp, r, f, 1.0, 100), Rec(1, kSp, r, f, 1.0, 100)};
  EXPECT_TRUE(Summarize(run, recs, {{}}).switch_cost_ratio.empty());
  // A mode that only ever ran right after a switch has no steady steps to compare with:
  // its switches are counted, and it has no ratio (not 0, which would read as free).
  recs[0] = {Rec(0, kSp, r, f, 1.0, 100), Rec(1, kSp, r, f, 1.0, 100),
             Rec(2, kTp, r, f, 3.0, 100), Rec(3, kSp, r, f, 1.5, 100),
             Rec(4, kTp, r, f, 3.0, 100), Rec(5, kSp, r, f, 1.0, 100)};
  const RunSummary alternating = Summarize(run, recs, {{}});
  EXPECT_EQ(alternating.switch_steps.at("tp_only"), 2);
  EXPECT_EQ(alternating.switch_steps.at("sp"), 2);
  EXPECT_EQ(alternating.switch_cost_ratio.count("tp_only"), 0u);
  EXPECT_DOUBLE_EQ(alternating.switch_cost_ratio.at("sp"), 1.25);  // median(1.5, 1.0) / 1.0
}

TEST(SummaryTest, AggregatesGroupsRanksAndModes) {
  constexpr Mode kSp = Mode::kSequenceParallel, kTp = Mode::kTensorParallelOnly;
  // Two TP groups of two ranks, two steps.
  std::vector<std::vector<StepRecord>> recs(4);
  recs[0] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 100),
             Rec(1, kTp, Reason::kLengthCv, StepSource::kFallback, 2.0, 300)};
  recs[1] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.5, 100),   // slower
             Rec(1, kTp, Reason::kLengthCv, StepSource::kFallback, 2.0, 300)};
  recs[2] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50),
             Rec(1, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50)};
  recs[3] = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50),
             Rec(1, kTp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 50)};  // disagrees
  recs[1][0].peak_bytes = 5000;
  RunDescription run;
  run.tp = 2;
  const RunSummary s = Summarize(run, recs, {{.telemetry_sent = 10, .telemetry_acked = 7},
                                             {.telemetry_sent = 5, .telemetry_acked = 5}});
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.consistency_violations, 1);
  EXPECT_EQ(s.decisions.at("sp").at("gates_passed"), 3);
  EXPECT_EQ(s.decisions.at("tp_only").at("length_cv"), 1);
  EXPECT_EQ(s.local_decisions, 1);
  EXPECT_EQ(s.lost_telemetry, 3);
  // Group 0: 100 tokens in 1.5 s (slowest rank) SP, 300 in 2 s TP; group 1: 100 in 2 s SP.
  EXPECT_DOUBLE_EQ(s.effective_tokens_per_s.at("sp"), 100 / 1.5 + 100 / 2.0);
  EXPECT_DOUBLE_EQ(s.effective_tokens_per_s.at("tp_only"), 300 / 2.0);
  EXPECT_DOUBLE_EQ(s.effective_tokens_per_s.at("all"), 400 / 3.5 + 100 / 2.0);
  EXPECT_DOUBLE_EQ(s.step_time_p95_s.at("sp"), 1.5);
  EXPECT_DOUBLE_EQ(s.step_time_p95_s.at("all"), 2.0);
  EXPECT_EQ(s.peak_memory_bytes.at("sp"), 5000u);
  EXPECT_EQ(s.peak_memory_bytes.at("tp_only"), 1000u);
  EXPECT_FALSE(s.verify_max_abs_diff.has_value());
  const std::string json = SummaryJson(s);
  for (const char* key : {"\"steps\"", "\"decisions\"", "\"local_decisions\"",
                          "\"consistency_violations\"", "\"lost_telemetry\"",
                          "\"effective_tokens_per_s\"", "\"step_time_p95_s\"",
                          "\"peak_memory_bytes\""}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
  EXPECT_THAT(json, HasSubstr("\"decisions\": {\"sp\": {\"gates_passed\": 3}, "
                              "\"tp_only\": {\"length_cv\": 1}}"));
  // Labelled names beside the old ones: group-steps, the job's tokens/s, the decisions' unit.
  EXPECT_THAT(json, HasSubstr("\"group_steps_by_mode\": {\"all\": 4, \"sp\": 3, "
                              "\"tp_only\": 1}"));
  EXPECT_THAT(json, HasSubstr("\"decision_unit\": \"group_steps\""));
  EXPECT_THAT(json, HasSubstr(absl::StrCat("\"job_effective_tokens_per_s\": {\"all\": ",
                                           absl::StrFormat("%.9g", 400 / 3.5 + 100 / 2.0))));
  const std::string table = SummaryTable(s);
  EXPECT_THAT(table, HasSubstr("per mode: group-steps; tokens/s of the job (summed over the "
                               "TP groups)"));
  EXPECT_THAT(table, HasSubstr("group-steps   job tokens/s"));
  EXPECT_THAT(table, HasSubstr("decisions (mode / reason: group-steps):"));
}

// With pipelines each stage's leader counts a decision per micro-batch; the per-mode keys
// stay group-steps of each replica's first stage.
TEST(SummaryTest, PipelineDecisionsAreMicrobatchesAndSaySo) {
  constexpr Mode kSp = Mode::kSequenceParallel;
  // TP 1, PP 2, one replica, one step of 2 micro-batches: stage 0 both SP, stage 1 one
  // TP-only.
  std::vector<std::vector<StepRecord>> recs(2);
  for (auto& r : recs) r = {Rec(0, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 100)};
  const uint8_t sp = PackModeReason({kSp, Reason::kGatesPassed});
  const uint8_t tp = PackModeReason({Mode::kTensorParallelOnly, Reason::kLengthCv});
  RunDescription run;
  run.tp = 1;
  run.pp = 2;
  run.microbatches = 2;
  const RunSummary s = Summarize(run, recs, {{}, {}}, {{sp, sp}, {sp, tp}});
  EXPECT_TRUE(s.microbatch_decisions);
  EXPECT_EQ(s.decisions.at("sp").at("gates_passed"), 3);
  EXPECT_EQ(s.decisions.at("tp_only").at("length_cv"), 1);
  EXPECT_EQ(s.steps_by_mode.at("all"), 1) << "the replica's first stage's group-step";
  EXPECT_THAT(SummaryJson(s), HasSubstr("\"decision_unit\": \"microbatches\""));
  EXPECT_THAT(SummaryTable(s), HasSubstr("decisions (mode / reason: micro-batches):"));
  EXPECT_THAT(SummaryTable(s), HasSubstr("group-steps of each replica's first stage"));
}

// A leader that ran SP instead of the daemon's TP-only: its step's source says so (and is
// not a local decision), and memory_overrides totals the ranks' counts.
TEST(SummaryTest, MemoryOverridesAreTotalledAndNotLocalDecisions) {
  constexpr Mode kSp = Mode::kSequenceParallel;
  std::vector<std::vector<StepRecord>> recs(4);
  for (int r = 0; r < 4; ++r) {
    recs[r] = {Rec(0, kSp, Reason::kMemoryRequiresSp, StepSource::kMemoryOverride, 1.0, 100),
               Rec(1, kSp, Reason::kGatesPassed, StepSource::kDaemon, 1.0, 100)};
  }
  RunDescription run;
  run.tp = 2;
  // Group leaders (ranks 0 and 2) count; the others decide nothing.
  const RunSummary s =
      Summarize(run, recs, {{.memory_overrides = 1}, {}, {.memory_overrides = 1}, {}});
  EXPECT_EQ(s.memory_overrides, 2);
  EXPECT_EQ(s.local_decisions, 0);
  EXPECT_EQ(s.decision_sources.at("memory_override"), 2);
  EXPECT_EQ(s.decisions.at("sp").at("memory_requires_sp"), 2);
  EXPECT_THAT(SummaryJson(s), HasSubstr("\"memory_overrides\": 2,"));
  EXPECT_THAT(SummaryJson(s),
              HasSubstr("\"decision_sources\": {\"daemon\": 2, \"memory_override\": 2}"));
  EXPECT_THAT(SummaryTable(s), HasSubstr("memory overrides 2"));
  EXPECT_STREQ(StepSourceLabel(StepSource::kMemoryOverride), "memory_override");
  EXPECT_STREQ(StepSourceLabel(StepSource::kFlag), "flag");
}

}  // namespace
}  // namespace spgate::runtime
