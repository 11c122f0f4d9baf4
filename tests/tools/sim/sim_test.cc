// spgate-sim end to end: the live driver (local-only, and against a real in-process
// daemon) keeps every group consistent and loses no telemetry; against a scripted daemon
// that answers TP-only whatever the memory, every simulated leader runs SP instead and the
// summary counts it, and all ranks of a run share one new launch credential and declare the
// simulated hardware; replay is deterministic and exercises every gate; the sweep ranks
// configs on common random numbers and says which grid values it skipped.
#include "tools/sim/sim.h"
#include "tools/sim/compare.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/hardware_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/gate_config.h"
#include "policy/hardware.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/client/fake_gate_service.h"
#include "worker/runtime/batching.h"
#include "worker/runtime/lengths.h"
#ifdef SPGATE_HAVE_SERVER
#include "grpcpp/grpcpp.h"
#include "server/daemon.h"
#include "spgate/v1/admin.grpc.pb.h"
#endif

namespace spgate::sim {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Each;
using ::testing::HasSubstr;

SimOptions Small() {
  SimOptions o;
  o.groups = 6;
  o.cost.tp = 4;
  o.steps = 60;
  o.steps_per_s = 200;
  o.bucketing = false;  // both modes
  o.threads = 2;        // 24 ranks on 2 threads
  o.cost.layers = 10;   // a pipeline stage: fits 80 GiB at t = 4 in both modes
  return o;
}

int64_t Total(const Summary& s) {
  int64_t n = 0;
  for (const auto& [m, reasons] : s.decisions) {
    for (const auto& [r, c] : reasons) n += c;
  }
  return n;
}

TEST(SimRunTest, LocalOnlyGroupsAreConsistent) {
  absl::StatusOr<Summary> s = RunLive(Small());
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 60);
  EXPECT_EQ(s->local_decisions, 6 * 60);
  EXPECT_EQ(s->threads, 2);
  EXPECT_GT(s->sp.steps, 0);
  EXPECT_GT(s->tp_only.steps, 0);
  // Each group's leader takes one record a step, reduced in the group from its 4 ranks.
  EXPECT_EQ(s->telemetry_reported, 6 * 60);
  EXPECT_EQ(s->telemetry_errors, 0) << s->first_error;
  EXPECT_EQ(s->sessions, 0) << "no daemon";
  const std::string json = s->ToJson();
  for (const char* key : {"\"steps\"", "\"decisions\"", "\"local_decisions\"",
                          "\"consistency_violations\"", "\"lost_telemetry\"",
                          "\"effective_tokens_per_s\"", "\"step_time_p95_s\"",
                          "\"peak_memory_bytes\"", "\"group_phase\": \"random\""}) {
    EXPECT_THAT(json, HasSubstr(key));
  }
  // Labelled names beside the old ones: the group-steps per mode, the job's tokens/s.
  EXPECT_THAT(json, HasSubstr(absl::StrFormat("\"group_steps_by_mode\": {\"sp\": %d, "
                                              "\"tp_only\": %d}",
                                              s->sp.steps, s->tp_only.steps)));
  EXPECT_EQ(s->sp.steps + s->tp_only.steps, 6 * 60) << "6 groups x 60 steps";
  const auto after = [&](const std::string& key) -> std::string {
    const size_t at = json.find(key);
    if (at == std::string::npos) return "";
    return json.substr(at + key.size(), json.find('}', at) - at - key.size());
  };
  EXPECT_EQ(after("\"job_effective_tokens_per_s\": "), after("\"effective_tokens_per_s\": "));
  EXPECT_NE(after("\"job_effective_tokens_per_s\": "), "");
}

