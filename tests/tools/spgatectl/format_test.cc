// spgatectl's output: tables are aligned and show what an operator needs; JSON uses
// the proto field names, prints every field and parses back into the same message.
#include "tools/spgatectl/format.h"
#include "tools/spgatectl/yaml.h"

#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "policy/adaptive_policy.h"
#include "proto/convert.h"
#include "tests/tools/spgatectl/proto_test_util.h"

namespace spgate::ctl {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using ::spgate::ctl::testing::ExpectJsonRoundTrip;
using ::spgate::ctl::testing::Parse;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);  // 2023-11-14T22:13:20Z

TEST(Table, AlignsColumnsAndTrimsTrailingBlanks) {
  Table t({{"NAME"}, {"COUNT", Table::Align::kRight}, {"NOTE"}});
  t.AddRow({"a", "1", "x"});
  t.AddRow({"longer", "12345", ""});
  t.AddRow({"b"});  // missing cells are blank
  EXPECT_EQ(t.Render(),
            "NAME    COUNT  NOTE\n"
            "a           1  x\n"
            "longer  12345\n"
            "b\n");
}

TEST(Names, ModesReasonsAndCodes) {
  EXPECT_EQ(ModeName(v1::SEQUENCE_PARALLEL), "sp");
  EXPECT_EQ(ModeName(v1::TENSOR_PARALLEL_ONLY), "tp_only");
  EXPECT_EQ(ModeName(v1::MODE_UNSPECIFIED), "-");
  EXPECT_EQ(ReasonName(v1::MEMORY_REQUIRES_SP), "memory_requires_sp");
  EXPECT_EQ(ReasonName(v1::REASON_UNSPECIFIED), "-");
  EXPECT_EQ(StatusCodeName(3), "INVALID_ARGUMENT");
  EXPECT_EQ(StatusCodeName(10), "ABORTED");
  EXPECT_EQ(StatusCodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(StatusCodeName(99), "CODE_99");
}

TEST(FormatRpcError, CommandCodeAndServerMessage) {
  EXPECT_EQ(FormatRpcError("gates set", 3, "max_length_cv: must be in (0, 10], got 11"),
            "spgatectl: gates set: INVALID_ARGUMENT: max_length_cv: must be in (0, 10], got 11\n");
  EXPECT_EQ(FormatRpcError("jobs show", 5, ""), "spgatectl: jobs show: NOT_FOUND: (no message)\n");
  // A server without the admin API (the worker port): said so, not "(no message)".
  EXPECT_THAT(FormatRpcError("jobs list", 12, ""),
              ::testing::HasSubstr("UNIMPLEMENTED: the server has no spgated admin API"));
}

const char* kJobConfig = R"pb(
  job_id: "llama"
  config {
    max_length_cv: 0.25 max_rs_wait_share: 0.22 bucket_target_cv: 0.15
    rs_wait_reenable_margin: 0.03 probe_interval_steps: 200 min_dwell_steps: 20
    window_steps: 50 memory_headroom: 0.9 policy: ADAPTIVE
  }
  overrides { max_length_cv: 0.25 policy: ADAPTIVE }
  version: 4
  effective_version: 6
  update_time { seconds: 1700000000 }
)pb";

TEST(FormatGateConfig, TableShowsValuesAndWhereTheyComeFrom) {
  const auto c = Parse<v1::VersionedGateConfig>(kJobConfig);
  EXPECT_EQ(FormatGateConfig(c, OutputFormat::kTable),
            "scope    job llama\n"
            "version  4 (effective 6)\n"
            "updated  2023-11-14T22:13:20Z\n"
            "\n"
            "FIELD                            VALUE  SOURCE\n"
            "max_length_cv                     0.25  override\n"
            "max_rs_wait_share                 0.22  inherited\n"
            "bucket_target_cv                  0.15  inherited\n"
            "rs_wait_reenable_margin           0.03  inherited\n"
            "probe_interval_steps               200  inherited\n"
            "min_dwell_steps                     20  inherited\n"
            "window_steps                        50  inherited\n"
            "memory_headroom                    0.9  inherited\n"
            "policy                        ADAPTIVE  override\n"
            "adaptive_cv_band_width               -  inherited\n"
            "adaptive_tokens_band_base            -  inherited\n"
            "adaptive_half_life_steps             -  inherited\n"
            "adaptive_min_samples                 -  inherited\n"
            "adaptive_margin                      -  inherited\n"
            "adaptive_explore_share               -  inherited\n"
            "adaptive_explore_floor               -  inherited\n"
            "adaptive_change_threshold            -  inherited\n"
            "adaptive_explore_boost_steps         -  inherited\n"
            "adaptive_flip_interval_steps         -  inherited\n"
            "adaptive_straggler_share             -  inherited\n");
}

TEST(FormatGateConfig, GlobalScopeNeverUpdated) {
  const std::string out = FormatGateConfig(v1::VersionedGateConfig(), OutputFormat::kTable);
  EXPECT_THAT(out, HasSubstr("scope    global\n"));
  EXPECT_THAT(out, HasSubstr("updated  never\n"));
  EXPECT_THAT(out, HasSubstr("max_length_cv                     -  inherited\n"));
}

