// The hardware tables: the embedded files parse and say what their sources say; bus
// bandwidth interpolates in log2(bytes) and clamps at the ends; a collective's time is
// nccl-tests' algorithm time per kind; NVLS serves only where the tables list it (TP 8,
// NVIDIA/nccl #1455); malformed tables are refused naming file, line and column.
#include "policy/hardware.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kPresets[] =
    "# comment\n"
    "hardware,key,value,source\n"
    "x,device_tflops,100,a\n"
    "x,gemm_mfu,0.5,b\n"
    "x,attention_tflops,40,c\n"
    "x,hbm_gbps,1000,d\n"
    "x,device_memory_gib,16,e\n"
    "x,collective_latency_us,10,f\n"
    "x,link_gbps,100,g\n"
    "x,nvls,1,h, with a comma\n";

// all_reduce NVLS at tp 8: 100 GB/s at 1 KiB (2^10), 200 at 1 MiB (2^20), 400 at 1 GiB
// (2^30); ring curves at tp 2 for every kind.
constexpr char kCurves[] =
    "hardware,kind,tp,nvls,bytes,bus_gbps,source\n"
    "x,all_reduce,8,on,1024,100,m\n"
    "x,all_reduce,8,on,1048576,200,m\n"
    "x,all_reduce,8,on,1073741824,400,m\n"
    "x,all_reduce,2,off,1024,50,i\n"
    "x,all_reduce,2,off,1073741824,300,i\n"
    "x,all_gather,2,off,1024,50,i\n"
    "x,all_gather,2,off,1073741824,300,i\n"
    "x,reduce_scatter,2,off,1024,50,i\n"
    "x,reduce_scatter,2,off,1073741824,300,i\n";

HardwarePreset Parsed() {
  absl::StatusOr<std::vector<HardwarePreset>> p =
      ParseHardwareTables("p.csv", kPresets, "c.csv", kCurves);
  EXPECT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 1u);
  return p->front();
}

TEST(HardwareTest, ParsesKeysSourcesAndCurves) {
  const HardwarePreset p = Parsed();
  EXPECT_EQ(p.name, "x");
  EXPECT_EQ(p.device_tflops, 100);
  EXPECT_EQ(p.gemm_mfu, 0.5);
  EXPECT_EQ(p.attention_tflops, 40);
  EXPECT_EQ(p.hbm_gbps, 1000);
  EXPECT_EQ(p.device_memory_gib, 16);
  EXPECT_EQ(p.collective_latency_us, 10);
  EXPECT_EQ(p.link_gbps, 100);
  EXPECT_TRUE(p.nvls);
  EXPECT_EQ(p.sources.at("nvls"), "h, with a comma");  // the source takes the rest
  EXPECT_EQ(p.curves.size(), 4u);
}

TEST(HardwareTest, BusBandwidthInterpolatesInLogSizeAndClamps) {
  const HardwarePreset p = Parsed();
  const CollectiveCurve* c = p.Curve(CollectiveKind::kAllReduce, 8, true);
  ASSERT_NE(c, nullptr);
  struct Case {
    double bytes, gbps;
  } cases[] = {
      {1024, 100},                  // a listed point
      {32768, 150},                 // 2^15: halfway in log2 between 2^10 and 2^20
      {1048576, 200},
      {std::pow(2.0, 25), 300},     // halfway between 2^20 and 2^30
      {std::pow(2.0, 22.5), 250},   // a quarter of the way
      {16, 100},                    // below the first size: the first value
      {std::pow(2.0, 40), 400},     // above the last: the last value
  };
  for (const Case& k : cases) EXPECT_NEAR(c->BusGbps(k.bytes), k.gbps, 1e-9) << k.bytes;
}

