// Length sources: the parser and the four distributions.
#include "worker/runtime/lengths.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/split_mix.h"

namespace spgate::runtime {
namespace {

// SplitMix64 stream: small, fast, and the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t NextU64() {
    const uint64_t z = SplitMix64(state_);
    state_ += kSplitMixGamma;
    return z;
  }
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Normal() {  // Box-Muller, one value per call
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
};

absl::Status Bad(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--lengths=", spec, ": ", why));
}

int64_t Clamp(double v, int64_t max_length) {
  if (!(v >= 1.0)) return 1;  // also NaN
  if (v >= static_cast<double>(max_length)) return max_length;
  return static_cast<int64_t>(std::llround(v));
}

class Lognormal final : public LengthSource {
 public:
  Lognormal(double mean, double sigma, uint64_t seed, int64_t max_length)
      : mean_(mean), sigma_(sigma), mu_(std::log(mean) - sigma * sigma / 2), rng_(seed),
        max_(max_length) {}
  int64_t Next() override { return Clamp(std::exp(mu_ + sigma_ * rng_.Normal()), max_); }
  std::string Describe() const override {
    return absl::StrCat("lognormal:mean=", mean_, ",sigma=", sigma_);
  }

 private:
  double mean_, sigma_, mu_;
  Rng rng_;
  int64_t max_;
};

class Bimodal final : public LengthSource {
 public:
  Bimodal(double short_len, double long_len, double p_long, double jitter, uint64_t seed,
          int64_t max_length)
      : short_(short_len), long_(long_len), p_long_(p_long), jitter_(jitter), rng_(seed),
        max_(max_length) {}
  int64_t Next() override {
    const double base = rng_.Uniform() < p_long_ ? long_ : short_;
    const double j = 1.0 + jitter_ * (2.0 * rng_.Uniform() - 1.0);
    return Clamp(base * j, max_);
  }
  std::string Describe() const override {
    return absl::StrCat("bimodal:short=", short_, ",long=", long_, ",p_long=", p_long_,
                        ",jitter=", jitter_);
  }

 private:
  double short_, long_, p_long_, jitter_;
  Rng rng_;
  int64_t max_;
};

class UniformLengths final : public LengthSource {
 public:
  UniformLengths(int64_t lo, int64_t hi, uint64_t seed, int64_t max_length)
      : lo_(lo), hi_(hi), rng_(seed), max_(max_length) {}
  int64_t Next() override {
    const uint64_t span = static_cast<uint64_t>(hi_ - lo_ + 1);
    return Clamp(static_cast<double>(lo_ + static_cast<int64_t>(rng_.NextU64() % span)), max_);
  }
  std::string Describe() const override { return absl::StrCat("uniform:min=", lo_, ",max=", hi_); }

 private:
  int64_t lo_, hi_;
  Rng rng_;
  int64_t max_;
};

class FileLengths final : public LengthSource {
 public:
  FileLengths(std::string path, std::vector<int64_t> lengths, int64_t max_length)
      : path_(std::move(path)), lengths_(std::move(lengths)), max_(max_length) {}
  int64_t Next() override {
    const int64_t v = lengths_[next_];
    next_ = (next_ + 1) % lengths_.size();
    return std::min(v, max_);
  }
  std::string Describe() const override { return absl::StrCat("file:", path_); }
  int64_t cycle_length() const override { return static_cast<int64_t>(lengths_.size()); }

 private:
  std::string path_;
  std::vector<int64_t> lengths_;
  size_t next_ = 0;
  int64_t max_;
};

// The first `after` lengths from one source, then the other's: a length mix that shifts.
class ShiftLengths final : public LengthSource {
 public:
  ShiftLengths(int64_t after, std::unique_ptr<LengthSource> first,
               std::unique_ptr<LengthSource> then)
      : after_(after), first_(std::move(first)), then_(std::move(then)) {}
  int64_t Next() override { return drawn_++ < after_ ? first_->Next() : then_->Next(); }
  std::string Describe() const override {
    return absl::StrCat("shift:after=", after_, "|", first_->Describe(), "|", then_->Describe());
  }

