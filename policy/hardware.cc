// The hardware tables: parsing with file:line:column errors, curve lookup and the
// nccl-tests bus-bandwidth conversion. See hardware.h.
#include "policy/hardware.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "policy/hardware_data.h"

namespace spgate {
namespace {

// One CSV field and the 1-based column it starts at.
struct Field {
  absl::string_view text;
  int column = 1;
};

struct Row {
  int line = 0;
  std::vector<Field> fields;
};

struct Csv {
  absl::string_view file;
  std::vector<Row> rows;  // data rows, after the header
};

absl::Status ErrorAt(absl::string_view file, int line, int column, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ":", column, ": ", what));
}

// Splits `text` into rows of exactly `header`'s columns; the last column takes the rest of
// the line (a source may hold commas). Blank lines and lines starting with '#' are skipped;
// the first other line must be `header`.
absl::StatusOr<Csv> ReadCsv(absl::string_view file, absl::string_view text,
                            absl::string_view header) {
  const int columns = static_cast<int>(std::count(header.begin(), header.end(), ',')) + 1;
  Csv csv{.file = file, .rows = {}};
  bool seen_header = false;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    if (!seen_header) {
      if (line != header) {
        return ErrorAt(file, line_no, 1, absl::StrCat("expected the header \"", header, "\""));
      }
      seen_header = true;
      continue;
    }
    Row row{.line = line_no, .fields = {}};
    size_t start = 0;
    for (int c = 0; c < columns; ++c) {
      const size_t comma = c + 1 < columns ? line.find(',', start) : absl::string_view::npos;
      if (c + 1 < columns && comma == absl::string_view::npos) {
        return ErrorAt(file, line_no, static_cast<int>(line.size()) + 1,
                       absl::StrCat(columns, " columns expected, got ", c + 1));
      }
      const size_t stop = comma == absl::string_view::npos ? line.size() : comma;
      row.fields.push_back({line.substr(start, stop - start), static_cast<int>(start) + 1});
      start = stop + 1;
    }
    csv.rows.push_back(std::move(row));
  }
  if (!seen_header) return ErrorAt(file, line_no + 1, 1, "no header row");
  return csv;
}

absl::StatusOr<double> PositiveNumber(const Csv& csv, const Row& row, int col,
                                      absl::string_view name) {
  const Field& f = row.fields[col];
  double v = 0;
  if (!absl::SimpleAtod(f.text, &v) || !std::isfinite(v) || !(v > 0)) {
    return ErrorAt(csv.file, row.line, f.column,
                   absl::StrCat(name, " must be a finite number > 0, got \"", f.text, "\""));
  }
  return v;
}

absl::StatusOr<std::string> Source(const Csv& csv, const Row& row, int col) {
  const Field& f = row.fields[col];
  if (f.text.empty()) return ErrorAt(csv.file, row.line, f.column, "the source is empty");
  return std::string(f.text);
}

HardwarePreset& PresetNamed(std::vector<HardwarePreset>& presets, absl::string_view name) {
  for (HardwarePreset& p : presets) {
    if (p.name == name) return p;
  }
  presets.emplace_back();
  presets.back().name = std::string(name);
  return presets.back();
}

constexpr absl::string_view kPresetKeys[] = {
    "device_tflops",     "gemm_mfu",   "attention_tflops", "hbm_gbps", "device_memory_gib",
    "collective_latency_us", "link_gbps", "nvls"};