TEST(HardwareTest, SecondsAreTheAlgorithmTimePerKind) {
  const HardwarePreset p = Parsed();
  const double b = std::pow(2.0, 30);
  struct Case {
    CollectiveKind kind;
    int tp;
    bool nvls;
    double bytes, seconds;
  } cases[] = {
      // all-reduce busbw = algbw x 2(n-1)/n: at 8 ranks, 1 GiB at 400 GB/s (NVLS).
      {CollectiveKind::kAllReduce, 8, true, b, b * 2 * 7 / 8 / 400e9},
      // without NVLS the ring curve (listed at tp 2 for every degree above).
      {CollectiveKind::kAllReduce, 8, false, b, b * 2 * 7 / 8 / 300e9},
      // all-gather and reduce-scatter: (n-1)/n, and no NVLS curve: the ring one.
      {CollectiveKind::kAllGather, 8, true, b, b * 7 / 8 / 300e9},
      {CollectiveKind::kReduceScatter, 8, true, b, b * 7 / 8 / 300e9},
      // NVLS is listed at 8 only: at tp 4 it serves nothing, the ring curve does.
      {CollectiveKind::kAllReduce, 4, true, b, b * 2 * 3 / 4 / 300e9},
      {CollectiveKind::kAllGather, 2, false, b, b * 1 / 2 / 300e9},
      // tp 16: the largest listed tp <= 16 (NVLS at 8), factor at 16 ranks.
      {CollectiveKind::kAllReduce, 16, true, b, b * 2 * 15 / 16 / 400e9},
      // below the first size: the first size's time (latency-bound), not less.
      {CollectiveKind::kAllReduce, 8, true, 10, 1024 * 2 * 7.0 / 8 / 100e9},
      // one rank: no collective.
      {CollectiveKind::kAllReduce, 1, true, b, 0},
  };
  for (const Case& k : cases) {
    absl::StatusOr<double> s = p.CollectiveSeconds(k.kind, k.tp, k.nvls, k.bytes);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_NEAR(*s, k.seconds, 1e-15) << CollectiveKindName(k.kind) << " tp " << k.tp;
  }
}

TEST(HardwareTest, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllGather, 8), 0.875);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kReduceScatter, 4), 0.75);
  EXPECT_EQ(BusBandwidthFactor(CollectiveKind::kAllReduce, 1), 0);
}

TEST(HardwareTest, AMissingCurveIsNotFound) {
  absl::StatusOr<std::vector<HardwarePreset>> p = ParseHardwareTables(
      "p.csv", kPresets, "c.csv",
      "hardware,kind,tp,nvls,bytes,bus_gbps,source\nx,all_reduce,8,on,1024,100,m\n");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->front().Curve(CollectiveKind::kAllGather, 8, true), nullptr);
  EXPECT_EQ(p->front().Curve(CollectiveKind::kAllReduce, 4, true), nullptr);  // NVLS at 8 only
  EXPECT_THAT(p->front().CollectiveSeconds(CollectiveKind::kAllGather, 8, true, 1e6),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("all_gather curve for tp 8")));
}

TEST(HardwareTest, ParseErrorsNameFileLineAndColumn) {
  const std::string header = "hardware,kind,tp,nvls,bytes,bus_gbps,source\n";
  struct Case {
    std::string curves, message;
  } cases[] = {
      {"hardware,kind,tp\n", "c.csv:1:1: expected the header"},
      {"", "c.csv:1:1: no header row"},
      {header + "x,all_reduce,8,on,1024\n", "c.csv:2:23: 7 columns expected, got 5"},
      {header + "x,all_sum,8,on,1024,1,s\n", "c.csv:2:3: unknown collective kind \"all_sum\""},
      {header + "x,all_reduce,0,on,1024,1,s\n", "c.csv:2:14: tp must be an integer >= 1"},
      {header + "x,all_reduce,8,yes,1024,1,s\n", "c.csv:2:16: nvls must be on or off"},
      {header + "x,all_reduce,8,on,-4,1,s\n", "c.csv:2:19: bytes must be a finite number > 0"},
      {header + "x,all_reduce,8,on,1024,nan,s\n", "c.csv:2:24: bus_gbps must be a finite"},
      {header + "x,all_reduce,8,on,1024,1,\n", "c.csv:2:26: the source is empty"},
      {header + "x,all_reduce,8,on,2048,1,s\nx,all_reduce,8,on,1024,1,s\n",
       "c.csv:3:19: bytes must increase along a curve"},
      {header + ",all_reduce,8,on,1024,1,s\n", "c.csv:2:1: the hardware name is empty"},
  };
  for (const Case& k : cases) {
    EXPECT_THAT(ParseHardwareTables("p.csv", kPresets, "c.csv", k.curves),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(k.message)))
        << k.curves;
  }
  const std::string presets = "hardware,key,value,source\n";
  struct PresetCase {
    std::string presets, message;
  } preset_cases[] = {
      {presets + "x,flops,1,s\n", "p.csv:2:3: unknown key \"flops\""},
      {presets + "x,hbm_gbps,0,s\n", "p.csv:2:12: hbm_gbps must be a finite number > 0"},
      {presets + "x,gemm_mfu,1.5,s\n", "p.csv:2:12: gemm_mfu must be <= 1"},
      {presets + "x,nvls,2,s\n", "p.csv:2:8: nvls must be 0 or 1"},
      {presets + "x,hbm_gbps,1,s\nx,hbm_gbps,2,s\n", "p.csv:3:3: duplicate key \"hbm_gbps\""},
      {presets + "x,hbm_gbps,1,s\n", "p.csv: hardware x has no \"device_tflops\" row"},
  };
  for (const PresetCase& k : preset_cases) {
    EXPECT_THAT(ParseHardwareTables("p.csv", k.presets, "c.csv", kCurves),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(k.message)))
        << k.presets;
  }
  EXPECT_THAT(ParseHardwareTables("p.csv", kPresets, "c.csv", header),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.csv: hardware x has no collective rows")));
}

