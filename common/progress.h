// A progress line for long runs (spgate-worker, spgate-sim), printed to stderr at a steady
// interval — only when stderr is a terminal or the user asked (--progress), so logs, test
// output and JSON on stdout never change. The reporter counts what the caller adds (steps,
// tokens, decisions by mode) and reads its clock at most once per `check_every` calls, so
// a loop pays a few additions per step and nothing on a decision path. Thread-safe: the
// live simulator's driver threads add to one reporter.
//
// The line (docs/worker.md, "Progress lines"):
//   spgate-sim replay: step 120/1000 (12%)  3.1k sim tok/s/job  SP 80% TP-only 20%  ETA 0:41
// `step` is done/total steps (per group: each group-step adds 1 / parts_per_step); the rate's
// unit says whose tokens it counts (tok/s/group: one TP group's; tok/s/job: all of them); it is
// wall-clock over the last interval, or "sim" before the unit — the run's effective tokens/s so far
// (parts_per_step x tokens / simulated seconds) — when the caller adds simulated seconds;
// the modes are shares of the decisions so far; ETA from the mean step rate (a timed run:
// what is left of its duration). Unknown totals drop the percentage and the ETA.
//
// Usage:
//   spgate::ProgressReporter progress({.label = "spgate-sim replay", .total_steps = steps,
//                                      .parts_per_step = groups});
//   for (...) progress.Add({.parts = 1, .tokens = t, .sp = 1});
//   progress.Finish();
#ifndef SPGATE_COMMON_PROGRESS_H_
#define SPGATE_COMMON_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace spgate {

// What the caller did since its last Add.
struct ProgressDelta {
  int64_t parts = 0;   // group-steps (or steps, with parts_per_step 1)
  double tokens = 0;   // effective tokens
  int64_t sp = 0;      // decisions that ran SP
  int64_t tp = 0;      // decisions that ran TP-only
  double sim_seconds = 0;  // simulated step seconds (replay); 0 from a live run
};

// The totals a line is made of (FormatProgressLine).
struct ProgressSnapshot {
  std::string label;
  double steps = 0;          // done (parts / parts_per_step)
  int64_t total_steps = 0;   // 0: unknown
  double tokens_per_s = -1;  // < 0: none yet
  bool simulated = false;    // tokens_per_s is simulated, not wall-clock
  std::string rate_unit = "tok/s";  // whose tokens: "tok/s/group" or "tok/s/job"
  int64_t sp = 0, tp = 0;
  double eta_s = -1;         // < 0: unknown
};

// "spgate-sim replay: step 120/1000 (12%)  3.1k sim tok/s/job  SP 80% TP-only 20%  ETA 0:41".
std::string FormatProgressLine(const ProgressSnapshot& s);
// 0:41, 12:03, 1:02:03.
std::string FormatEta(double seconds);
// 950, 3.1k, 12.4M.
std::string FormatRate(double per_s);

// Whether to print progress: `flag` when the user gave --progress (true or false), else
// whether stderr is a terminal.
bool ProgressWanted(bool flag, bool flag_given);

class ProgressReporter {
 public:
  struct Options {
    std::string label;
    int64_t total_steps = 0;    // 0: unknown
    int64_t parts_per_step = 1;  // Add's parts per step (the groups of a live run)
    // A timed run: the ETA is what is left of this (total_steps is then 0).
    absl::Duration total_duration = absl::ZeroDuration();
    absl::Duration interval = absl::Seconds(2);
    // The rate's unit, naming whose tokens Add counts: "tok/s/group" (one TP group's) or
    // "tok/s/job" (every group's, summed).
    std::string rate_unit = "tok/s";
    int64_t check_every = 1;  // read the clock on every this many Add calls
    // Intended for testing: the clock (default absl::Now) and where lines go (default: a
    // line on stderr).
    std::function<absl::Time()> clock;
    std::function<void(std::string_view)> sink;
  };

  explicit ProgressReporter(Options options);
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Counts `d`; prints a line when the interval has passed since the last (checked on
  // every check_every-th call).
  void Add(const ProgressDelta& d);
  // The last line, once, whatever the interval (nothing if nothing was added, or if no step
  // ended since the last line).
  void Finish();
  int64_t lines() const;

 private:
  void PrintLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options o_;
  mutable Mutex mu_;
  absl::Time start_ ABSL_GUARDED_BY(mu_);
  absl::Time last_line_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t parts_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_ ABSL_GUARDED_BY(mu_) = 0;
  double sim_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sp_ ABSL_GUARDED_BY(mu_) = 0, tp_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_at_last_line_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t parts_at_last_line_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lines_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace spgate

#endif  // SPGATE_COMMON_PROGRESS_H_