TEST(SimRunTest, GroupsTickAtTheirOwnPhaseOrAllAtOnce) {
  SimOptions o = Small();
  o.groups = 64;
  o.steps_per_s = 10;
  const std::vector<absl::Duration> random = GroupPhases(o);
  ASSERT_EQ(random.size(), 64u);
  int first_half = 0;
  for (absl::Duration d : random) {
    EXPECT_GE(d, absl::ZeroDuration());
    EXPECT_LT(d, absl::Milliseconds(100));
    if (d < absl::Milliseconds(50)) ++first_half;
  }
  // Spread over the period, not bunched (binomial(64, 1/2): 16..48 is > 99.99 %).
  EXPECT_GT(first_half, 16);
  EXPECT_LT(first_half, 48);
  EXPECT_EQ(GroupPhases(o), random) << "phases are seeded";
  o.seed = 2;
  EXPECT_NE(GroupPhases(o), random);
  o.group_phase = SimOptions::GroupPhase::kAligned;
  for (absl::Duration d : GroupPhases(o)) EXPECT_EQ(d, absl::ZeroDuration());

  EXPECT_THAT(ParseGroupPhase("random"), IsOkAndHolds(SimOptions::GroupPhase::kRandom));
  EXPECT_THAT(ParseGroupPhase("aligned"), IsOkAndHolds(SimOptions::GroupPhase::kAligned));
  EXPECT_THAT(ParseGroupPhase("sync"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--group_phase")));
}

TEST(SimRunTest, AlignedGroupsAreConsistentToo) {
  SimOptions o = Small();
  o.group_phase = SimOptions::GroupPhase::kAligned;
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 60);
  EXPECT_THAT(s->ToJson(), HasSubstr("\"group_phase\": \"aligned\""));
}

// The daemon (scripted) answers TP-only to every plan, and TP-only does not fit: the
// device holds SP's predicted peak but not TP-only's, for every batch. The simulated
// leaders are GateClients, so each runs SP with the memory gate's reason; the summary
// counts those group steps as memory overrides, neither daemon nor local decisions, and
// the cost model ran SP. Every group's leader registered (its group session) with the
// run's one credential, and the next run makes a new one.
TEST(SimRunTest, SimulatedLeadersRefuseATpOnlyAnswerThatDoesNotFit) {
  client::testing::FakeGateServer server;
  client::testing::FakeGateService::Script script;
  script.answer_mode = v1::TENSOR_PARALLEL_ONLY;
  script.answer_reason = v1::LENGTH_CV;
  server.service().set_script(script);
  SimOptions o = Small();
  o.controller = server.address();
  o.job_id = "sim-memory";
  o.groups = 2;
  o.steps = 30;
  o.deadline = absl::Milliseconds(500);
  o.lengths = "uniform:min=4000,max=4096";
  // Budget x 0.9 halfway between SP's and TP-only's peak (TP-only's is about twice SP's
  // at t = 4), measured on the batches the groups will draw.
  uint64_t sp_max = 0, tp_min = ~uint64_t{0};
  const CostModel model(o.cost);
  for (int g = 0; g < o.groups; ++g) {
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, g);
    ASSERT_THAT(b.status(), IsOk());
    for (int i = 0; i < o.steps + 2; ++i) {
      const MemoryPrediction m = model.PredictMemory((*b)->Next(0.15).lengths);
      sp_max = std::max(sp_max, m.sp);
      tp_min = std::min(tp_min, m.tp);
    }
  }
  ASSERT_LT(sp_max, tp_min);
  o.cost.device_memory_gib = (sp_max + tp_min) / 2.0 / 0.9 / static_cast<double>(1ull << 30);
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  const int64_t total = o.groups * o.steps;
  EXPECT_EQ(Total(*s), total);
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(s->tp_only.steps, 0) << "a TP-only step ran that does not fit";
  EXPECT_EQ(s->memory_overrides + s->local_decisions, total);
  EXPECT_GT(s->memory_overrides, total * 9 / 10) << "most answers should be the daemon's";
  EXPECT_EQ(s->sources["memory_override"], s->memory_overrides);
  EXPECT_EQ(s->sources["daemon"], 0);
  EXPECT_EQ(s->decisions["sp"]["memory_requires_sp"], total);
  EXPECT_THAT(s->ToJson(), HasSubstr(absl::StrCat("\"memory_overrides\": ", s->memory_overrides,
                                                  ",")));
  const std::vector<std::string> first = server.service().launch_credentials();
  ASSERT_EQ(first.size(), static_cast<size_t>(o.groups)) << "one session per group";
  for (const std::string& c : first) EXPECT_EQ(c, first[0]);
  EXPECT_EQ(first[0].size(), 32u);
  o.steps = 1;
  ASSERT_THAT(RunLive(o).status(), IsOk());
  const std::vector<std::string> both = server.service().launch_credentials();
  ASSERT_GT(both.size(), first.size());
  EXPECT_NE(both.back(), first[0]) << "a new run is a new launch with a new credential";
}