 private:
  int64_t after_;
  int64_t drawn_ = 0;
  std::unique_ptr<LengthSource> first_, then_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LengthSource>> ParseLengthSource(std::string_view spec_in,
                                                                uint64_t seed,
                                                                int64_t max_length) {
  const absl::string_view spec(spec_in.data(), spec_in.size());
  if (max_length < 1) return Bad(spec, "the maximum length must be >= 1");
  const size_t colon = spec.find(':');
  if (colon == absl::string_view::npos) {
    return Bad(spec,
               "expected KIND:PARAMS with KIND one of lognormal, bimodal, uniform, file, shift");
  }
  const absl::string_view kind = spec.substr(0, colon);
  const absl::string_view rest = spec.substr(colon + 1);
  if (kind == "shift") {
    std::vector<absl::string_view> parts = absl::StrSplit(rest, '|');
    int64_t after = 0;
    if (parts.size() != 3 || !absl::ConsumePrefix(&parts[0], "after=") ||
        !absl::SimpleAtoi(parts[0], &after) || after < 0) {
      return Bad(spec, "expected shift:after=N|FIRST|THEN with N >= 0 lengths");
    }
    if (absl::StartsWith(parts[1], "shift:") || absl::StartsWith(parts[2], "shift:")) {
      return Bad(spec, "a shift cannot nest another shift");
    }
    absl::StatusOr<std::unique_ptr<LengthSource>> first =
        ParseLengthSource(std::string_view(parts[1].data(), parts[1].size()), seed, max_length);
    if (!first.ok()) return first.status();
    absl::StatusOr<std::unique_ptr<LengthSource>> then =
        ParseLengthSource(std::string_view(parts[2].data(), parts[2].size()),
                          seed ^ 0x5DEECE66Dull, max_length);
    if (!then.ok()) return then.status();
    return std::unique_ptr<LengthSource>(
        new ShiftLengths(after, *std::move(first), *std::move(then)));
  }
  if (kind == "file") {
    std::ifstream in{std::string(rest)};
    if (rest.empty() || !in) {
      return absl::NotFoundError(absl::StrCat("--lengths=", spec, ": cannot read ", rest));
    }
    std::vector<int64_t> lengths;
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      absl::string_view v = absl::StripAsciiWhitespace(line);
      if (v.empty() || v[0] == '#') continue;
      int64_t len = 0;
      if (!absl::SimpleAtoi(v, &len) || len < 1) {
        return Bad(spec, absl::StrCat("line ", line_no, " is not a length >= 1: '", v, "'"));
      }
      lengths.push_back(len);
    }
    if (lengths.empty()) return Bad(spec, "the file holds no lengths");
    return std::unique_ptr<LengthSource>(
        new FileLengths(std::string(rest), std::move(lengths), max_length));
  }

  std::map<std::string, double> params;
  for (absl::string_view kv : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    double v = 0;
    if (eq == absl::string_view::npos || !absl::SimpleAtod(kv.substr(eq + 1), &v) ||
        !std::isfinite(v)) {
      return Bad(spec, absl::StrCat("'", kv, "' is not NAME=NUMBER"));
    }
    if (!params.emplace(std::string(kv.substr(0, eq)), v).second) {
      return Bad(spec, absl::StrCat(kv.substr(0, eq), "= is given twice"));
    }
  }
  auto take = [&](const char* name, std::optional<double> fallback,
                  double* out) -> absl::Status {
    auto it = params.find(name);
    if (it == params.end()) {
      if (!fallback) return Bad(spec, absl::StrCat("missing ", name, "="));
      *out = *fallback;
      return absl::OkStatus();
    }
    *out = it->second;
    params.erase(it);
    return absl::OkStatus();
  };
  auto finish = [&]() -> absl::Status {
    if (params.empty()) return absl::OkStatus();
    return Bad(spec, absl::StrCat("unknown parameter ", params.begin()->first, "="));
  };

  if (kind == "lognormal") {
    double mean = 0, sigma = 0;
    if (absl::Status s = take("mean", std::nullopt, &mean); !s.ok()) return s;
    if (absl::Status s = take("sigma", std::nullopt, &sigma); !s.ok()) return s;
    if (absl::Status s = finish(); !s.ok()) return s;
    if (mean < 1) return Bad(spec, "mean must be >= 1");
    if (sigma < 0 || sigma > 5) return Bad(spec, "sigma must be in [0, 5]");
    return std::unique_ptr<LengthSource>(new Lognormal(mean, sigma, seed, max_length));
  }
  if (kind == "bimodal") {
    double s_len = 0, l_len = 0, p = 0, jitter = 0;
    if (absl::Status s = take("short", std::nullopt, &s_len); !s.ok()) return s;
    if (absl::Status s = take("long", std::nullopt, &l_len); !s.ok()) return s;
    if (absl::Status s = take("p_long", std::nullopt, &p); !s.ok()) return s;
    if (absl::Status s = take("jitter", 0.1, &jitter); !s.ok()) return s;
    if (absl::Status s = finish(); !s.ok()) return s;
    if (s_len < 1 || l_len < s_len) return Bad(spec, "need 1 <= short <= long");
    if (p < 0 || p > 1) return Bad(spec, "p_long must be in [0, 1]");
    if (jitter < 0 || jitter >= 1) return Bad(spec, "jitter must be in [0, 1)");
    return std::unique_ptr<LengthSource>(new Bimodal(s_len, l_len, p, jitter, seed, max_length));
  }
  if (kind == "uniform") {
    double lo = 0, hi = 0;
    if (absl::Status s = take("min", std::nullopt, &lo); !s.ok()) return s;
    if (absl::Status s = take("max", std::nullopt, &hi); !s.ok()) return s;
    if (absl::Status s = finish(); !s.ok()) return s;
    if (lo < 1 || hi < lo || hi > 1e9 || lo != std::floor(lo) || hi != std::floor(hi)) {
      return Bad(spec, "need integers 1 <= min <= max <= 1e9");
    }
    return std::unique_ptr<LengthSource>(new UniformLengths(
        static_cast<int64_t>(lo), static_cast<int64_t>(hi), seed, max_length));
  }
  return Bad(spec, absl::StrCat("unknown distribution '", kind,
                                "' (lognormal, bimodal, uniform, file, shift)"));
}

}  // namespace spgate::runtime