// A value in full, as the daemon's messages print it: 0.2200001 is not the default 0.22.
TEST(FormatGateConfig, ValuesInFull) {
  v1::VersionedGateConfig c;
  c.mutable_config()->set_max_rs_wait_share(0.2200001);
  EXPECT_THAT(FormatGateConfig(c, OutputFormat::kTable), HasSubstr("0.2200001"));
  v1::ListConfigHistoryResponse history;
  v1::AuditEntry* e = history.add_entries();
  v1::FieldChange* f = e->add_changes();
  f->set_field("max_rs_wait_share");
  f->mutable_old_value()->set_set(true);
  f->mutable_old_value()->set_value(0.22);
  f->mutable_new_value()->set_set(true);
  f->mutable_new_value()->set_value(0.2200001);
  EXPECT_THAT(FormatHistory(history, OutputFormat::kTable), HasSubstr("max_rs_wait_share 0.22 -> 0.2200001"));
}

// The global scope's values come from an override, the --config file or the built-in
// defaults, as the daemon's file_config says ("inherited" said neither); a file value
// equal to the default is still the file's.
TEST(FormatGateConfig, GlobalScopeSaysDefaultOrConfigFile) {
  v1::VersionedGateConfig c;
  *c.mutable_config() = ToProto(GateConfig{});
  c.mutable_config()->set_max_length_cv(0.3);
  c.mutable_config()->set_window_steps(80);
  c.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  c.mutable_overrides()->set_window_steps(80);
  c.mutable_file_config()->set_max_length_cv(0.3);
  c.mutable_file_config()->set_policy(v1::GateConfig::ADAPTIVE);
  c.mutable_file_config()->set_adaptive_margin(0.01);
  const std::string out = FormatGateConfig(c, OutputFormat::kTable);
  EXPECT_THAT(out, HasSubstr("max_length_cv                      0.3  config file\n"));
  EXPECT_THAT(out, HasSubstr("max_rs_wait_share                 0.22  default\n"));
  EXPECT_THAT(out, HasSubstr("window_steps                        80  override\n"));
  EXPECT_THAT(out, HasSubstr("policy                        ADAPTIVE  config file\n"));
  EXPECT_THAT(out, HasSubstr("adaptive_margin                   0.01  config file\n"));
  EXPECT_THAT(out, HasSubstr("adaptive_min_samples                 8  default\n"));
  // An older daemon sends no file_config: not guessed.
  c.clear_file_config();
  EXPECT_THAT(FormatGateConfig(c, OutputFormat::kTable),
              HasSubstr("max_length_cv                      0.3  inherited\n"));
}

TEST(FormatGateConfig, JsonUsesProtoFieldNamesAndParsesBack) {
  const auto c = Parse<v1::VersionedGateConfig>(kJobConfig);
  const std::string json = FormatGateConfig(c, OutputFormat::kJson);
  EXPECT_THAT(json, HasSubstr("\"effective_version\": \"6\""));  // int64 as a string
  EXPECT_THAT(json, HasSubstr("\"max_length_cv\": 0.25"));
  EXPECT_THAT(json, HasSubstr("\"update_time\": \"2023-11-14T22:13:20Z\""));
  EXPECT_THAT(json, Not(HasSubstr("effectiveVersion")));
  ExpectJsonRoundTrip(c, json);
}

TEST(FormatJobList, TableAndEmpty) {
  const auto jobs = Parse<v1::ListJobsResponse>(R"pb(
    jobs { job_id: "llama" groups: 2 ranks_active: 8 steps_decided: 1200
           group_steps_decided: 1200 sp_groups: 1 tp_groups: 1 config_version: 3 }
    jobs { job_id: "gpt-long-context" groups: 16 ranks_active: 60 ranks_stale: 4
           steps_decided: 56 group_steps_decided: 7 sp_groups: 16 config_version: 12 }
  )pb");
  // A pipelined job decides each micro-batch: 7 group-steps of 8 micro-batches are 56.
  EXPECT_EQ(FormatJobList(jobs, OutputFormat::kTable),
            "JOB               GROUPS  RANKS  STALE  GROUP_STEPS  MICROBATCHES  SP_GROUPS  "
            "TP_GROUPS  VERSION\n"
            "llama                  2      8      0         1200          1200          1  "
            "        1        3\n"
            "gpt-long-context      16     60      4            7            56         16  "
            "        0       12\n");
  EXPECT_EQ(FormatJobList(v1::ListJobsResponse(), OutputFormat::kTable), "no jobs\n");
  // Scripts see an empty list rather than a missing key.
  EXPECT_EQ(FormatJobList(v1::ListJobsResponse(), OutputFormat::kJson), "{\n \"jobs\": []\n}\n");
}

