// The gate-settings sweep of spgate-sim replay: see sim.h (ParseSweepAxis, Sweep). A grid
// of (max_length_cv, max_rs_wait_share), each point a replay of the same batches.
#include "tools/sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "policy/gate_config.h"

namespace spgate::sim {

absl::StatusOr<SweepAxis> ParseSweepAxis(const std::string& flag, const std::string& value) {
  std::vector<std::string> parts = absl::StrSplit(value, ':');
  SweepAxis a;
  a.flag = absl::StrCat("--", flag, "=", value);
  if (parts.size() != 3 || !absl::SimpleAtod(parts[0], &a.lo) ||
      !absl::SimpleAtod(parts[1], &a.hi) || !absl::SimpleAtod(parts[2], &a.step) ||
      !(a.step > 0) || a.hi < a.lo || (a.hi - a.lo) / a.step > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", value, ": want lo:hi:step with lo <= hi, step > 0, <= 1000 points"));
  }
  return a;
}

absl::StatusOr<SweepValues> SweepAxisValues(const SweepAxis& axis, const GateConfig& base,
                                            double GateConfig::*field) {
  struct Skipped {
    size_t index;
    double value;
    std::string why;
  };
  SweepValues out;
  std::vector<Skipped> skipped;
  size_t n = 0;
  for (double x = axis.lo; x <= axis.hi + axis.step / 2; x += axis.step, ++n) {
    GateConfig c = base;
    c.*field = std::round(x * 1e6) / 1e6;
    // The axes are independent: a value's validity does not depend on the other axis's.
    if (absl::Status s = ValidateGateConfig(c); !s.ok()) {
      skipped.push_back({n, c.*field, std::string(s.message())});
    } else {
      out.values.push_back(c.*field);
    }
  }
  // Skipped values come in runs at either end of the axis; each run's reason is its value
  // nearest the valid ones (the tightest statement of the bound), or the last one when
  // none is valid.
  std::vector<std::string> runs;
  for (size_t i = 0; i < skipped.size();) {
    size_t j = i;
    while (j + 1 < skipped.size() && skipped[j + 1].index == skipped[j].index + 1) ++j;
    const bool low_end = skipped[i].index == 0 && !out.values.empty();
    const std::string& why = (low_end || out.values.empty() ? skipped[j] : skipped[i]).why;
    std::vector<std::string> values;
    for (size_t k = i; k <= j; ++k) {
      if (j - i + 1 > 6 && k > i + 1 && k < j) {  // first two, "...", last
        if (k == i + 2) values.push_back("...");
        continue;
      }
      values.push_back(ShortestText(skipped[k].value));
    }
    runs.push_back(absl::StrCat(absl::StrJoin(values, ", "), " (", why, ")"));
    i = j + 1;
  }
  if (out.values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        axis.flag, ": no value on the grid is valid with the rest of the config: ",
        absl::StrJoin(runs, "; ")));
  }
  if (!runs.empty()) {
    out.skipped = absl::StrCat(axis.flag, ": skipping ", absl::StrJoin(runs, "; "));
  }
  return out;
}

absl::StatusOr<std::vector<SweepPoint>> Sweep(const SimOptions& o, const GateConfig& base,
                                              const SweepAxis& cv, const SweepAxis& rs) {
  absl::StatusOr<SweepValues> cvs = SweepAxisValues(cv, base, &GateConfig::max_length_cv);
  if (!cvs.ok()) return cvs.status();
  absl::StatusOr<SweepValues> rss = SweepAxisValues(rs, base, &GateConfig::max_rs_wait_share);
  if (!rss.ok()) return rss.status();
  for (const SweepValues* axis : {&*cvs, &*rss}) {
    if (!axis->skipped.empty()) {
      std::fprintf(stderr, "spgate-sim: note: %s\n", axis->skipped.c_str());
    }
  }
  std::vector<SweepPoint> points;
  // A line per grid point, not per step of each point's replay.
  SimOptions quiet = o;
  quiet.progress = false;
  const std::unique_ptr<ProgressReporter> progress =
      MakeProgress(o, "spgate-sim replay --sweep (grid points)",
                   static_cast<int64_t>(cvs->values.size() * rss->values.size()), 1);
  for (double x : cvs->values) {
    for (double y : rss->values) {
      GateConfig c = base;
      c.max_length_cv = x;
      c.max_rs_wait_share = y;
      absl::StatusOr<Summary> s = Replay(quiet, c);
      if (!s.ok()) return s.status();
      if (progress) {
        const int64_t tp = s->tp_only.steps;
        progress->Add({.parts = 1, .sp = s->all.steps - tp, .tp = tp});
      }
      points.push_back({c, std::move(*s)});
    }
  }
  if (progress) progress->Finish();
  std::stable_sort(points.begin(), points.end(), [](const SweepPoint& a, const SweepPoint& b) {
    const double ta = a.summary.all.time_s > 0 ? a.summary.all.tokens / a.summary.all.time_s : 0;
    const double tb = b.summary.all.time_s > 0 ? b.summary.all.tokens / b.summary.all.time_s : 0;
    return ta > tb;
  });
  return points;
}

namespace {
struct Row {
  double cv, rs, tps, p95, sp_frac;
  uint64_t peak;
};
Row RowOf(const SweepPoint& p, int groups) {
  const Summary& s = p.summary;
  return {p.config.max_length_cv,
          p.config.max_rs_wait_share,
          s.all.time_s > 0 ? groups * s.all.tokens / s.all.time_s : 0,
          Percentile(s.all.step_times, 0.95),
          s.all.steps > 0 ? static_cast<double>(s.sp.steps) / static_cast<double>(s.all.steps) : 0,
          std::max(s.sp.peak_memory, s.tp_only.peak_memory)};
}
}  // namespace

std::string SweepTable(const std::vector<SweepPoint>& points, int groups) {
  std::string out =
      "| max_length_cv | max_rs_wait_share | effective tokens/s | x best | step p95 s | SP share | peak GiB |\n"
      "|---:|---:|---:|---:|---:|---:|---:|\n";
  const double best = RowOf(points.front(), groups).tps;
  for (const SweepPoint& p : points) {
    const Row r = RowOf(p, groups);
    absl::StrAppendFormat(&out, "| %.3f | %.3f | %.0f | %.3f | %.3f | %.2f | %.1f |\n", r.cv, r.rs,
                          r.tps, best > 0 ? r.tps / best : 0, r.p95, r.sp_frac,
                          static_cast<double>(r.peak) / (1ull << 30));
  }
  return out;
}

std::string SweepJson(const std::vector<SweepPoint>& points, int groups) {
  std::vector<std::string> rows;
  for (const SweepPoint& p : points) {
    const Row r = RowOf(p, groups);
    rows.push_back(absl::StrFormat(
        "{\"max_length_cv\": %g, \"max_rs_wait_share\": %g, \"effective_tokens_per_s\": %.1f, "
        "\"step_time_p95_s\": %.6f, \"sp_share\": %.4f, \"peak_memory_bytes\": %d}",
        r.cv, r.rs, r.tps, r.p95, r.sp_frac, r.peak));
  }
  return "[\n    " + absl::StrJoin(rows, ",\n    ") + "\n  ]";
}

}  // namespace spgate::sim