// SPGATE_HARDWARE_ID set to `value` (unset: nullopt) for a scope, as it was after.
class ScopedHardwareIdEnv {
 public:
  explicit ScopedHardwareIdEnv(std::optional<std::string> value) {
    if (const char* v = std::getenv(kName)) saved_ = v;
    if (value.has_value()) {
      setenv(kName, value->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  ~ScopedHardwareIdEnv() {
    if (saved_.has_value()) {
      setenv(kName, saved_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }

 private:
  static constexpr char kName[] = "SPGATE_HARDWARE_ID";
  std::optional<std::string> saved_;
};

// The hardware id keys ADAPTIVE's persisted learned tables, so it names what the steps
// were costed on: the preset, then each constant that differs from it (a flat link
// always). Runs of one job under two presets, or two sets of constants, never share one.
TEST(SimHardwareIdTest, NamesThePresetAndEveryConstantThatDiffersFromIt) {
  CostParams c;
  EXPECT_EQ(SimulatedHardwareId(c), "sim:h100-sxm");
  absl::StatusOr<const HardwarePreset*> h200 = FindHardwarePreset("h200-sxm");
  ASSERT_THAT(h200.status(), IsOk());
  ApplyHardwarePreset(**h200, c);
  EXPECT_EQ(SimulatedHardwareId(c), "sim:h200-sxm");
  c.mfu = (*h200)->gemm_mfu;  // given, but the preset's value: the same hardware
  EXPECT_EQ(SimulatedHardwareId(c), "sim:h200-sxm");
  c.mfu = 0.5;
  c.hbm_gbps = 3000;
  c.nvls = false;
  EXPECT_EQ(SimulatedHardwareId(c), "sim:h200-sxm mfu=0.5 hbm_gbps=3000 nvls=false");
  c.flat_link = true;  // at the preset's speed: still another network model
  EXPECT_EQ(SimulatedHardwareId(c),
            absl::StrCat("sim:h200-sxm mfu=0.5 hbm_gbps=3000 nvls=false link_gbps=",
                         ShortestText((*h200)->link_gbps)));
  // Every constant changed: past 128 characters, cut after a whole constant and told apart
  // by a hash of the whole (these two differ only in the last constant, past the cut).
  CostParams a;
  a.device_tflops = 1000.5;
  a.mfu = 0.61234567;
  a.attention_tflops = 300.25;
  a.hbm_gbps = 3000.5;
  a.device_memory_gib = 96.5;
  a.collective_latency_us = 20.125;
  a.nvls = false;
  a.flat_link = true;
  a.link_gbps = 400.5;
  CostParams b = a;
  b.link_gbps = 400.25;
  const std::string ida = SimulatedHardwareId(a), idb = SimulatedHardwareId(b);
  EXPECT_LE(ida.size(), 128u);
  EXPECT_THAT(ValidateHardwareId(ida), IsOk());
  EXPECT_THAT(ida, HasSubstr("sim:h100-sxm device_tflops=1000.5 mfu=0.61234567 "));
  EXPECT_THAT(ida, ::testing::MatchesRegex(".*[0-9] #[0-9a-f]{16}"));
  EXPECT_NE(ida, idb);
  EXPECT_EQ(ida, SimulatedHardwareId(a)) << "the same flags, the same table";
}

// What the simulated ranks send at Register: the simulated hardware, not the host's CPU;
// SPGATE_HARDWARE_ID still wins, as for every client.
TEST(SimRunTest, RanksDeclareTheSimulatedHardware) {
  client::testing::FakeGateServer server;
  SimOptions o = Small();
  o.controller = server.address();
  o.job_id = "sim-hardware";
  o.groups = 2;
  o.steps = 2;
  o.deadline = absl::Milliseconds(500);
  absl::StatusOr<const HardwarePreset*> h200 = FindHardwarePreset("h200-sxm");
  ASSERT_THAT(h200.status(), IsOk());
  ApplyHardwarePreset(**h200, o.cost);
  {
    ScopedHardwareIdEnv env(std::nullopt);
    ASSERT_THAT(RunLive(o).status(), IsOk());
  }
  std::vector<std::string> ids = server.service().hardware_ids();
  ASSERT_EQ(ids.size(), 2u) << "one group session per group";
  EXPECT_THAT(ids, Each(std::string("sim:h200-sxm")));
  {
    ScopedHardwareIdEnv env("NVIDIA H200 sm_90 140GiB");
    ASSERT_THAT(RunLive(o).status(), IsOk());
  }
  ids = server.service().hardware_ids();
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[2], "NVIDIA H200 sm_90 140GiB");
  EXPECT_EQ(ids[3], "NVIDIA H200 sm_90 140GiB");
  ScopedHardwareIdEnv bad("bad\x01id");
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("SPGATE_HARDWARE_ID: only printable ASCII")));
}

#ifdef SPGATE_HAVE_SERVER
TEST(SimRunTest, AgainstTheDaemonNoTelemetryIsLost) {
  server::DaemonOptions d;
  d.state.heartbeat_interval = absl::Milliseconds(200);
  auto daemon = server::Daemon::Start(d);
  ASSERT_THAT(daemon.status(), IsOk());
  SimOptions o = Small();
  o.controller = (*daemon)->worker_address();
  o.job_id = "sim-test";
  o.incarnation = "test-launch";
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 60);
  EXPECT_GT(s->sources["daemon"], 6 * 60 * 9 / 10) << "most decisions should be the daemon's";
  // One session and one record a step per group (the leader's group session).
  EXPECT_EQ(s->sessions, 6);
  EXPECT_EQ(s->telemetry_reported, 6 * 60);
  EXPECT_EQ(s->telemetry_errors, 0) << s->first_error;
  EXPECT_EQ(s->telemetry_acked, s->telemetry_reported) << "lost telemetry";
  EXPECT_FALSE(s->decision_latency_s.empty());

  // Per-rank sessions, kept as an option: every rank its own session and records (another
  // job: the first launch's groups have decided their steps).
  o.group_session = false;
  o.job_id = "sim-test-per-rank";
  s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->sessions, 6 * 4);
  EXPECT_EQ(s->telemetry_reported, 6 * 4 * 60);
  EXPECT_EQ(s->telemetry_errors, 0) << s->first_error;  // the leaders' wait shares too
  EXPECT_EQ(s->telemetry_acked, s->telemetry_reported) << "lost telemetry";
  (*daemon)->Shutdown(absl::Seconds(2));
}

