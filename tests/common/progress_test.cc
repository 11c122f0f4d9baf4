// The progress line: its format, and that the reporter prints at most one line per
// interval and reads its (injected) clock only every check_every calls.
#include "common/progress.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace spgate {
namespace {

TEST(FormatProgressLineTest, Table) {
  struct Case {
    ProgressSnapshot s;
    std::string want;
  };
  const Case cases[] = {
      {{.label = "spgate-sim replay", .steps = 120, .total_steps = 1000, .tokens_per_s = 3100,
        .sp = 80, .tp = 20, .eta_s = 41},
       "spgate-sim replay: step 120/1000 (12%)  3.1k tok/s  SP 80% TP-only 20%  ETA 0:41"},
      // A live run's groups half-way through step 7: 6 whole steps done.
      {{.label = "x", .steps = 6.5, .total_steps = 10, .tokens_per_s = 12.4e6, .simulated = true,
        .rate_unit = "tok/s/job", .sp = 1, .tp = 2, .eta_s = 3723},
       "x: step 6/10 (65%)  12.4M sim tok/s/job  SP 33% TP-only 67%  ETA 1:02:03"},
      // Unknown total, no tokens and no decisions yet.
      {{.label = "", .steps = 3}, "step 3"},
      {{.label = "w", .steps = 5, .tokens_per_s = 950, .tp = 5}, "w: step 5  950 tok/s  SP 0% TP-only 100%"},
  };
  for (const Case& c : cases) EXPECT_EQ(FormatProgressLine(c.s), c.want);
  EXPECT_EQ(FormatEta(0), "0:00");
  EXPECT_EQ(FormatEta(599.6), "10:00");
  EXPECT_EQ(FormatRate(999.4), "999");
  EXPECT_EQ(FormatRate(999.6), "1.0k");
}

// A clock that advances by `tick` on every read, and counts the reads.
struct FakeClock {
  absl::Time now = absl::UnixEpoch();
  absl::Duration tick = absl::ZeroDuration();
  int reads = 0;
  absl::Time operator()() {
    ++reads;
    return now += tick;
  }
};

TEST(ProgressReporterTest, OneLinePerIntervalAndEtaFromTheStepRate) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressReporter p({.label = "t", .total_steps = 100, .interval = absl::Seconds(2),
                      .clock = [&] { return clock(); },
                      .sink = [&](std::string_view l) { lines.emplace_back(l); }});
  for (int i = 0; i < 10; ++i) {  // 10 steps in 1 s: under the interval, no line
    clock.now += absl::Milliseconds(100);
    p.Add({.parts = 1, .tokens = 1000, .sp = 1});
  }
  EXPECT_TRUE(lines.empty());
  for (int i = 0; i < 10; ++i) {  // 2 s in all: exactly one line
    clock.now += absl::Milliseconds(100);
    p.Add({.parts = 1, .tokens = 1000, .tp = 1});
  }
  ASSERT_EQ(lines.size(), 1u);
  // 20 steps in 2 s; 80 more at that rate is 8 s; 20,000 tokens over 2 s.
  EXPECT_EQ(lines[0], "t: step 20/100 (20%)  10.0k tok/s  SP 50% TP-only 50%  ETA 0:08");
  clock.now += absl::Milliseconds(500);
  p.Add({.parts = 1, .tokens = 500, .tp = 1});
  EXPECT_EQ(lines.size(), 1u);  // 0.5 s since the last line
  p.Finish();
  p.Finish();  // once
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(p.lines(), 2);
  // The last interval's rate: 500 tokens in 0.5 s.
  EXPECT_EQ(lines[1].substr(0, 33), "t: step 21/100 (21%)  1.0k tok/s ");
}

TEST(ProgressReporterTest, ReadsTheClockOnlyEveryCheckEveryCalls) {
  FakeClock clock;
  clock.tick = absl::Seconds(1);  // every read is a second later: every check prints
  int lines = 0;
  std::string last;
  ProgressReporter p({.label = "t", .interval = absl::Seconds(1), .check_every = 16,
                      .clock = [&] { return clock(); },
                      .sink = [&](std::string_view l) {
                        ++lines;
                        last = l;
                      }});
  const int reads_at_start = clock.reads;
  for (int i = 0; i < 64; ++i) p.Add({.parts = 1});
  EXPECT_EQ(clock.reads - reads_at_start, 4);
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(last, "t: step 64");  // no tokens counted: no tok/s
}

TEST(ProgressReporterTest, SimulatedRateAndPartsPerStep) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressReporter p({.label = "r", .total_steps = 10, .parts_per_step = 4,
                      .interval = absl::Seconds(1), .rate_unit = "tok/s/job", .clock = [&] { return clock(); },
                      .sink = [&](std::string_view l) { lines.emplace_back(l); }});
  // 4 groups x 5 steps, each group-step 100 tokens in 0.5 simulated s: the job's effective
  // rate is 4 x 2,000 / 10 s = 800 tok/s, half the steps done in 1 s of wall time.
  for (int i = 0; i < 20; ++i) p.Add({.parts = 1, .tokens = 100, .sp = 1, .sim_seconds = 0.5});
  clock.now += absl::Seconds(1);
  p.Finish();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "r: step 5/10 (50%)  800 sim tok/s/job  SP 100% TP-only 0%  ETA 0:01");
}

TEST(ProgressReporterTest, TimedRunEtaIsWhatIsLeftOfTheDuration) {
  FakeClock clock;
  std::vector<std::string> lines;
  ProgressReporter p({.label = "w", .total_duration = absl::Seconds(30),
                      .clock = [&] { return clock(); },
                      .sink = [&](std::string_view l) { lines.emplace_back(l); }});
  clock.now += absl::Seconds(12);
  p.Add({.parts = 3, .tokens = 300, .sp = 3});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "w: step 3  25 tok/s  SP 100% TP-only 0%  ETA 0:18");
}

TEST(ProgressReporterTest, FinishSaysNothingTheLastLineSaid) {
  FakeClock clock;
  int lines = 0;
  ProgressReporter p({.label = "t", .interval = absl::Seconds(1), .clock = [&] { return clock(); },
                      .sink = [&](std::string_view) { ++lines; }});
  clock.now += absl::Seconds(1);
  p.Add({.parts = 1, .sp = 1});
  EXPECT_EQ(lines, 1);
  clock.now += absl::Milliseconds(500);
  p.Add({.tokens = 5});  // no step ended
  p.Finish();
  EXPECT_EQ(lines, 1);
}

TEST(ProgressReporterTest, NothingAddedNoLine) {
  int lines = 0;
  ProgressReporter p({.label = "t", .clock = {}, .sink = [&](std::string_view) { ++lines; }});
  p.Finish();
  EXPECT_EQ(lines, 0);
}

}  // namespace
}  // namespace spgate