const char* kJob = R"pb(
  summary { job_id: "llama" groups: 2 ranks_active: 7 ranks_stale: 1 steps_decided: 1200
            group_steps_decided: 1200 sp_groups: 1 tp_groups: 1 config_version: 3
            incarnation: "launch-7" hardware_id: "NVIDIA H200 sm_90 140GiB" }
  groups { group: 0 group_size: 4 ranks_active: 4 mode: SEQUENCE_PARALLEL reason: GATES_PASSED
           last_step: 600 rolling_rs_wait_share: 0.031 all_gather_tail_s: 0.0012
           norm_stall_ratio: 0.01 mode_switches: 2 slowest_rank: 3 slowest_step_time_s: 0.812 }
  groups { group: 1 group_size: 4 ranks_active: 3 ranks_stale: 1 mode: TENSOR_PARALLEL_ONLY
           reason: PINNED last_step: 599 rs_wait_fallback: true mode_switches: 1 slowest_rank: -1
           pin { job_id: "llama" group: 1 mode: TENSOR_PARALLEL_ONLY
                 expire_time { seconds: 1700000600 } } }
  mode_stats { mode: SEQUENCE_PARALLEL steps: 50 microbatches: 50 effective_tokens_per_s: 123456.7
               step_time_p95_s: 0.81 peak_memory_bytes: 69793218560 peak_memory_vs_tp: 0.81
               tokens_per_s_vs_tp: 1.04 step_time_p95_vs_tp: 0.98 }
  mode_stats { mode: TENSOR_PARALLEL_ONLY steps: 50 microbatches: 50
               effective_tokens_per_s: 118708.4
               step_time_p95_s: 0.8265 peak_memory_bytes: 86167781376 peak_memory_vs_tp: 1
               tokens_per_s_vs_tp: 1 step_time_p95_vs_tp: 1 }
  decisions { mode: SEQUENCE_PARALLEL reason: GATES_PASSED count: 900 }
  decisions { mode: TENSOR_PARALLEL_ONLY reason: LENGTH_CV count: 300 }
  config { job_id: "llama" overrides { max_length_cv: 0.25 } version: 3 effective_version: 3
           config { policy: ADAPTIVE adaptive_min_samples: 8 adaptive_margin: 0.02
                    adaptive_half_life_steps: 500 adaptive_cv_band_width: 0.1
                    adaptive_tokens_band_base: 8192 } }
  learned { cells { band: 1 mode: SEQUENCE_PARALLEL tokens: 1000000 seconds: 10 weight: 20
                    last_step: 1199 }
            cells { band: 1 mode: TENSOR_PARALLEL_ONLY tokens: 1100000 seconds: 10 weight: 9
                    last_step: 1199 changed_step: 1100 }
            cells { band: 6 mode: SEQUENCE_PARALLEL tokens: 500000 seconds: 5 weight: 3
                    last_step: 1199 }
            switch_cost { seconds: 0.2 weight: 5 last_step: 1150 } }
  learned_at_step: 1199
  adaptive_gain_ratio: 1.07
  exploration_steps: 35
  pins { job_id: "llama" group: 1 mode: TENSOR_PARALLEL_ONLY expire_time { seconds: 1700000600 } }
  local_decisions: 5
  memory_overrides: 2
)pb";

// A band whose TP-only cell is stale and whose pairs disagree with it: PAIRS shows their
// weight, and TP_TOK/S, TP_N and TP/SP are read through them (docs/design.md §11).
TEST(FormatJob, LearnedShowsABandReadThroughItsPairs) {
  const auto job = Parse<v1::Job>(R"pb(
    summary { job_id: "llama" }
    config { config { policy: ADAPTIVE adaptive_min_samples: 8 adaptive_margin: 0.02
                      adaptive_half_life_steps: 500 adaptive_cv_band_width: 0.1
                      adaptive_tokens_band_base: 8192 } }
    learned { cells { band: 1 mode: SEQUENCE_PARALLEL tokens: 1000000 seconds: 10 weight: 20
                      last_step: 1199 }
              cells { band: 1 mode: TENSOR_PARALLEL_ONLY tokens: 1100000 seconds: 10 weight: 20
                      last_step: 1100 }
              pairs { band: 1 sp_seconds: 9 tp_seconds: 10 weight: 12 last_step: 1100 } }
    learned_at_step: 1199
  )pb");
  const std::string text = FormatJob(job, OutputFormat::kTable, kNow);
  // TP-only: SP's 100000 × 0.9 (not its own stale 110000); its weight the pairs', 12
  // decayed 99 steps at a half-life of 500.
  EXPECT_THAT(text, HasSubstr("cv0.tok1  cv [0, 0.1), tokens [8192, 16384)    100000  20.0     "
                              "90000  10.5  0.900   10.5        -  sp\n"))
      << text;
}