// A relaunched job under the same job id gets decisions for its own batches, not the
// previous launch's cached answers for the same (group, step) (docs/design.md §10). The
// first launch runs near-uniform batches (SP everywhere); the second, same job id and a
// new incarnation (each RunLive makes its own), a bimodal mix that trips the CV gate —
// before job incarnations it got the first launch's 100% "sp / gates_passed".
TEST(SimRunTest, ARelaunchUnderTheSameJobIdIsDecidedAfresh) {
  auto daemon = server::Daemon::Start({});
  ASSERT_THAT(daemon.status(), IsOk());
  SimOptions o = Small();
  o.controller = (*daemon)->worker_address();
  o.job_id = "relaunched";
  o.deadline = absl::Milliseconds(200);
  o.bucketing = false;
  o.lengths = "uniform:min=4000,max=4096";
  absl::StatusOr<Summary> first = RunLive(o);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->decisions["tp_only"]["length_cv"], 0);
  o.lengths = "bimodal:short=256,long=16000,p_long=0.5";
  absl::StatusOr<Summary> second = RunLive(o);
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_GT(second->decisions["tp_only"]["length_cv"], Total(*second) / 4)
      << "the relaunch must be decided for its own batches";
  EXPECT_GT(second->sources["daemon"], Total(*second) * 9 / 10);
  EXPECT_EQ(second->consistency_violations, 0);
  (*daemon)->Shutdown(absl::Seconds(2));
}