// The repository's tables, as embedded: both presets, every kind at TP 2-8, and the
// figures docs/sim.md quotes from the measurements.
TEST(HardwareTest, TheEmbeddedTablesParse) {
  ASSERT_TRUE(ParseHardwareTables("presets.csv", EmbeddedPresetsCsv(), "collectives.csv",
                                  EmbeddedCollectivesCsv())
                  .ok());
  for (const char* name : {"h100-sxm", "h200-sxm"}) {
    absl::StatusOr<const HardwarePreset*> p = FindHardwarePreset(name);
    ASSERT_TRUE(p.ok()) << p.status();
    for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                             CollectiveKind::kReduceScatter}) {
      for (int tp : {2, 4, 8}) {
        for (bool nvls : {false, true}) EXPECT_NE((*p)->Curve(k, tp, nvls), nullptr) << name;
      }
    }
    for (const auto& [key, curve] : (*p)->curves) {
      for (const CollectiveCurve::Point& pt : curve.points()) EXPECT_FALSE(pt.source.empty());
    }
  }
  const HardwarePreset& h100 = **FindHardwarePreset("h100-sxm");
  // ND H100 v5, all-reduce NVLS busbw: 234.45 GB/s at 16 MiB, 478.87 at 8 GiB.
  const CollectiveCurve* ar = h100.Curve(CollectiveKind::kAllReduce, 8, true);
  EXPECT_DOUBLE_EQ(ar->BusGbps(16 << 20), 234.45);
  EXPECT_DOUBLE_EQ(ar->BusGbps(8.0 * (1 << 30)), 478.87);
  // At TP 8 with NVLS, TP-only's all-reduce moves a large message ~1.3x faster per byte
  // than SP's all-gather + reduce-scatter pair (nccl-tests #212, #326).
  const double b = 512.0 * (1 << 20);
  const double pair = *h100.CollectiveSeconds(CollectiveKind::kAllGather, 8, true, b) +
                      *h100.CollectiveSeconds(CollectiveKind::kReduceScatter, 8, true, b);
  const double all_reduce = *h100.CollectiveSeconds(CollectiveKind::kAllReduce, 8, true, b);
  EXPECT_NEAR(pair / all_reduce, 478.87 / 370, 0.01);
  // ... and at TP 4 (no NVLS) about the same.
  EXPECT_NEAR(*h100.CollectiveSeconds(CollectiveKind::kAllGather, 4, true, b) * 2,
              *h100.CollectiveSeconds(CollectiveKind::kAllReduce, 4, true, b), 1e-12);
  EXPECT_EQ(h100.hbm_gbps, 2900);
  EXPECT_EQ((*FindHardwarePreset("h200-sxm"))->hbm_gbps, 4010);
  EXPECT_THAT(FindHardwarePreset("b200"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("h100-sxm, h200-sxm")));
}

}  // namespace
}  // namespace spgate
