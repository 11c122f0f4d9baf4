// Small harness shared by the kernel benchmarks: time a callable until a
// minimum wall time has passed and take the median, collect rows of
// (measurement, named baseline measured in the same run, ratio), print them as
// a table and write the same rows as JSON, so a script never parses the table;
// plus the drivers' common pieces (seeded inputs, fatal status checks, shape
// strings, packed offsets).
#ifndef SPGATE_BENCH_KERNELS_BENCH_UTIL_H_
#define SPGATE_BENCH_KERNELS_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace spgate::bench {

enum class Clock {
  kWall,       // steady_clock
  kThreadCpu,  // CPU time of the calling thread: immune to other processes'
               // load on a shared machine, valid for single-threaded kernels
};

struct TimingOptions {
  double min_seconds = 0.3;  // keep repeating until this much time is spent
  int min_reps = 3;
  int max_reps = 1000;
  Clock clock = Clock::kWall;
};

inline double Now(Clock c) {
  if (c == Clock::kThreadCpu) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median seconds per call of `fn` (after one warm-up call).
inline double MedianSeconds(const std::function<void()>& fn, const TimingOptions& opt) {
  fn();
  std::vector<double> times;
  double total = 0;
  while ((total < opt.min_seconds || static_cast<int>(times.size()) < opt.min_reps) &&
         static_cast<int>(times.size()) < opt.max_reps) {
    const double t0 = Now(opt.clock);
    fn();
    const double s = Now(opt.clock) - t0;
    times.push_back(s);
    total += s;
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// Medians of `a` and `b` timed alternately (a, b, a, b, ...), so that drift in
// the machine's load hits the kernel and its baseline alike.
inline std::pair<double, double> MedianSecondsPair(const std::function<void()>& a,
                                                   const std::function<void()>& b,
                                                   const TimingOptions& opt) {
  a();
  b();
  std::vector<double> ta, tb;
  double total = 0;
  while ((total < 2 * opt.min_seconds || static_cast<int>(ta.size()) < opt.min_reps) &&
         static_cast<int>(ta.size()) < opt.max_reps) {
    double t0 = Now(opt.clock);
    a();
    double t1 = Now(opt.clock);
    b();
    double t2 = Now(opt.clock);
    ta.push_back(t1 - t0);
    tb.push_back(t2 - t1);
    total += t2 - t0;
  }
  std::nth_element(ta.begin(), ta.begin() + ta.size() / 2, ta.end());
  std::nth_element(tb.begin(), tb.begin() + tb.size() / 2, tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

// One line of the result table: `value` in `unit` (GB/s or GFLOP/s or
// TFLOP/s), against `baseline` (name) = `baseline_value` in the same unit.
struct Row {
  std::string name;
  std::string shape;
  double seconds = 0;
  double value = 0;
  std::string unit;
  std::string baseline;
  double baseline_value = 0;
  double target = 0;  // minimum ratio, 0 = none
  double ratio() const { return baseline_value > 0 ? value / baseline_value : 0; }
  bool meets_target() const { return target <= 0 || ratio() >= target; }
};

inline std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

inline void PrintTable(const std::vector<Row>& rows) {
  std::printf("%-28s %-34s %10s %12s  %-30s %12s %7s %7s\n", "benchmark", "shape", "ms", "value",
              "baseline (same run)", "baseline", "ratio", "target");
  for (const Row& r : rows) {
    char target[16] = "-";
    if (r.target > 0) std::snprintf(target, sizeof(target), "%.2f%s", r.target,
                                    r.meets_target() ? "" : "!");
    std::printf("%-28s %-34s %10.3f %7.1f %-4s  %-30s %12.1f %7.2f %7s\n", r.name.c_str(),
                r.shape.c_str(), r.seconds * 1e3, r.value, r.unit.c_str(), r.baseline.c_str(),
                r.baseline_value, r.ratio(), target);
  }
}

inline bool WriteJson(const std::string& path, const std::string& bench,
                      const std::vector<std::pair<std::string, std::string>>& context,
                      const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) return false;
  f << "{\n  \"benchmark\": \"" << JsonEscape(bench) << "\",\n  \"context\": {";
  for (size_t i = 0; i < context.size(); ++i) {
    f << (i ? ", " : "") << "\"" << JsonEscape(context[i].first) << "\": \""
      << JsonEscape(context[i].second) << "\"";
  }
  f << "},\n  \"results\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "    {\"name\": \"%s\", \"shape\": \"%s\", \"seconds\": %.9g, \"value\": %.6g, "
                  "\"unit\": \"%s\", \"baseline\": \"%s\", \"baseline_value\": %.6g, "
                  "\"ratio\": %.4f, \"target\": %.3g, \"meets_target\": %s}",
                  JsonEscape(r.name).c_str(), JsonEscape(r.shape).c_str(), r.seconds, r.value,
                  r.unit.c_str(), JsonEscape(r.baseline).c_str(), r.baseline_value, r.ratio(),
                  r.target, r.meets_target() ? "true" : "false");
    f << buf << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  f << "  ]\n}\n";
  return static_cast<bool>(f);
}

// Reproducible inputs in [lo, hi) (an LCG: cheap for large buffers, and the
// same on every machine).
inline std::vector<float> Fill(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.0f;
  }
  return v;
}

// Exits with the status's message when it is not OK.
inline void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);  // benchmark driver, not library code
  }
}

// "k1=v1 k2=v2 ..." for a row's shape column.
inline std::string Shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (auto [k, v] : dims) s += (s.empty() ? "" : " ") + std::string(k) + "=" + std::to_string(v);
  return s;
}

// cu_seqlens of sequences of these lengths.
inline std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// Prints the table, writes the JSON to `path`, and returns main's exit code.
inline int Report(const std::string& path, const std::string& bench,
                  const std::vector<std::pair<std::string, std::string>>& context,
                  const std::vector<Row>& rows) {
  PrintTable(rows);
  if (!WriteJson(path, bench, context, rows)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  std::printf("results written to %s\n", path.c_str());
  return 0;
}

// --name=value flags; unknown flags are an error (returns false).
inline bool ParseFlag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) == 0 && arg[n] == '=') {
    *value = arg + n + 1;
    return true;
  }
  return false;
}

}  // namespace spgate::bench

#endif  // SPGATE_BENCH_KERNELS_BENCH_UTIL_H_