// A job under the ADAPTIVE policy against the real daemon (docs/design.md §11): the
// policy is switched on at run time through the admin API, the daemon learns from the
// sim's telemetry, exploits (reason ADAPTIVE) and explores (PROBE), every group stays
// consistent, and the learned table is in GetJob and was sent to the leaders.
TEST(SimRunTest, AdaptiveAgainstTheDaemonIsConsistentAndLearns) {
  auto daemon = server::Daemon::Start({});
  ASSERT_THAT(daemon.status(), IsOk());
  auto admin = v1::AdminService::NewStub(
      grpc::CreateChannel((*daemon)->admin_address(), grpc::InsecureChannelCredentials()));
  v1::UpdateGateConfigRequest update;
  update.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
  update.mutable_config()->set_adaptive_min_samples(3);
  update.mutable_config()->set_adaptive_explore_share(0.1);
  update.mutable_config()->set_adaptive_half_life_steps(100);
  for (const char* path : {"policy", "adaptive_min_samples", "adaptive_explore_share",
                           "adaptive_half_life_steps"}) {
    update.mutable_update_mask()->add_paths(path);
  }
  {
    grpc::ClientContext ctx;
    v1::VersionedGateConfig out;
    ASSERT_TRUE(admin->UpdateGateConfig(&ctx, update, &out).ok());
    ASSERT_EQ(out.config().policy(), v1::GateConfig::ADAPTIVE);
  }
  SimOptions o = Small();
  o.controller = (*daemon)->worker_address();
  o.job_id = "adaptive";
  o.incarnation = "adaptive-launch";
  o.steps = 240;
  o.deadline = absl::Milliseconds(200);
  o.lengths = "bimodal:short=256,long=8000,p_long=0.4";
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_EQ(s->consistency_violations, 0);
  EXPECT_EQ(s->decide_errors, 0) << s->first_error;
  EXPECT_EQ(Total(*s), 6 * 240);
  EXPECT_GT(s->sources["daemon"], Total(*s) * 9 / 10);
  int64_t adaptive = 0, probes = 0;
  for (auto& [mode, reasons] : s->decisions) {
    adaptive += reasons["adaptive"];
    probes += reasons["probe"];
  }
  EXPECT_GT(adaptive, Total(*s) / 4) << "bands should have learned and decided";
  EXPECT_GT(probes, 0);
  EXPECT_LE(probes, Total(*s) / 10 + 6) << "exploration is bounded by the share";
  grpc::ClientContext ctx;
  v1::GetJobRequest req;
  req.set_job_id("adaptive");
  v1::Job job;
  ASSERT_TRUE(admin->GetJob(&ctx, req, &job).ok());
  EXPECT_GT(job.learned().cells_size(), 1);
  EXPECT_GT(job.exploration_steps(), 0);
  EXPECT_GT(job.adaptive_gain_ratio(), 0.0);
  (*daemon)->Shutdown(absl::Seconds(2));
}
#endif

// ---------------------------------------------------------------- batches

TEST(SimBatchesTest, EachGroupDrawsTheWorkersStreamForTheSameSeed) {
  for (bool bucketing : {false, true}) {
    SimOptions o = Small();
    o.lengths = "bimodal:short=512,long=16384,p_long=0.3";
    o.tokens_per_batch = 16384;
    o.bucketing = bucketing;
    o.seed = 7;
    for (int group : {0, 3}) {
      absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> sim = GroupBatches(o, group);
      ASSERT_THAT(sim.status(), IsOk());
      // What spgate-worker's leader of TP group `group` builds (worker/runtime/worker.cc).
      absl::StatusOr<std::unique_ptr<runtime::LengthSource>> src =
          runtime::ParseLengthSource(o.lengths, o.seed * 1000003 + group, o.tokens_per_batch);
      ASSERT_THAT(src.status(), IsOk());
      runtime::BatchBuilder worker(*std::move(src), {.tokens_per_batch = o.tokens_per_batch,
                                                     .bucketing = o.bucketing});
      for (int i = 0; i < 50; ++i) {
        ASSERT_EQ((*sim)->Next(0.15).lengths, worker.Next(0.15).lengths)
            << "bucketing " << bucketing << " group " << group << " batch " << i;
      }
    }
  }
}