// A pipelined job: its layout, why it is locked to SP, a row per stage, and its MODES and
// DECISIONS counted in micro-batches (by the mode each ran), beside the group-steps.
TEST(FormatJob, PipelinedJobsShowLayoutStagesAndSpRequired) {
  const auto job = Parse<v1::Job>(R"pb(
    summary { job_id: "pipe" groups: 3 ranks_active: 6 steps_decided: 40
              group_steps_decided: 10 sp_groups: 3 }
    mode_stats { mode: SEQUENCE_PARALLEL steps: 10 microbatches: 36 effective_tokens_per_s: 120
                 step_time_p95_s: 0.1 peak_memory_bytes: 1024 }
    mode_stats { mode: TENSOR_PARALLEL_ONLY steps: 4 microbatches: 4 effective_tokens_per_s: 60
                 step_time_p95_s: 0.2 peak_memory_bytes: 1024 tokens_per_s_vs_tp: 1
                 step_time_p95_vs_tp: 1 peak_memory_vs_tp: 1 }
    decisions { mode: SEQUENCE_PARALLEL reason: SP_REQUIRED count: 40 }
    groups { group: 0 group_size: 2 ranks_active: 2 mode: SEQUENCE_PARALLEL
             reason: SP_REQUIRED last_step: 9 coordinates { stage: 0 }
             predicted_stage_peak_bytes: 2147483648 }
    groups { group: 1 group_size: 2 ranks_active: 2 mode: SEQUENCE_PARALLEL
             reason: SP_REQUIRED last_step: 9 coordinates { stage: 1 }
             predicted_stage_peak_bytes: 1073741824 last_step_tp_only_microbatches: 3 }
    groups { group: 2 group_size: 2 ranks_active: 2 mode: SEQUENCE_PARALLEL
             reason: SP_REQUIRED last_step: 9 coordinates { dp_index: 1 stage: 1 }
             predicted_stage_peak_bytes: 1610612736 last_step_tp_only_microbatches: 1 }
    layout { tp: 2 pp: 2 vp: 1 cp: 1 dp: 2 microbatches: 4 schedule: SCHEDULE_1F1B }
    sp_required: "cuda_graphs"
    stage_learned {
      cells { band: 0 mode: SEQUENCE_PARALLEL tokens: 1200 seconds: 1 weight: 10 last_step: 9 }
    }
    stage_learned {}
  )pb");
  const std::string text = FormatJob(job, OutputFormat::kTable, kNow);
  // A learned table per stage, each at its own newest step.
  EXPECT_THAT(text, HasSubstr("\nLEARNED stage 0 (policy STATIC; tokens/s and weighted samples "
                              "at step 9;"));
  EXPECT_THAT(text, HasSubstr("    1200  10.0"));
  EXPECT_THAT(text, HasSubstr("\nLEARNED stage 1 (policy STATIC)\n(nothing learned yet)\n"));
  EXPECT_THAT(text, HasSubstr("layout            tp=2 pp=2 vp=1 cp=1 dp=2 microbatches=4 1f1b\n"));
  EXPECT_THAT(text, HasSubstr("sp required       cuda_graphs (needs SP throughout"));
  EXPECT_THAT(text, HasSubstr("STAGES (last step plan of each group; TP_ONLY: its micro-batches "
                              "decided TP-only)\n"
                              "STAGE  GROUPS  TP_ONLY  PREDICTED_PEAK\n"
                              "    0       1      0/4         2.0 GiB\n"
                              "    1       2      4/8         1.5 GiB\n"));
  EXPECT_THAT(text, HasSubstr("group-steps       10 decided\nmicro-batches     40 decided\n"));
  EXPECT_THAT(text, HasSubstr(
      "MODES (rolling window of micro-batches, by the mode each ran; tokens/s per group over "
      "each micro-batch's compute on its stage; ratios relative to tp_only)\n"
      "MODE     MICROBATCHES  GROUP_STEPS  TOKENS/S/GROUP  vs TP  MB_COMPUTE_P95_S  vs TP  "
      "PEAK_MEMORY  vs TP\n"
      "sp                 36           10             120      -            0.1000      -  "
      "    1.0 KiB      -\n"
      "tp_only             4            4              60  1.00x            0.2000  1.00x  "
      "    1.0 KiB  1.00x\n"));
  EXPECT_THAT(text, HasSubstr("DECISIONS (micro-batches)\n"));
}

TEST(FormatJob, TablesForGroupsModesDecisionsAndPins) {
  const auto job = Parse<v1::Job>(kJob);
  EXPECT_EQ(
      FormatJob(job, OutputFormat::kTable, kNow),
      "job               llama\n"
      "hardware          NVIDIA H200 sm_90 140GiB\n"
      "groups            2 (1 sp, 1 tp_only)\n"
      "ranks             7 active, 1 stale\n"
      "group-steps       1200 decided\n"
      "local decisions   5\n"
      "memory overrides  2\n"
      "config            version 3, overrides: max_length_cv=0.25\n"
      "\n"
      "GROUPS\n"
      "GROUP  SIZE  ACTIVE  STALE  MODE     REASON        LAST_STEP  RS_WAIT  AG_TAIL_MS  "
      "NORM_STALL  SLOWEST    FALLBACK  SWITCHES  PIN\n"
      "    0     4       4      0  sp       gates_passed        600    0.031        1.20       "
      "0.010  r3:0.812s  -                2  -\n"
      "    1     4       3      1  tp_only  pinned              599        -        0.00       "
      "0.000  -          rs_wait          1  tp_only in 10m\n"
      "\n"
      "MODES (rolling window of group-steps; tokens/s per group; ratios relative to tp_only)\n"
      "MODE     GROUP_STEPS  TOKENS/S/GROUP  vs TP  STEP_P95_S  vs TP  PEAK_MEMORY  vs TP\n"
      "sp                50          123457  1.04x      0.8100  0.98x     65.0 GiB  0.81x\n"
      "tp_only           50          118708  1.00x      0.8265  1.00x     80.2 GiB  1.00x\n"
      "\n"
      "DECISIONS (group-steps)\n"
      "MODE     REASON        COUNT\n"
      "sp       gates_passed    900\n"
      "tp_only  length_cv       300\n"
      "\n"
      "LEARNED (policy ADAPTIVE; tokens/s and weighted samples at step 1199; gain vs static "
      "1.07x; 35 exploration steps; switch cost 0.04 s)\n"
      "prior: not yet (too few SP steps with collective telemetry for the prior's base "
      "rate)\n"
      "BAND      RANGE                                 SP_TOK/S  SP_N  TP_TOK/S  TP_N  TP/SP  "
      "PAIRS  CHANGED  PREFERRED\n"
      "cv0.tok1  cv [0, 0.1), tokens [8192, 16384)       100000  20.0    110000   9.0  1.100  "
      "    -     1100  tp_only\n"
      "cv1.tok2  cv [0.1, 0.2), tokens [16384, 32768)    100000   3.0         -   0.0      -  "
      "    -        -  static gates (too few samples)\n"
      "\n"
      "PINS\n"
      "TARGET   MODE     EXPIRES               LEFT\n"
      "group 1  tp_only  2023-11-14T22:23:20Z  in 10m\n");
}

