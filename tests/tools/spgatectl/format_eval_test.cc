// spgatectl eval's table (format_eval.cc): the decision, the memory gate's state, the
// head's values and the reason chain, each value as precise as it must be to tell it
// from its threshold.
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/tools/spgatectl/proto_test_util.h"
#include "tools/spgatectl/format.h"

namespace spgate::ctl {
namespace {

using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

using ::spgate::ctl::testing::ExpectJsonRoundTrip;
using ::spgate::ctl::testing::Parse;

TEST(ComparedText, FourDigitsOrAsManyAsTellTheValuesApart) {
  EXPECT_EQ(ComparedText(0.7354, 0.18), "0.7354");
  EXPECT_EQ(ComparedText(0.020382, 0.18), "0.02038");
  EXPECT_EQ(ComparedText(0.3, 0.22), "0.3");
  EXPECT_EQ(ComparedText(0.2200001, 0.22), "0.2200001");
  EXPECT_EQ(ComparedText(0.22, 0.2200001), "0.22");
  EXPECT_EQ(ComparedText(0.22, 0.22), "0.22");  // equal: four digits
}

TEST(FormatEvaluation, DecisionAndReasonChain) {
  const auto r = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: TENSOR_PARALLEL_ONLY reason: LENGTH_CV length_cv: 0.8612
               rolling_rs_wait_share: 0.3 config_version: 3 }
    checks { gate: "pin" outcome: "pass" detail: "no pin" }
    checks { gate: "memory" outcome: "pass" observed: 75161927680 threshold: 77309411328
             detail: "TP-only fits" }
    checks { gate: "length_cv" outcome: "fire" observed: 0.8612 threshold: 0.18
             detail: "length_cv 0.861 > 0.18" }
    checks { gate: "rs_wait" outcome: "skip" detail: "not reached" }
    config_used { max_length_cv: 0.18 max_rs_wait_share: 0.22 bucket_target_cv: 0.15
                  rs_wait_reenable_margin: 0.03 window_steps: 50 }
  )pb");
  EXPECT_EQ(FormatEvaluation(r, OutputFormat::kTable),
            "decision       tp_only (length_cv)\n"
            "memory gate    on\n"
            "length_cv      0.8612\n"
            "rs_wait_share  0.3 (rolling)\n"
            "config         version 3\n"
            "               max_length_cv=0.18 max_rs_wait_share=0.22 bucket_target_cv=0.15 "
            "rs_wait_reenable_margin=0.03\n"
            "               window_steps=50\n"
            "\n"
            "GATE       OUTCOME  OBSERVED  THRESHOLD  DETAIL\n"
            "pin        pass            -          -  no pin\n"
            "memory     pass     70.0 GiB   72.0 GiB  TP-only fits\n"
            "length_cv  fire       0.8612       0.18  length_cv 0.861 > 0.18\n"
            "rs_wait    skip            -          -  not reached\n");
  const std::string json = FormatEvaluation(r, OutputFormat::kJson);
  ExpectJsonRoundTrip(r, json);
  // A value a gate did not compare is not a 0 it measured: absent in JSON too (the pin's
  // and the skipped rs_wait's rows have neither key; memory's and length_cv's have both).
  EXPECT_THAT(json, HasSubstr("\"detail\": \"no pin\"\n  }"));
  EXPECT_THAT(json, HasSubstr("\"detail\": \"not reached\"\n  }"));
  EXPECT_THAT(json, HasSubstr("\"observed\": 0.8612"));
  // A skipped gate that compared values shows them (they were "-" for every skip): a
  // TP-only pin yielding to the memory gate compared TP-only's peak with the limit, bytes.
  v1::EvaluateGatesResponse held = r;
  v1::GateCheck* pin = held.mutable_checks(0);
  pin->set_outcome("skip");
  pin->set_observed(8e10);
  pin->set_threshold(7.5e10);
  EXPECT_THAT(FormatEvaluation(held, OutputFormat::kTable),
              HasSubstr("\npin        skip     74.5 GiB   69.8 GiB"));
}