TEST(SimBatchesTest, SequencesLongerThanABatchAreCut) {
  SimOptions o = Small();
  o.lengths = "uniform:min=5000,max=9000";
  o.tokens_per_batch = 4096;
  absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, 0);
  ASSERT_THAT(b.status(), IsOk());
  for (int i = 0; i < 50; ++i) EXPECT_EQ((*b)->Next(0.15).lengths, std::vector<int64_t>{4096});
}

TEST(SimBatchesTest, EveryGroupReplaysATraceFromItsOwnOffset) {
  const std::string path = ::testing::TempDir() + "/sim_trace.txt";
  std::ofstream(path) << "# a trace\n100\n200\n\n300\n400\n";
  SimOptions o = Small();
  o.lengths = "file:" + path;
  o.groups = 2;
  o.tokens_per_batch = 250;  // one sequence a batch
  auto firsts = [&](int group) {
    std::vector<int64_t> got;
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, group);
    EXPECT_THAT(b.status(), IsOk());
    if (!b.ok()) return got;
    for (int i = 0; i < 4; ++i) got.push_back((*b)->Next(0.15).lengths.at(0));
    return got;
  };
  // Lengths over the budget are cut to it (300, 400 -> 250).
  EXPECT_EQ(firsts(0), (std::vector<int64_t>{100, 200, 250, 250}));
  EXPECT_EQ(firsts(1), (std::vector<int64_t>{250, 250, 100, 200}));
}

// ---------------------------------------------------------------- replay

TEST(SimReplayTest, IsDeterministic) {
  SimOptions o = Small();
  o.steps = 500;
  absl::StatusOr<Summary> a = Replay(o, GateConfig{});
  absl::StatusOr<Summary> b = Replay(o, GateConfig{});
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  a->wall_s = b->wall_s = 0;
  EXPECT_EQ(a->ToJson(), b->ToJson());
}

TEST(SimReplayTest, StragglersTripTheWaitShareGateAndProbes) {
  SimOptions o = Small();
  o.bucketing = true;
  o.steps = 3000;
  o.groups = 1;
  o.cost.straggler_prob = 0.3;
  o.cost.straggler_slowdown = 0.6;
  GateConfig c;
  c.probe_interval_steps = 20;
  c.min_dwell_steps = 5;
  c.window_steps = 10;
  absl::StatusOr<Summary> s = Replay(o, c);
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_GT(s->decisions["tp_only"]["rs_wait"], 0);
  EXPECT_GT(s->decisions["sp"]["probe"], 0);
  EXPECT_GT(s->decisions["sp"]["gates_passed"], 0);
}

TEST(SimReplayTest, SmallDevicesNeedSp) {
  SimOptions o = Small();
  o.steps = 200;
  o.tokens_per_batch = 32768;
  // 12.6 GB of weights and optimizer state; activations 26.8 GB under TP-only, 14.3 GB
  // under SP: only SP fits 32 GiB x 0.9.
  o.cost.device_memory_gib = 32;
  absl::StatusOr<Summary> s = Replay(o, GateConfig{});
  ASSERT_THAT(s.status(), IsOk());
  // Full batches must run SP; TP-only only ever ran where it fit.
  EXPECT_GT(s->decisions["sp"]["memory_requires_sp"], s->all.steps / 2);
  EXPECT_LE(static_cast<double>(s->tp_only.peak_memory), 0.9 * 32 * (1ull << 30));
  EXPECT_EQ(s->decisions["sp"]["memory_over_budget"], 0);
}