// The prior's line: its calibration once it answers, and what it says for a band without
// samples in PREFERRED (docs/design.md §11, "The prior").
TEST(FormatJob, LearnedShowsThePriorsCalibrationAndChoice) {
  GateConfig c;
  c.policy = GatePolicyKind::kAdaptive;
  ThroughputTable t;
  t.SetPriorInputs(PriorInputs{.tp = 8, .hidden = 5120, .layers = 8});
  // SP steps: 4 µs a token, a wait share of 0.2 per unit CV, 0.3 ms of all-gather latency.
  for (int i = 0; i < 40; ++i) {
    const double tokens = 8192.0 * (1 + i % 4), cv = 0.1 * (i % 5);
    const double seconds = 4e-6 * tokens * (1 + 0.1 * cv), ag = 3e-4 + 6e-7 * tokens;
    ASSERT_TRUE(t.ObserveCollectives(c, Mode::kSequenceParallel, i, tokens, cv, seconds, ag,
                                     ag + (0.02 + 0.2 * cv) * seconds));
  }
  // Three measured bands where TP-only takes 8 % less time than SP at CV 0.175-0.275, and
  // a band (CV 2, the top one) with SP samples only: the prior says TP-only there.
  for (int cv_band : {3, 4, 5}) {
    const double cv = (cv_band + 0.5) * 0.05;
    const int band = BandOf(c, cv, 16384);
    const double sp = 4e-6 * 16384 * (1 + 0.1 * cv);
    for (int i = 0; i < 10; ++i) {
      t.Observe(c, band, Mode::kSequenceParallel, 30 + i, 16384, sp);
      t.Observe(c, band, Mode::kTensorParallelOnly, 30 + i, 16384, 0.92 * sp);
    }
  }
  for (int i = 0; i < 3; ++i) t.Observe(c, BandOf(c, 2.0, 16384), Mode::kSequenceParallel, 41, 16384, 0.1);
  v1::Job job;
  job.mutable_summary()->set_job_id("j");
  *job.mutable_config()->mutable_config() = ToProto(c);
  *job.mutable_learned() = ToProto(t);
  job.set_learned_at_step(41);
  const std::string out = FormatJob(job, OutputFormat::kTable, kNow);
  EXPECT_THAT(out, ::testing::ContainsRegex(
                       "prior: 4(\\.[0-9]+)? us/token SP over 3[0-9.]+ SP steps; SP's extra "
                       "latency 0\\.3 ms \\[telemetry\\]; wait 0\\.2 of a step per unit CV"));
  EXPECT_THAT(out, HasSubstr("prior: tp_only (too few samples)")) << out;
}

TEST(FormatJob, EmptySectionsSayNone) {
  const std::string out = FormatJob(Parse<v1::Job>("summary { job_id: \"new\" }"),
                                    OutputFormat::kTable, kNow);
  EXPECT_THAT(out, HasSubstr("GROUPS\n(none)\n"));
  EXPECT_THAT(out, HasSubstr("(no steps observed yet)\n"));
  EXPECT_THAT(out, HasSubstr("DECISIONS (group-steps)\n(none)\n"));
  EXPECT_THAT(out, HasSubstr("PINS\n(none)\n"));
  EXPECT_THAT(out, HasSubstr("overrides: none"));
}

TEST(FormatJob, RatioWithoutTpStepsIsADash) {
  const auto job = Parse<v1::Job>(
      "mode_stats { mode: SEQUENCE_PARALLEL steps: 3 effective_tokens_per_s: 10 }");
  EXPECT_THAT(FormatJob(job, OutputFormat::kTable, kNow),
              HasSubstr("sp              3              10      -      0.0000      -          0 B      -\n"));
}

TEST(FormatJob, JsonParsesBack) {
  const auto job = Parse<v1::Job>(kJob);
  const std::string json = FormatJob(job, OutputFormat::kJson, kNow);
  EXPECT_THAT(json, HasSubstr("\"mode\": \"TENSOR_PARALLEL_ONLY\""));
  EXPECT_THAT(json, HasSubstr("\"rs_wait_fallback\": true"));
  EXPECT_THAT(json, HasSubstr("\"hardware_id\": \"NVIDIA H200 sm_90 140GiB\""));
  ExpectJsonRoundTrip(job, json);
}

// The launch's hardware id, or why there is none: a launch that declared none (an older
// client, or one that set none; or a daemon that predates the field, which reads the same)
// or no live launch at all. JSON keeps the key, empty.
TEST(FormatJob, HardwareNotDeclaredOrNoLaunch) {
  const auto undeclared = Parse<v1::Job>(R"pb(summary { job_id: "j" incarnation: "l1" })pb");
  EXPECT_THAT(FormatJob(undeclared, OutputFormat::kTable, kNow),
              HasSubstr("job               j\n"
                        "hardware          (not declared, or the daemon predates it)\n"));
  EXPECT_THAT(FormatJob(undeclared, OutputFormat::kJson, kNow),
              HasSubstr("\"hardware_id\": \"\""));
  EXPECT_THAT(FormatJob(Parse<v1::Job>(R"pb(summary { job_id: "j" })pb"), OutputFormat::kTable,
                        kNow),
              HasSubstr("hardware          (no live launch)\n"));
  const auto jobs = Parse<v1::ListJobsResponse>(
      R"pb(jobs { job_id: "j" incarnation: "l1" hardware_id: "cpu:AMD EPYC 9654" })pb");
  EXPECT_THAT(FormatJobList(jobs, OutputFormat::kJson),
              HasSubstr("\"hardware_id\": \"cpu:AMD EPYC 9654\""));
}

