// --plot's inputs: each group's TP-only share per series window (PolicyResult::
// group_tp_share) adds up to the policy's TP-only decisions, the fixed choices' shares are 0
// and 1, CompareModesCsv has a row per window, policy and group; a bad --plot path is
// INVALID_ARGUMENT before anything runs. (The PNG itself: progress_plot_test.py.)
#include "tools/sim/compare_plot.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tools/sim/compare.h"
#include "tools/sim/sim.h"

namespace spgate::sim {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CompareModesTest, SharesPerWindowAndGroupAddUpToTheDecisions) {
  SimOptions o;
  o.groups = 3;
  o.steps = 100;
  o.cost.tp = 8;
  o.bucketing = false;
  o.lengths = "bimodal:short=256,long=8000,p_long=0.4";
  o.cost.shard_work_fraction = 0.5;  // the modes trade places (regret_test's Plain)
  o.cost.device_memory_gib = 1000;   // no memory gate: tp_only is TP-only everywhere
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, /*series_window=*/30, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<int64_t> window_steps = {30, 30, 30, 10};  // 100 steps in windows of 30
  for (const PolicyResult& p : r->policies) {
    ASSERT_EQ(p.group_tp_share.size(), window_steps.size()) << p.name;
    double tp = 0;
    for (size_t w = 0; w < window_steps.size(); ++w) {
      ASSERT_EQ(p.group_tp_share[w].size(), 3u) << p.name;
      for (float share : p.group_tp_share[w]) {
        if (p.name == "sp") {
          EXPECT_EQ(share, 0.0f);
        }
        if (p.name == "tp_only") {
          EXPECT_EQ(share, 1.0f);
        }
        tp += share * static_cast<double>(window_steps[w]);
      }
    }
    EXPECT_NEAR(tp, static_cast<double>(p.tp_steps), 1e-3) << p.name;
  }
  const PolicyResult* oracle = r->Find("oracle");
  ASSERT_NE(oracle, nullptr);
  EXPECT_GT(oracle->tp_steps, 0);  // a mixed cell: the shares are not all 0 or 1
  EXPECT_GT(oracle->sp_steps, 0);

  const std::string csv = CompareModesCsv(*r);
  const std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.front(), "step,policy,group,tp_only_share");
  EXPECT_EQ(lines.size(), 1 + r->policies.size() * window_steps.size() * 3);
  EXPECT_THAT(csv, HasSubstr("\n100,tp_only,2,1.0000\n"));
  EXPECT_THAT(csv, HasSubstr("\n30,sp,0,0.0000\n"));
}

// The diagnostics beside the figures: each deciding policy's decisions by mode and reason
// add up to its decisions (none for the fixed choices and the oracles), and ADAPTIVE's
// change detector counts the changes of a cell whose stragglers come in bursts (a level
// that moves every 100 steps); no other policy has a detector.
TEST(CompareJsonTest, DecisionsByReasonAddUpAndOnlyAdaptiveDetectsChanges) {
  SimOptions o;
  o.groups = 3;
  o.steps = 400;
  o.cost.tp = 8;
  o.lengths = "lognormal:mean=4096,sigma=0.3";
  o.cost.straggler_prob = 0.3;
  o.cost.straggler_slowdown = 1.0;
  o.cost.straggler_burst_every = 200;
  o.cost.straggler_burst_steps = 100;
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, /*series_window=*/100, 100);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const PolicyResult& p : r->policies) {
    const bool decides = p.name == "static" || p.name == "adaptive";
    int64_t sp = 0, tp = 0, probes = 0;
    for (const auto& [mode, reasons] : p.decisions) {
      for (const auto& [reason, n] : reasons) {
        (mode == "sp" ? sp : tp) += n;
        if (reason == "probe") probes += n;
      }
    }
    EXPECT_EQ(sp, decides ? p.sp_steps : 0) << p.name;
    EXPECT_EQ(tp, decides ? p.tp_steps : 0) << p.name;
    EXPECT_EQ(probes, p.probe_steps) << p.name;
    if (p.name == "adaptive") {
      EXPECT_GT(p.changes_detected, 0);
    } else {
      EXPECT_EQ(p.changes_detected, 0) << p.name;
    }
  }
  const std::string json = CompareJson(*r);
  EXPECT_THAT(json, HasSubstr("\"decisions_by_reason\": {\"sp\": {"));
  EXPECT_THAT(json, HasSubstr("\"changes_detected\": 0, \"decisions_by_reason\": {}"));
}

TEST(ComparePlotTest, BadPathIsInvalidArgumentNamingPlot) {
  EXPECT_THAT(CheckComparePlot("/tmp/compare.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("want a .png, .svg or .pdf")));
  EXPECT_THAT(CheckComparePlot("/nonexistent-spgate-dir/compare.png"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--plot=/nonexistent-spgate-dir/compare.png: folder "
                                 "/nonexistent-spgate-dir does not exist")));
}

}  // namespace
}  // namespace spgate::sim