// --compare runs five policies on common random numbers: every policy runs the same
// batches (same effective tokens), the oracle takes each step's shorter mode so nothing
// beats it, the static row is exactly plain replay, and the adaptive policy learns on a
// workload where the static gates' threshold is wrong.
TEST(SimCompareTest, OracleBoundsEveryPolicyAndStaticIsReplay) {
  SimOptions o = Small();
  o.steps = 600;
  o.groups = 3;
  o.lengths = "bimodal:short=256,long=8000,p_long=0.4";
  absl::StatusOr<CompareResult> r = Compare(o, GateConfig{}, 100);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ(r->policies.size(), 6u);  // five and the expected-value oracle
  const PolicyResult* oracle = r->Find("oracle");
  ASSERT_NE(oracle, nullptr);
  EXPECT_DOUBLE_EQ(oracle->ratio_to_oracle, 1.0);
  for (const PolicyResult& p : r->policies) {
    EXPECT_LE(p.effective_tokens_per_s, oracle->effective_tokens_per_s * (1 + 1e-12)) << p.name;
    EXPECT_EQ(p.sp_steps + p.tp_steps, 3 * 600) << p.name;
    EXPECT_EQ(p.series.size(), 6u) << p.name;
  }
  EXPECT_EQ(r->Find("sp")->tp_steps, 0);
  EXPECT_EQ(r->Find("tp_only")->sp_steps, 0);  // it all fits: no memory override
  EXPECT_GT(r->Find("adaptive")->probe_steps, 0);
  // The static row is plain replay, step for step.
  absl::StatusOr<Summary> replay = Replay(o, GateConfig{});
  ASSERT_THAT(replay.status(), IsOk());
  EXPECT_DOUBLE_EQ(r->Find("static")->effective_tokens_per_s,
                   3 * replay->all.tokens / replay->all.time_s);
  // Deterministic.
  absl::StatusOr<CompareResult> again = Compare(o, GateConfig{}, 100);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(CompareJson(*again), CompareJson(*r));
  EXPECT_THAT(CompareJson(*r), HasSubstr("\"adaptive\": {\"effective_tokens_per_s\""));
  EXPECT_THAT(CompareTable(*r), HasSubstr("| oracle |"));
  EXPECT_THAT(CompareSeriesCsv(*r), HasSubstr("step,sp,tp_only,static,adaptive,oracle,expected_oracle\n"));
  // Plain replay of an ADAPTIVE config learns too: it exploits after a while.
  GateConfig a;
  a.policy = GatePolicyKind::kAdaptive;
  absl::StatusOr<Summary> learned = Replay(o, a);
  ASSERT_THAT(learned.status(), IsOk());
  int64_t adaptive = 0;
  for (auto& [mode, reasons] : learned->decisions) adaptive += reasons["adaptive"];
  EXPECT_GT(adaptive, 3 * 600 / 3) << "bands should learn within the run and then decide";
}

TEST(SimSweepTest, RanksConfigsByThroughput) {
  SimOptions o = Small();
  o.steps = 300;
  o.groups = 1;
  auto cv = ParseSweepAxis("sweep_max_length_cv", "0.05:0.45:0.2");
  auto rs = ParseSweepAxis("sweep_max_rs_wait_share", "0.02:0.3:0.14");
  ASSERT_THAT(cv.status(), IsOk());
  ASSERT_THAT(rs.status(), IsOk());
  absl::StatusOr<std::vector<SweepPoint>> pts = Sweep(o, GateConfig{}, *cv, *rs);
  ASSERT_THAT(pts.status(), IsOk());
  // 3 × 3 grid minus max_rs_wait_share 0.02 (not above the 0.03 re-enable margin).
  EXPECT_EQ(pts->size(), 6u);
  for (size_t i = 1; i < pts->size(); ++i) {
    const Summary& a = (*pts)[i - 1].summary;
    const Summary& b = (*pts)[i].summary;
    EXPECT_GE(a.all.tokens / a.all.time_s, b.all.tokens / b.all.time_s);
  }
  EXPECT_THAT(SweepTable(*pts, 1), HasSubstr("| max_length_cv |"));
  EXPECT_THAT(ParseSweepAxis("sweep_max_length_cv", "0.5:0.1:0.1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--sweep_max_length_cv")));
}