// A daemon older than group_steps_decided and ModeStats.microbatches sends neither (they
// read 0): where the older counts say there were some, the tables print "-" and a note,
// JSON and YAML null under the same key, and the rest is as before.
TEST(FormatJobList, OlderDaemonsGroupStepsAreNotZero) {
  const auto jobs = Parse<v1::ListJobsResponse>(R"pb(
    jobs { job_id: "llama" groups: 2 ranks_active: 8 steps_decided: 1200 sp_groups: 1
           tp_groups: 1 config_version: 3 }
    jobs { job_id: "new" config_version: 1 }
  )pb");
  EXPECT_EQ(FormatJobList(jobs, OutputFormat::kTable),
            "JOB    GROUPS  RANKS  STALE  GROUP_STEPS  MICROBATCHES  SP_GROUPS  TP_GROUPS  "
            "VERSION\n"
            "llama       2      8      0            -          1200          1          1  "
            "      3\n"
            "new         0      0      0            0             0          0          0  "
            "      1\n"
            "(daemon does not report group-steps; upgrade spgated)\n");
  EXPECT_EQ(UnreportedNote(jobs), "(daemon does not report group-steps; upgrade spgated)\n");
  const std::string json = FormatJobList(jobs, OutputFormat::kJson);
  EXPECT_THAT(json, HasSubstr("\"steps_decided\": \"1200\",\n   \"group_steps_decided\": null,"));
  // A job that decided nothing has 0 group-steps, as a newer daemon says.
  EXPECT_THAT(json, HasSubstr("\"steps_decided\": \"0\",\n   \"group_steps_decided\": \"0\","));
  ExpectJsonRoundTrip(jobs, json);  // null reads back as the field's 0
  EXPECT_THAT(FormatJobList(jobs, OutputFormat::kYaml), HasSubstr("group_steps_decided: null\n"));
  EXPECT_THAT(FormatJobList(jobs, OutputFormat::kJson),
              Not(HasSubstr("-9223372036854775808")));

  // A newer daemon's zero is printed as it is, and so is a response that holds the
  // marker's value elsewhere (nothing is nulled that the daemon sent).
  const auto fresh = Parse<v1::ListJobsResponse>(R"pb(jobs { job_id: "new" })pb");
  EXPECT_EQ(UnreportedNote(fresh), "");
  EXPECT_THAT(FormatJobList(fresh, OutputFormat::kTable), Not(HasSubstr("upgrade")));
  const auto odd = Parse<v1::ListJobsResponse>(R"pb(
    jobs { job_id: "a" steps_decided: 5 }
    jobs { job_id: "b" steps_decided: -9223372036854775808 group_steps_decided: 1 }
  )pb");
  EXPECT_THAT(FormatJobList(odd, OutputFormat::kJson),
              AllOf(Not(HasSubstr("null")), HasSubstr("\"group_steps_decided\": \"0\"")));
}

TEST(FormatJob, OlderDaemonsGroupStepsAndMicrobatchesAreNotZero) {
  const auto job = Parse<v1::Job>(R"pb(
    summary { job_id: "pipe" incarnation: "l1" groups: 1 ranks_active: 2 steps_decided: 40
              sp_groups: 1 }
    mode_stats { mode: SEQUENCE_PARALLEL steps: 10 effective_tokens_per_s: 120
                 step_time_p95_s: 0.1 peak_memory_bytes: 1024 }
    mode_stats { mode: TENSOR_PARALLEL_ONLY }
    layout { tp: 2 pp: 2 vp: 1 cp: 1 dp: 1 microbatches: 4 }
  )pb");
  const std::string text = FormatJob(job, OutputFormat::kTable, kNow);
  EXPECT_THAT(text, HasSubstr("group-steps       - (daemon does not report group-steps; "
                              "upgrade spgated)\nmicro-batches     40 decided\n"));
  EXPECT_THAT(text, HasSubstr("MODE     MICROBATCHES  GROUP_STEPS  TOKENS/S/GROUP"));
  EXPECT_THAT(text, HasSubstr("\nsp                  -           10             120"));
  EXPECT_THAT(text, HasSubstr("\ntp_only             0            0               0"));
  EXPECT_THAT(text, HasSubstr("(daemon does not report micro-batches per mode; upgrade "
                              "spgated)\n\nDECISIONS"));
  EXPECT_EQ(UnreportedNote(job),
            "(daemon does not report group-steps; upgrade spgated)\n"
            "(daemon does not report micro-batches per mode; upgrade spgated)\n");
  const std::string json = FormatJob(job, OutputFormat::kJson, kNow);
  EXPECT_THAT(json, HasSubstr("\"group_steps_decided\": null"));
  EXPECT_THAT(json, HasSubstr("\"steps\": \"10\",\n   \"effective_tokens_per_s\": 120,"));
  EXPECT_THAT(json, HasSubstr("\"microbatches\": null"));
  EXPECT_THAT(json, HasSubstr("\"microbatches\": \"0\""));  // TP-only's: none, truly
  EXPECT_THAT(json, HasSubstr("\"microbatches\": 4"));      // the layout's, not a count
  ExpectJsonRoundTrip(job, json);
  // A newer daemon's response has no note.
  EXPECT_EQ(UnreportedNote(Parse<v1::Job>(kJob)), "");
}