// No budget: the memory gate was skipped, and the head says so next to the decision.
TEST(FormatEvaluation, SaysWhenTheMemoryGateIsOff) {
  const auto r = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: SEQUENCE_PARALLEL reason: GATES_PASSED }
    checks { gate: "memory" outcome: "skip" detail: "no memory budget in the plan" }
  )pb");
  EXPECT_THAT(FormatEvaluation(r, OutputFormat::kTable),
              HasSubstr("\nmemory gate    off: no --budget, so TP-only was not checked against "
                        "device memory\n"));
  // Values that differ are printed so that they read differently (a firing row read
  // "fire 0.22 0.22"), bytes exactly when their rounding ties.
  const auto close = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: TENSOR_PARALLEL_ONLY reason: RS_WAIT }
    checks { gate: "memory" outcome: "pass" observed: 5368709121 threshold: 5368709120 }
    checks { gate: "rs_wait" outcome: "fire" observed: 0.2200001 threshold: 0.22 }
  )pb");
  const std::string text = FormatEvaluation(close, OutputFormat::kTable);
  EXPECT_THAT(text, HasSubstr("5368709121 B  5368709120 B"));
  EXPECT_THAT(text, AllOf(HasSubstr(" 0.2200001 "), HasSubstr(" 0.22\n")));
  // A pin that decided first: the memory gate was not consulted (it said "on").
  const auto pinned = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: SEQUENCE_PARALLEL reason: PINNED }
    checks { gate: "pin" outcome: "fire" detail: "pinned to sp" }
  )pb");
  EXPECT_THAT(FormatEvaluation(pinned, OutputFormat::kTable),
              HasSubstr("\nmemory gate    not consulted: the pin decided first\n"));
}

// The head prints its values by the table's rule (ComparedText against the same
// threshold): it read "0.2200 (rolling)" above a row that fired at 0.2200001, and
// "length_cv 0.0204" above a row that said 0.02038.
TEST(FormatEvaluation, HeadReadsAsTheTable) {
  const auto fired = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: TENSOR_PARALLEL_ONLY reason: RS_WAIT length_cv: 0
               rolling_rs_wait_share: 0.2200001 }
    checks { gate: "length_cv" outcome: "pass" observed: 0 threshold: 0.18 }
    checks { gate: "rs_wait" outcome: "fire" observed: 0.2200001 threshold: 0.22 }
    config_used { max_length_cv: 0.18 max_rs_wait_share: 0.22 }
  )pb");
  std::string text = FormatEvaluation(fired, OutputFormat::kTable);
  EXPECT_THAT(text, HasSubstr("\nrs_wait_share  0.2200001 (rolling)\n"));
  EXPECT_THAT(text, ContainsRegex("\nrs_wait    fire +0.2200001 +0.22\n"));
  EXPECT_THAT(text, HasSubstr("\nlength_cv      0\n"));

  const auto bucketed = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: SEQUENCE_PARALLEL reason: GATES_PASSED length_cv: 0.020382 }
    checks { gate: "length_cv" outcome: "pass" observed: 0.020382 threshold: 0.18 }
    config_used { max_length_cv: 0.18 max_rs_wait_share: 0.22 }
  )pb");
  text = FormatEvaluation(bucketed, OutputFormat::kTable);
  EXPECT_THAT(text, HasSubstr("\nlength_cv      0.02038\n"));
  EXPECT_THAT(text, ContainsRegex("\nlength_cv  pass +0.02038 +0.18\n"));

  // A gate the chain did not reach: the head compares with the config's threshold.
  const auto unreached = Parse<v1::EvaluateGatesResponse>(R"pb(
    decision { mode: TENSOR_PARALLEL_ONLY reason: LENGTH_CV length_cv: 0.18000001
               rolling_rs_wait_share: 0.22000001 }
    checks { gate: "length_cv" outcome: "fire" observed: 0.18000001 threshold: 0.18 }
    config_used { max_length_cv: 0.18 max_rs_wait_share: 0.22 }
  )pb");
  text = FormatEvaluation(unreached, OutputFormat::kTable);
  EXPECT_THAT(text, HasSubstr("\nlength_cv      0.18000001\n"));
  EXPECT_THAT(text, HasSubstr("\nrs_wait_share  0.22000001 (rolling)\n"));
}

}  // namespace
}  // namespace spgate::ctl