absl::Status SetKey(const Csv& csv, const Row& row, HardwarePreset& p) {
  const Field& key = row.fields[1];
  const Field& value = row.fields[2];
  if (p.sources.count(std::string(key.text)) > 0) {
    return ErrorAt(csv.file, row.line, key.column,
                   absl::StrCat("duplicate key \"", key.text, "\" for ", p.name));
  }
  if (key.text == "nvls") {
    if (value.text != "0" && value.text != "1") {
      return ErrorAt(csv.file, row.line, value.column,
                     absl::StrCat("nvls must be 0 or 1, got \"", value.text, "\""));
    }
    p.nvls = value.text == "1";
  } else {
    double* field = key.text == "device_tflops"           ? &p.device_tflops
                    : key.text == "gemm_mfu"              ? &p.gemm_mfu
                    : key.text == "attention_tflops"      ? &p.attention_tflops
                    : key.text == "hbm_gbps"              ? &p.hbm_gbps
                    : key.text == "device_memory_gib"     ? &p.device_memory_gib
                    : key.text == "collective_latency_us" ? &p.collective_latency_us
                    : key.text == "link_gbps"             ? &p.link_gbps
                                                          : nullptr;
    if (field == nullptr) {
      return ErrorAt(csv.file, row.line, key.column,
                     absl::StrCat("unknown key \"", key.text, "\" (keys: ",
                                  absl::StrJoin(kPresetKeys, ", "), ")"));
    }
    absl::StatusOr<double> v = PositiveNumber(csv, row, 2, key.text);
    if (!v.ok()) return v.status();
    if (key.text == "gemm_mfu" && *v > 1) {
      return ErrorAt(csv.file, row.line, value.column, "gemm_mfu must be <= 1");
    }
    *field = *v;
  }
  absl::StatusOr<std::string> source = Source(csv, row, 3);
  if (!source.ok()) return source.status();
  p.sources[std::string(key.text)] = *std::move(source);
  return absl::OkStatus();
}