TEST(FormatPin, TableAndJson) {
  const auto pin = Parse<v1::Pin>(
      R"pb(job_id: "llama" mode: SEQUENCE_PARALLEL expire_time { seconds: 1700003600 })pb");
  EXPECT_EQ(FormatPin(pin, OutputFormat::kTable, kNow),
            "pinned job llama all groups to sp until 2023-11-14T23:13:20Z (in 1h)\n");
  auto group_pin = pin;
  group_pin.set_group(2);
  EXPECT_THAT(FormatPin(group_pin, OutputFormat::kTable, kNow), HasSubstr("job llama group 2 to sp"));
  EXPECT_THAT(FormatPin(pin, OutputFormat::kTable, kNow + absl::Hours(2)), HasSubstr("(expired)"));
  ExpectJsonRoundTrip(group_pin, FormatPin(group_pin, OutputFormat::kJson, kNow));
}

TEST(FormatUnpin, CountsAndTarget) {
  v1::UnpinRequest req;
  req.set_job_id("llama");
  v1::UnpinResponse resp;
  resp.set_removed(1);
  EXPECT_EQ(FormatUnpin(req, resp, OutputFormat::kTable), "removed 1 pin of job llama\n");
  req.set_group(3);
  resp.set_removed(0);
  EXPECT_EQ(FormatUnpin(req, resp, OutputFormat::kTable), "removed 0 pins of job llama group 3\n");
  EXPECT_EQ(FormatUnpin(req, resp, OutputFormat::kJson), "{\n \"removed\": 0\n}\n");
}

TEST(FormatHistory, OneRowPerEntryNewestFirst) {
  const auto history = Parse<v1::ListConfigHistoryResponse>(R"pb(
    entries {
      time { seconds: 1700000000 } principal: "alice" rpc: "RollbackGateConfig" version: 9
      rolled_back_to: 7
      changes { field: "window_steps" old_value { set: true value: 10 } new_value {} }
    }
    entries {
      time { seconds: 1699999000 } principal: "CN=ops" rpc: "PinMode" job_id: "llama"
      group: 2 mode: TENSOR_PARALLEL_ONLY expire_time { seconds: 1700003600 }
    }
    entries {
      time { seconds: 1699998000 } principal: "ci" rpc: "Unpin" job_id: "llama" removed: 1
    }
    entries {
      time { seconds: 1699997000 } principal: "alice" rpc: "UpdateGateConfig" version: 7
      changes { field: "max_length_cv" old_value {} new_value { set: true value: 0.3 } }
    }
    next_page_token: "4096"
  )pb");
  const std::string table = FormatHistory(history, OutputFormat::kTable);
  EXPECT_THAT(table, HasSubstr("TIME"));
  EXPECT_THAT(table, HasSubstr("PRINCIPAL"));
  EXPECT_THAT(table, HasSubstr("to version 7: window_steps 10 -> -"));
  EXPECT_THAT(table, HasSubstr("job llama  CN=ops"));
  EXPECT_THAT(table, HasSubstr("group 2 tp_only until 2023-11-14T23:13:20Z"));
  EXPECT_THAT(table, HasSubstr("group"));
  EXPECT_THAT(table, HasSubstr("removed 1"));
  EXPECT_THAT(table, HasSubstr("max_length_cv - -> 0.3"));
  EXPECT_THAT(table, HasSubstr("older entries: --page_token=4096\n"));
  EXPECT_LT(table.find("RollbackGateConfig"), table.find("UpdateGateConfig"));
  ExpectJsonRoundTrip(history, FormatHistory(history, OutputFormat::kJson));
  EXPECT_EQ(FormatHistory({}, OutputFormat::kTable), "(no audited changes)\n");
}

TEST(HandshakeHint, OnlyForAConnectionClosedBeforeAnAnswer) {
  const int unavailable = static_cast<int>(absl::StatusCode::kUnavailable);
  const std::string refused =
      "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:50062: "
      "Socket closed";
  EXPECT_THAT(HandshakeHint(unavailable, refused, false),
              HasSubstr("this client spoke plaintext (no --tls_ca, --tls_cert) and the port speaks TLS"));
  EXPECT_THAT(HandshakeHint(unavailable, refused, true),
              HasSubstr("not signed by the daemon's --tls_client_ca"));
  EXPECT_EQ(HandshakeHint(unavailable, "failed to connect to all addresses; last error: "
                                       "UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused", true),
            "")
      << "no daemon there";
  EXPECT_EQ(HandshakeHint(unavailable, "Socket closed", true), "")
      << "a stream the daemon ended after it had answered (a watch across a restart)";
  EXPECT_EQ(HandshakeHint(static_cast<int>(absl::StatusCode::kPermissionDenied),
                          "Socket closed", true),
            "");
}

TEST(FormatDecisionLine, OneLineEach) {
  const auto d = Parse<v1::Decision>(R"pb(
    job_id: "llama" group: 1 step: 42 mode: TENSOR_PARALLEL_ONLY reason: LENGTH_CV
    config_version: 3 length_cv: 0.4123 rolling_rs_wait_share: 0.031
    decide_time { seconds: 1700000000 nanos: 123456789 }
  )pb");
  EXPECT_EQ(FormatDecisionLine(d, OutputFormat::kTable),
            "2023-11-14T22:13:20.123Z  job=llama group=1 step=42 mode=tp_only reason=length_cv "
            "length_cv=0.412 rs_wait=0.031 config_version=3\n");
  const std::string json = FormatDecisionLine(d, OutputFormat::kJson);
  EXPECT_EQ(json.find('\n'), json.size() - 1) << "one object per line: " << json;
  EXPECT_THAT(json, HasSubstr("\"reason\":\"LENGTH_CV\""));
  ExpectJsonRoundTrip(d, json);
  // No SP step in the window: "-", not a measured 0.
  v1::Decision none = d;
  none.clear_rolling_rs_wait_share();
  EXPECT_THAT(FormatDecisionLine(none, OutputFormat::kTable), HasSubstr(" rs_wait=- "));
  none.set_rolling_rs_wait_share(0.0);
  EXPECT_THAT(FormatDecisionLine(none, OutputFormat::kTable), HasSubstr(" rs_wait=0.000 "));
}