// Grid values that make no valid config are skipped, and the sweep says which and why;
// an axis with none left is refused naming its flag (it was "the sweep grid has no valid
// config", naming neither).
TEST(SimSweepTest, SaysWhichValuesItSkipsAndWhy) {
  absl::StatusOr<SweepAxis> rs = ParseSweepAxis("sweep_max_rs_wait_share", "0.01:0.05:0.01");
  ASSERT_THAT(rs.status(), IsOk());
  absl::StatusOr<SweepValues> v =
      SweepAxisValues(*rs, GateConfig{}, &GateConfig::max_rs_wait_share);
  ASSERT_THAT(v.status(), IsOk());
  EXPECT_THAT(v->values, ElementsAre(0.04, 0.05));
  EXPECT_EQ(v->skipped,
            "--sweep_max_rs_wait_share=0.01:0.05:0.01: skipping 0.01, 0.02, 0.03 "
            "(rs_wait_reenable_margin (0.03) must be less than max_rs_wait_share (0.03))");
  // Both ends of an axis, each with its own reason; a long run is shortened.
  absl::StatusOr<SweepAxis> cv = ParseSweepAxis("sweep_max_length_cv", "-1:20:1");
  ASSERT_THAT(cv.status(), IsOk());
  v = SweepAxisValues(*cv, GateConfig{}, &GateConfig::max_length_cv);
  ASSERT_THAT(v.status(), IsOk());
  EXPECT_EQ(v->values.size(), 10u);
  EXPECT_EQ(v->skipped,
            "--sweep_max_length_cv=-1:20:1: skipping -1, 0 (max_length_cv must be finite and "
            "in (0, 10], got 0); 11, 12, ..., 20 (max_length_cv must be finite and in (0, 10], "
            "got 11)");
  absl::StatusOr<SweepAxis> ok = ParseSweepAxis("sweep_max_length_cv", "0.1:0.2:0.1");
  ASSERT_THAT(ok.status(), IsOk());
  v = SweepAxisValues(*ok, GateConfig{}, &GateConfig::max_length_cv);
  ASSERT_THAT(v.status(), IsOk());
  EXPECT_EQ(v->skipped, "");
  absl::StatusOr<SweepAxis> none = ParseSweepAxis("sweep_max_rs_wait_share", "0.01:0.02:0.01");
  ASSERT_THAT(none.status(), IsOk());
  SimOptions o = Small();
  o.steps = 5;
  EXPECT_THAT(Sweep(o, GateConfig{}, *ok, *none),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--sweep_max_rs_wait_share=0.01:0.02:0.01: no value on the grid "
                                 "is valid with the rest of the config: 0.01, 0.02 "
                                 "(rs_wait_reenable_margin (0.03) must be less than "
                                 "max_rs_wait_share (0.02))")));
}

// A daemon that never answers: every step falls back, and the end of the run does not
// wait --flush_timeout for it (it waited 30 s after a run of a fraction of a second).
TEST(SimRunTest, ADaemonThatNeverAnsweredIsNotWaitedForAtTheEnd) {
  SimOptions o = Small();
  o.groups = 2;
  o.steps = 5;
  o.controller = "127.0.0.1:1";  // nothing listens on port 1
  o.job_id = "sim-unreachable";
  o.connect_timeout = absl::Milliseconds(200);
  o.deadline = absl::Milliseconds(20);
  o.flush_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<Summary> s = RunLive(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->local_decisions, Total(*s));
  EXPECT_EQ(s->sessions, 0) << "no client ever registered";
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  // wall_s is the run's, the wait for the daemon included (it counted from the first tick).
  EXPECT_GE(s->wall_s, 0.2);
  EXPECT_LE(s->wall_s, absl::ToDoubleSeconds(absl::Now() - start));
}

TEST(SimRunTest, RejectsBadOptions) {
  SimOptions o = Small();
  o.groups = 0;
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--groups")));
  o = Small();
  o.lengths = "weird";
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lengths")));
  // No silent default job id against a daemon (docs/design.md §10).
  o = Small();
  o.controller = "127.0.0.1:1";
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("--job_id: required with --controller")));
  // The worker token file is read before any group dials.
  o = Small();
  o.worker_token_file = "/nonexistent/spgate-token";
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("--worker_token_file: cannot read")));
  // Only a rank's own share can feed the leader's window when every rank reports alone.
  o = Small();
  o.flush_timeout = absl::Seconds(-1);
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("--flush_timeout must be >= 0")));
  o = Small();
  o.leader_group_rs_wait = false;
  EXPECT_THAT(RunLive(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("--group_session=false")));
}

}  // namespace
}  // namespace spgate::sim
