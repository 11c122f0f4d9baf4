// Length distributions and batch packing for spgate-sim; see lengths.h.
#include "tools/sim/lengths.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace spgate::sim {
namespace {

class Lognormal final : public LengthDistribution {
 public:
  Lognormal(double mean, double sigma, int64_t max)
      : dist_(std::log(mean) - sigma * sigma / 2, sigma), max_(max) {}
  int64_t Sample(std::mt19937_64& rng) override {
    return std::clamp<int64_t>(std::llround(dist_(rng)), 1, max_);
  }

 private:
  std::lognormal_distribution<double> dist_;
  int64_t max_;
};

class Bimodal final : public LengthDistribution {
 public:
  Bimodal(double s, double l, double p, int64_t max) : short_(s), long_(l), p_(p), max_(max) {}
  int64_t Sample(std::mt19937_64& rng) override {
    std::uniform_real_distribution<double> u(0, 1);
    const double center = u(rng) < p_ ? long_ : short_;
    return std::clamp<int64_t>(std::llround(center * (0.9 + 0.2 * u(rng))), 1, max_);
  }

 private:
  double short_, long_, p_;
  int64_t max_;
};

class Uniform final : public LengthDistribution {
 public:
  Uniform(int64_t lo, int64_t hi) : dist_(lo, hi) {}
  int64_t Sample(std::mt19937_64& rng) override { return dist_(rng); }

 private:
  std::uniform_int_distribution<int64_t> dist_;
};

class Trace final : public LengthDistribution {
 public:
  explicit Trace(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {}
  int64_t Sample(std::mt19937_64&) override {
    const int64_t v = lengths_[next_];
    next_ = (next_ + 1) % lengths_.size();
    return v;
  }
  bool is_trace() const override { return true; }
  size_t trace_size() const override { return lengths_.size(); }
  void Seek(size_t position) override { next_ = position % lengths_.size(); }

 private:
  std::vector<int64_t> lengths_;
  size_t next_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LengthDistribution>> ParseLengths(const std::string& spec,
                                                                  int64_t max_length) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--lengths=", spec, ": ", why));
  };
  std::pair<std::string, std::string> kind_args = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  const std::string& kind = kind_args.first;
  if (kind == "file") {
    std::ifstream in(kind_args.second);
    if (!in) return bad("cannot open " + kind_args.second);
    std::vector<int64_t> lengths;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      absl::string_view v = absl::StripAsciiWhitespace(line);
      if (v.empty() || v[0] == '#') continue;
      int64_t x;
      if (!absl::SimpleAtoi(v, &x) || x < 1 || x > max_length) {
        return bad(absl::StrCat("line ", n, ": \"", v, "\" is not a length in [1, ", max_length, "]"));
      }
      lengths.push_back(x);
    }
    if (lengths.empty()) return bad("no lengths in " + kind_args.second);
    return std::make_unique<Trace>(std::move(lengths));
  }
  std::map<std::string, double> args;
  for (absl::string_view kv : absl::StrSplit(kind_args.second, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    double v;
    if (!absl::SimpleAtod(p.second, &v) || !std::isfinite(v)) {
      return bad(absl::StrCat("\"", kv, "\" is not name=number"));
    }
    args[p.first] = v;
  }
  auto need = [&](std::initializer_list<const char*> names) -> absl::Status {
    for (const char* n : names) {
      if (!args.contains(n)) return bad(absl::StrCat("missing ", n, "="));
    }
    if (args.size() != names.size()) return bad("unexpected parameter");
    return absl::OkStatus();
  };
  if (kind == "lognormal") {
    if (absl::Status s = need({"mean", "sigma"}); !s.ok()) return s;
    if (args["mean"] < 1 || args["sigma"] <= 0 || args["sigma"] > 5) {
      return bad("need mean >= 1 and 0 < sigma <= 5");
    }
    return std::make_unique<Lognormal>(args["mean"], args["sigma"], max_length);
  }
  if (kind == "bimodal") {
    if (absl::Status s = need({"short", "long", "p_long"}); !s.ok()) return s;
    if (args["short"] < 1 || args["long"] < 1 || args["p_long"] < 0 || args["p_long"] > 1) {
      return bad("need short >= 1, long >= 1, 0 <= p_long <= 1");
    }
    return std::make_unique<Bimodal>(args["short"], args["long"], args["p_long"], max_length);
  }
  if (kind == "uniform") {
    if (absl::Status s = need({"min", "max"}); !s.ok()) return s;
    const auto lo = static_cast<int64_t>(args["min"]), hi = static_cast<int64_t>(args["max"]);
    if (lo < 1 || hi < lo || hi > max_length) return bad("need 1 <= min <= max <= max_length");
    return std::make_unique<Uniform>(lo, hi);
  }
  return bad("unknown distribution (lognormal, bimodal, uniform, file)");
}

BatchSource::BatchSource(std::shared_ptr<LengthDistribution> dist, BatchOptions options,
                         uint64_t seed)
    : dist_(std::move(dist)), options_(options), rng_(seed) {}

std::vector<int64_t> BatchSource::Pack(std::vector<int64_t>& pool, size_t& pos) {
  std::vector<int64_t> batch;
  int64_t tokens = 0;
  while (pos < pool.size()) {
    const int64_t s = std::min(pool[pos], options_.tokens_per_batch);
    if (!batch.empty() && tokens + s > options_.tokens_per_batch) break;
    batch.push_back(s);
    tokens += s;
    ++pos;
  }
  return batch;
}

void BatchSource::Refill() {
  const int64_t tpb = options_.tokens_per_batch;
  auto draw = [&] { return std::min(dist_->Sample(rng_), tpb); };
  if (!options_.bucketing) {
    // Sequences in arrival order until the next one would not fit; it starts the next.
    std::vector<int64_t> b;
    int64_t tokens = 0;
    while (tokens < tpb) {
      int64_t s;
      if (!carry_.empty()) {
        s = carry_.back();
        carry_.pop_back();
      } else {
        s = draw();
      }
      if (!b.empty() && tokens + s > tpb) {
        carry_.push_back(s);
        break;
      }
      b.push_back(s);
      tokens += s;
    }
    ready_.push_back(std::move(b));
    return;
  }
  // Bucketed: a pool of about bucket_pool_batches batches' worth, sorted by length and
  // cut into batches; a short last batch goes back into the next pool.
  std::vector<int64_t> pool = std::move(carry_);
  carry_.clear();
  int64_t tokens = std::accumulate(pool.begin(), pool.end(), int64_t{0});
  while (tokens < tpb * options_.bucket_pool_batches) {
    pool.push_back(draw());
    tokens += pool.back();
  }
  std::sort(pool.begin(), pool.end());
  std::vector<std::vector<int64_t>> batches;
  size_t pos = 0;
  while (pos < pool.size()) batches.push_back(Pack(pool, pos));
  if (batches.size() > 1 &&
      std::accumulate(batches.back().begin(), batches.back().end(), int64_t{0}) < tpb / 2) {
    carry_ = std::move(batches.back());
    batches.pop_back();
  }
  std::shuffle(batches.begin(), batches.end(), rng_);
  for (auto& b : batches) ready_.push_back(std::move(b));
}

std::vector<int64_t> BatchSource::Next() {
  while (ready_.empty()) Refill();
  std::vector<int64_t> b = std::move(ready_.front());
  ready_.pop_front();
  return b;
}

}  // namespace spgate::sim