TEST(FormatPin, SaysWhenTheJobHasNotRegistered) {
  const auto pin = Parse<v1::Pin>(R"pb(job_id: "later" mode: SEQUENCE_PARALLEL pending: true
                                       expire_time { seconds: 1700000000 })pb");
  EXPECT_THAT(FormatPin(pin, OutputFormat::kTable, absl::FromUnixSeconds(1699999000)),
              HasSubstr(")\njob later is not registered yet: the pin applies from its first decision\n"));
}

// gates set / gates rollback / watch of a job no launch of which runs: NOT_FOUND and a
// job listed for its operator settings alone read differently; a running one, nothing.
TEST(JobPresenceNote, UnknownAndListedWithoutALaunchDiffer) {
  constexpr absl::string_view kThen = "its scope is kept and applies from its first decision";
  EXPECT_EQ(JobPresenceNote("gates set", "nope", JobPresence::kUnknown, kThen),
            "spgatectl: gates set: job nope is not known to the daemon yet (jobs list shows the "
            "ones it knows); its scope is kept and applies from its first decision\n");
  EXPECT_EQ(JobPresenceNote("gates rollback", "llama", JobPresence::kNoLaunch, kThen),
            "spgatectl: gates rollback: no launch of job llama is running (jobs list shows it "
            "for its overrides or pins alone); its scope is kept and applies from its first "
            "decision\n");
  EXPECT_EQ(JobPresenceNote("watch", "llama", JobPresence::kRunning, "waiting"), "");
  EXPECT_EQ(JobPresenceNote("watch", "llama", JobPresence::kUnsure, "waiting"), "");
}

// -o yaml is -o json's document: the same keys in the same order, lists as "- ".
TEST(FormatStructured, YamlIsTheJsonDocument) {
  const auto pin = Parse<v1::Pin>(R"pb(job_id: "llama" group: 2 mode: TENSOR_PARALLEL_ONLY
                                       expire_time { seconds: 1700000000 })pb");
  EXPECT_EQ(FormatPin(pin, OutputFormat::kYaml, absl::FromUnixSeconds(1699999000)),
            "job_id: \"llama\"\n"
            "mode: \"TENSOR_PARALLEL_ONLY\"\n"
            "force: false\n"
            "pending: false\n"
            "group: 2\n"
            "expire_time: \"2023-11-14T22:13:20Z\"\n");
  const auto jobs = Parse<v1::ListJobsResponse>(R"pb(jobs { job_id: "a" groups: 1 } jobs { job_id: "b" })pb");
  const std::string yaml = FormatJobList(jobs, OutputFormat::kYaml);
  EXPECT_THAT(yaml, HasSubstr("jobs:\n  - job_id: \"a\"\n    incarnation: \"\"\n"));
  EXPECT_THAT(yaml, HasSubstr("\n  - job_id: \"b\"\n"));
  const v1::Decision d;
  EXPECT_THAT(FormatDecisionLine(d, OutputFormat::kYaml), ::testing::StartsWith("---\njob_id: \"\"\n"));
}

struct YamlCase {
  std::string json;
  std::string yaml;  // empty: refused
};

TEST(JsonToYaml, Shapes) {
  const YamlCase cases[] = {
      {R"({})", "{}\n"},
      {R"({"a": 1, "b": "x\"y", "c": true, "d": null})", "a: 1\nb: \"x\\\"y\"\nc: true\nd: null\n"},
      {R"({"a": [], "b": {}})", "a: []\nb: {}\n"},
      {R"({"a": [1, [2, 3], {"k": "v", "l": [4]}]})",
       "a:\n  - 1\n  - - 2\n    - 3\n  - k: \"v\"\n    l:\n      - 4\n"},
      // Keys a YAML 1.1 reader would take for booleans stay quoted.
      {R"({"on": 1, "y": 2, "with space": 3})", "\"on\": 1\n\"y\": 2\n\"with space\": 3\n"},
      {R"([1, 2])", "- 1\n- 2\n"},
      // Exponents as YAML 1.1 readers take floats: a '.' and a signed exponent.
      {R"([1e-05, 2.5E+20, 3e7, -4.0e-3])", "- 1.0e-05\n- 2.5e+20\n- 3.0e+7\n- -4.0e-3\n"},
      {R"({"a": 1,})", ""},
      {R"({"a": 1} x)", ""},
      {R"("unterminated)", ""},
  };
  for (const YamlCase& c : cases) {
    absl::StatusOr<std::string> y = JsonToYaml(c.json);
    if (c.yaml.empty()) {
      EXPECT_FALSE(y.ok()) << c.json;
    } else {
      ASSERT_TRUE(y.ok()) << c.json << ": " << y.status();
      EXPECT_EQ(*y, c.yaml) << c.json;
    }
  }
}

}  // namespace
}  // namespace spgate::ctl
