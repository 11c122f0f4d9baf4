// Published H100 / H200 measurements as data: device constants per hardware preset and
// collective bus bandwidth by message size, per collective kind, TP degree and NVLink
// SHARP (NVLS) on/off. The tables are policy/hardware/presets.csv and collectives.csv,
// each row with its source, embedded in the binary at build time (no file is read at run
// time); docs/sim.md says where every figure comes from. Pure: no I/O, no clocks.
//
// The invariant that matters: a collective's time is the nccl-tests algorithm time of its
// bytes, algbw = busbw / factor with factor 2(n-1)/n for all-reduce and (n-1)/n for
// all-gather and reduce-scatter (nccl-tests doc/PERFORMANCE.md), busbw interpolated
// linearly in log2(bytes) between the measured sizes. Below the smallest size the time is
// the smallest size's (calls there are latency-bound); above the largest the bus
// bandwidth is the largest size's.
//
// Usage:
//   absl::StatusOr<const spgate::HardwarePreset*> hw = spgate::FindHardwarePreset("h100-sxm");
//   double s = (*hw)->CollectiveSeconds(CollectiveKind::kAllReduce, /*tp=*/8, /*nvls=*/true,
//                                       /*bytes=*/256 << 20).value();
//   const CollectiveCurve* ag = (*hw)->Curve(CollectiveKind::kAllGather, 8, true);  // resolve once
//   double t = ag->Seconds(CollectiveKind::kAllGather, 8, bytes);                   // then cheap
#ifndef SPGATE_POLICY_HARDWARE_H_
#define SPGATE_POLICY_HARDWARE_H_

#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace spgate {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter };

// "all_reduce", "all_gather", "reduce_scatter".
absl::string_view CollectiveKindName(CollectiveKind kind);
// INVALID_ARGUMENT naming the value unless it is one of the names above.
absl::StatusOr<CollectiveKind> ParseCollectiveKind(absl::string_view name);

// busbw = algbw x this (nccl-tests doc/PERFORMANCE.md): 2(n-1)/n for all-reduce, (n-1)/n
// for all-gather and reduce-scatter; 0 for n <= 1 (no collective).
double BusBandwidthFactor(CollectiveKind kind, int ranks);

// One measured (or labelled-inferred) curve: bus bandwidth by message size.
class CollectiveCurve {
 public:
  struct Point {
    double bytes = 0;
    double bus_gbps = 0;
    std::string source;
  };
  // `points` sorted by bytes, strictly increasing, at least one, every value > 0.
  explicit CollectiveCurve(std::vector<Point> points) : points_(std::move(points)) {}

  // Bus bandwidth at `bytes`, GB/s: linear in log2(bytes) between the listed sizes, the
  // end values beyond them.
  double BusGbps(double bytes) const;
  // Seconds one call of `bytes` (nccl-tests' size: the whole buffer) takes among `ranks`:
  // bytes x factor / busbw; below the smallest size, the smallest size's time. 0 for
  // ranks <= 1 or bytes <= 0.
  double Seconds(CollectiveKind kind, int ranks, double bytes) const;
  const std::vector<Point>& points() const { return points_; }

 private:
  std::vector<Point> points_;
};

// A preset's device constants (presets.csv keys) and its collective curves.
struct HardwarePreset {
  std::string name;
  double device_tflops = 0;          // dense BF16 peak, TFLOP/s
  double gemm_mfu = 0;               // achieved fraction of that peak on GEMMs
  double attention_tflops = 0;       // achieved attention (FlashAttention-2) TFLOP/s
  double hbm_gbps = 0;               // achieved HBM bandwidth (STREAM), GB/s
  double device_memory_gib = 0;
  double collective_latency_us = 0;  // one small collective call
  double link_gbps = 0;              // flat bus bandwidth (a model without the curves)
  bool nvls = false;                 // NVLink SHARP available
  std::map<std::string, std::string> sources;  // key -> the row's source

  struct CurveKey {
    CollectiveKind kind;
    bool nvls;
    int tp;  // the curve serves TP degrees from tp up to the next listed one
    auto operator<=>(const CurveKey&) const = default;
  };
  std::map<CurveKey, CollectiveCurve> curves;

  // The curve a call of `kind` among `tp` ranks uses: with nvls, the NVLS curve of the
  // largest listed tp <= `tp` if there is one (NVLS needs >= 5 GPUs, NVIDIA/nccl #1455:
  // the tables list NVLS only at 8), else the non-NVLS curve of the largest listed
  // tp <= `tp`. nullptr when there is none (or tp <= 1).
  const CollectiveCurve* Curve(CollectiveKind kind, int tp, bool nvls) const;
  // Seconds of one call; NOT_FOUND naming the preset, kind and tp when no curve serves
  // it; 0 for tp <= 1.
  absl::StatusOr<double> CollectiveSeconds(CollectiveKind kind, int tp, bool nvls,
                                           double bytes) const;
};

// Parses the two tables (file names only label errors: "presets.csv:7:3: ..." — file,
// line, column). Every preset named in either file needs every key of presets.csv;
// INVALID_ARGUMENT on a malformed row, an unknown key or kind, a duplicate, a value that
// is not a finite number > 0 (nvls: 0 or 1; tp an integer >= 1; nvls column on|off),
// sizes of one curve not strictly increasing, or a preset without curves.
absl::StatusOr<std::vector<HardwarePreset>> ParseHardwareTables(
    absl::string_view presets_file, absl::string_view presets_text,
    absl::string_view collectives_file, absl::string_view collectives_text);

// The repository's tables, embedded at build time and parsed once.
const std::vector<HardwarePreset>& BuiltinHardwarePresets();
// NOT_FOUND listing the preset names unless `name` is one.
absl::StatusOr<const HardwarePreset*> FindHardwarePreset(absl::string_view name);
// The embedded text (tests check it parses).
absl::string_view EmbeddedPresetsCsv();
absl::string_view EmbeddedCollectivesCsv();

}  // namespace spgate

#endif  // SPGATE_POLICY_HARDWARE_H_
