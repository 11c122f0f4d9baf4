// The progress line (progress.h): counting under one lock, a line when the interval passed.
#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace spgate {

std::string FormatEta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string FormatRate(double v) {
  if (v >= 999.5e6) return absl::StrFormat("%.1fG", v / 1e9);
  if (v >= 999.5e3) return absl::StrFormat("%.1fM", v / 1e6);
  if (v >= 999.5) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

std::string FormatProgressLine(const ProgressSnapshot& s) {
  std::string out = s.label.empty() ? "" : absl::StrCat(s.label, ": ");
  // Whole steps done: a step is done when all its parts are.
  const int64_t done = static_cast<int64_t>(std::floor(s.steps + 1e-9));
  if (s.total_steps > 0) {
    absl::StrAppendFormat(&out, "step %d/%d (%d%%)", done, s.total_steps,
                          static_cast<int>(100.0 * s.steps / static_cast<double>(s.total_steps)));
  } else {
    absl::StrAppendFormat(&out, "step %d", done);
  }
  if (s.tokens_per_s >= 0) {
    absl::StrAppend(&out, "  ", FormatRate(s.tokens_per_s), s.simulated ? " sim " : " ",
                    s.rate_unit);
  }
  const int64_t decisions = s.sp + s.tp;
  if (decisions > 0) {
    const int sp = static_cast<int>(std::lround(100.0 * static_cast<double>(s.sp) /
                                                static_cast<double>(decisions)));
    absl::StrAppendFormat(&out, "  SP %d%% TP-only %d%%", sp, 100 - sp);
  }
  if (s.eta_s >= 0) absl::StrAppend(&out, "  ETA ", FormatEta(s.eta_s));
  return out;
}

bool ProgressWanted(bool flag, bool flag_given) {
  return flag_given ? flag : isatty(STDERR_FILENO) == 1;
}

ProgressReporter::ProgressReporter(Options options) : o_(std::move(options)) {
  const absl::Time now = o_.clock ? o_.clock() : absl::Now();
  MutexLock lock(&mu_);
  start_ = last_line_ = now;
}

void ProgressReporter::Add(const ProgressDelta& d) {
  MutexLock lock(&mu_);
  parts_ += d.parts;
  tokens_ += d.tokens;
  sim_seconds_ += d.sim_seconds;
  sp_ += d.sp;
  tp_ += d.tp;
  if (finished_ || ++calls_ % std::max<int64_t>(1, o_.check_every) != 0) return;
  const absl::Time now = o_.clock ? o_.clock() : absl::Now();
  if (now - last_line_ >= o_.interval) PrintLocked(now);
}

void ProgressReporter::Finish() {
  MutexLock lock(&mu_);
  if (finished_) return;
  finished_ = true;
  // Unless the last line already said it all.
  if (calls_ > 0 && (lines_ == 0 || parts_ != parts_at_last_line_)) {
    PrintLocked(o_.clock ? o_.clock() : absl::Now());
  }
}

int64_t ProgressReporter::lines() const {
  MutexLock lock(&mu_);
  return lines_;
}

void ProgressReporter::PrintLocked(absl::Time now) {
  ProgressSnapshot s;
  s.label = o_.label;
  s.steps = static_cast<double>(parts_) / static_cast<double>(std::max<int64_t>(1, o_.parts_per_step));
  s.total_steps = o_.total_steps;
  s.rate_unit = o_.rate_unit;
  s.sp = sp_;
  s.tp = tp_;
  if (sim_seconds_ > 0) {
    s.simulated = true;
    s.tokens_per_s = static_cast<double>(o_.parts_per_step) * tokens_ / sim_seconds_;
  } else if (tokens_ > 0 && now > last_line_) {  // a run that counts no tokens shows none
    s.tokens_per_s = (tokens_ - tokens_at_last_line_) / absl::ToDoubleSeconds(now - last_line_);
  }
  const double elapsed = absl::ToDoubleSeconds(now - start_);
  if (o_.total_steps > 0 && s.steps > 0) {
    s.eta_s = elapsed * (static_cast<double>(o_.total_steps) - s.steps) / s.steps;
  } else if (o_.total_duration > absl::ZeroDuration()) {
    s.eta_s = absl::ToDoubleSeconds(o_.total_duration) - elapsed;
  }
  const std::string line = FormatProgressLine(s);
  if (o_.sink) {
    o_.sink(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  last_line_ = now;
  tokens_at_last_line_ = tokens_;
  parts_at_last_line_ = parts_;
  ++lines_;
}

}  // namespace spgate