absl::Status ParsePresets(const Csv& csv, std::vector<HardwarePreset>& presets) {
  for (const Row& row : csv.rows) {
    if (row.fields[0].text.empty()) {
      return ErrorAt(csv.file, row.line, 1, "the hardware name is empty");
    }
    if (absl::Status s = SetKey(csv, row, PresetNamed(presets, row.fields[0].text)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCollectives(const Csv& csv, std::vector<HardwarePreset>& presets) {
  std::map<std::pair<std::string, HardwarePreset::CurveKey>, std::vector<CollectiveCurve::Point>>
      points;
  for (const Row& row : csv.rows) {
    const std::vector<Field>& f = row.fields;
    if (f[0].text.empty()) return ErrorAt(csv.file, row.line, 1, "the hardware name is empty");
    absl::StatusOr<CollectiveKind> kind = ParseCollectiveKind(f[1].text);
    if (!kind.ok()) return ErrorAt(csv.file, row.line, f[1].column, kind.status().message());
    int tp = 0;
    if (!absl::SimpleAtoi(f[2].text, &tp) || tp < 1) {
      return ErrorAt(csv.file, row.line, f[2].column,
                     absl::StrCat("tp must be an integer >= 1, got \"", f[2].text, "\""));
    }
    if (f[3].text != "on" && f[3].text != "off") {
      return ErrorAt(csv.file, row.line, f[3].column,
                     absl::StrCat("nvls must be on or off, got \"", f[3].text, "\""));
    }
    absl::StatusOr<double> bytes = PositiveNumber(csv, row, 4, "bytes");
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<double> bus = PositiveNumber(csv, row, 5, "bus_gbps");
    if (!bus.ok()) return bus.status();
    absl::StatusOr<std::string> source = Source(csv, row, 6);
    if (!source.ok()) return source.status();
    const auto key = std::make_pair(std::string(f[0].text),
                                    HardwarePreset::CurveKey{*kind, f[3].text == "on", tp});
    std::vector<CollectiveCurve::Point>& curve = points[key];
    if (!curve.empty() && !(*bytes > curve.back().bytes)) {
      return ErrorAt(csv.file, row.line, f[4].column,
                     absl::StrCat("bytes must increase along a curve (", f[0].text, " ",
                                  f[1].text, " tp ", tp, " nvls ", f[3].text, ")"));
    }
    curve.push_back({*bytes, *bus, *std::move(source)});
  }
  for (auto& [key, curve] : points) {
    HardwarePreset& p = PresetNamed(presets, key.first);
    p.curves.emplace(key.second, CollectiveCurve(std::move(curve)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

absl::StatusOr<CollectiveKind> ParseCollectiveKind(absl::string_view name) {
  for (CollectiveKind k :
       {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter}) {
    if (name == CollectiveKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown collective kind \"", name, "\" (all_reduce, all_gather or reduce_scatter)"));
}

double BusBandwidthFactor(CollectiveKind kind, int ranks) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  return (kind == CollectiveKind::kAllReduce ? 2.0 : 1.0) * (n - 1) / n;
}

double CollectiveCurve::BusGbps(double bytes) const {
  if (bytes <= points_.front().bytes) return points_.front().bus_gbps;
  if (bytes >= points_.back().bytes) return points_.back().bus_gbps;
  const auto hi = std::upper_bound(points_.begin(), points_.end(), bytes,
                                   [](double b, const Point& p) { return b < p.bytes; });
  const auto lo = hi - 1;
  const double f = std::log2(bytes / lo->bytes) / std::log2(hi->bytes / lo->bytes);
  return lo->bus_gbps + f * (hi->bus_gbps - lo->bus_gbps);
}

double CollectiveCurve::Seconds(CollectiveKind kind, int ranks, double bytes) const {
  if (ranks <= 1 || !(bytes > 0)) return 0;
  // Below the smallest measured size a call costs what the smallest did (latency-bound).
  const double b = std::max(bytes, points_.front().bytes);
  return b * BusBandwidthFactor(kind, ranks) / (BusGbps(b) * 1e9);
}

const CollectiveCurve* HardwarePreset::Curve(CollectiveKind kind, int tp, bool use_nvls) const {
  if (tp <= 1) return nullptr;
  for (const bool n : {true, false}) {
    if (n && !use_nvls) continue;
    const CollectiveCurve* best = nullptr;
    for (const auto& [key, curve] : curves) {  // ordered by (kind, nvls, tp): the last fits
      if (key.kind == kind && key.nvls == n && key.tp <= tp) best = &curve;
    }
    if (best != nullptr) return best;
  }
  return nullptr;
}

absl::StatusOr<double> HardwarePreset::CollectiveSeconds(CollectiveKind kind, int tp,
                                                         bool use_nvls, double bytes) const {
  if (tp <= 1) return 0.0;
  const CollectiveCurve* c = Curve(kind, tp, use_nvls);
  if (c == nullptr) {
    return absl::NotFoundError(absl::StrCat("hardware ", name, " has no ",
                                            CollectiveKindName(kind), " curve for tp ", tp));
  }
  return c->Seconds(kind, tp, bytes);
}

absl::StatusOr<std::vector<HardwarePreset>> ParseHardwareTables(
    absl::string_view presets_file, absl::string_view presets_text,
    absl::string_view collectives_file, absl::string_view collectives_text) {
  absl::StatusOr<Csv> presets_csv =
      ReadCsv(presets_file, presets_text, "hardware,key,value,source");
  if (!presets_csv.ok()) return presets_csv.status();
  absl::StatusOr<Csv> curves_csv = ReadCsv(collectives_file, collectives_text,
                                           "hardware,kind,tp,nvls,bytes,bus_gbps,source");
  if (!curves_csv.ok()) return curves_csv.status();
  std::vector<HardwarePreset> presets;
  if (absl::Status s = ParsePresets(*presets_csv, presets); !s.ok()) return s;
  if (absl::Status s = ParseCollectives(*curves_csv, presets); !s.ok()) return s;
  for (const HardwarePreset& p : presets) {
    for (absl::string_view key : kPresetKeys) {
      if (p.sources.count(std::string(key)) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(presets_file, ": hardware ", p.name, " has no \"", key, "\" row"));
      }
    }
    if (p.curves.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(collectives_file, ": hardware ", p.name, " has no collective rows"));
    }
  }
  return presets;
}

absl::string_view EmbeddedPresetsCsv() { return hardware_data::kPresetsCsv; }
absl::string_view EmbeddedCollectivesCsv() { return hardware_data::kCollectivesCsv; }

namespace {
const absl::StatusOr<std::vector<HardwarePreset>>& Builtin() {
  static const auto* parsed = new absl::StatusOr<std::vector<HardwarePreset>>(
      ParseHardwareTables("policy/hardware/presets.csv", EmbeddedPresetsCsv(),
                          "policy/hardware/collectives.csv", EmbeddedCollectivesCsv()));
  return *parsed;
}
}  // namespace

const std::vector<HardwarePreset>& BuiltinHardwarePresets() {
  static const std::vector<HardwarePreset> kNone;
  return Builtin().ok() ? *Builtin() : kNone;
}

absl::StatusOr<const HardwarePreset*> FindHardwarePreset(absl::string_view name) {
  if (!Builtin().ok()) return Builtin().status();
  std::vector<std::string> names;
  for (const HardwarePreset& p : *Builtin()) {
    if (p.name == name) return &p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(absl::StrCat("unknown hardware \"", name, "\" (presets: ",
                                          absl::StrJoin(names, ", "), ")"));
}

}  // namespace spgate
