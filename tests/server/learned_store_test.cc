// ADAPTIVE's learned tables on disk (server/learned_store.h): the file's round trip, the
// files it refuses (by field), ageing and restamping; and through GateState, the tables
// back after a restart, adopted by a new launch of the same declaration (aged, then
// restamped at its first step; the same hardware id) and not by one of another, a
// corrupt file set aside.
#include "server/learned_store.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "policy/forgetting.h"
#include "prometheus/text_serializer.h"
#include "proto/convert.h"
#include "server/persistence.h"
#include "spgate/v1/admin.pb.h"
#include "tests/server/state_harness.h"
#include "tests/server/test_util.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kStages = 16;

// A table with every kind of state: SP and TP-only cells (one with a detected change),
// a switch cost, a band's pairs, the prior's inputs and sums.
ThroughputTable SomeTable(double scale) {
  GateConfig c;
  ThroughputTable t;
  t.SetPriorInputs({.tp = 4, .hidden = 5120, .layers = 8});
  for (int64_t step = 0; step < 40; ++step) {
    const int band = static_cast<int>(step % 3);
    t.Observe(c, band, Mode::kSequenceParallel, step, 8192, 1.0 * scale + 0.01 * step);
    t.Observe(c, band, Mode::kTensorParallelOnly, step, 8192, 0.8 * scale);
    t.ObserveCollectives(c, Mode::kSequenceParallel, step, 8192, 0.3, 1.0, 0.1, 0.2);
  }
  t.ObserveAfterSwitch(c, 0, Mode::kTensorParallelOnly, 40, 8192, 0.95 * scale);
  // Every step above paired beside the other mode: one band's pair is enough here, the
  // last step's (below).
  for (int band = 0; band < kBands; ++band) t.SetPair(band, PairedCell{});
  t.Observe(c, 5, Mode::kSequenceParallel, 41, 4096, 9.0);  // a band seen once
  t.Observe(c, 1, Mode::kTensorParallelOnly, 42, 8192, 0.85 * scale);
  return t;
}

LearnedRecord PlainRecord() {
  LearnedRecord r;
  r.job_id = "train-13b.v2";
  r.incarnation = "slurm-4711.0";
  r.key.declared = SomeTable(1).prior_inputs();
  r.fold_time = absl::FromUnixNanos(1'800'000'000'123'456'789);
  r.step_seconds = 1.25;
  r.cv_band_width = 0.1;
  r.tokens_band_base = 8192;
  r.table = SomeTable(1);
  return r;
}

LearnedRecord PipelinedRecord() {
  LearnedRecord r = PlainRecord();
  r.key.layout = JobLayout{.tp = 4, .pp = 3, .dp = 2, .microbatches = 8};
  r.key.hardware_id = "NVIDIA H200 sm_90 140GiB";
  r.table = ThroughputTable{};
  for (int s = 0; s < 3; ++s) r.stage_tables.push_back(SomeTable(1 + s));
  return r;
}

TEST(LearnedStoreTest, RoundTripKeepsEveryTableExactly) {
  for (const LearnedRecord& r : {PlainRecord(), PipelinedRecord()}) {
    const std::string text = SerializeLearned(r);
    auto back = ParseLearned("f", text, r.job_id, kStages);
    ASSERT_THAT(back.status(), IsOk());
    EXPECT_TRUE(*back == r) << text;
    EXPECT_EQ(back->table, r.table);
    EXPECT_EQ(back->stage_tables, r.stage_tables);
    EXPECT_EQ(back->fold_time, r.fold_time);
  }
  // A file written before hardware ids (no hardware_id field) reads as an empty id.
  {
    const std::string text = SerializeLearned(PlainRecord());
    ASSERT_EQ(text.find("hardware_id"), std::string::npos) << text;
    const std::string with = SerializeLearned(PipelinedRecord());
    EXPECT_NE(with.find("hardware_id: \"NVIDIA H200 sm_90 140GiB\""), std::string::npos);
  }
  // An empty table (a launch that has not learned yet) too.
  LearnedRecord empty = PlainRecord();
  empty.table = ThroughputTable{};
  auto back = ParseLearned("f", SerializeLearned(empty), "", kStages);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_TRUE(*back == empty);
}

// Each case edits a valid file's message and, unless it tests the checksum, gives it a
// matching checksum: the refusal names the field.
TEST(LearnedStoreTest, RefusesOtherVersionsShapesAndValuesNamingTheField) {
  struct Case {
    const char* name;
    std::function<void(v1::PersistedLearned&)> edit;
    const char* field;
    bool pipelined = false;
    std::string expected_job = "train-13b.v2";
  };
  const std::vector<Case> cases = {
      {"newer format", [](auto& m) { m.set_format_version(2); }, "format_version: 2"},
      {"fewer bands", [](auto& m) { m.set_bands(16); }, "bands: 16"},
      {"band out of range", [](auto& m) { m.mutable_table()->mutable_cells(0)->set_band(40); },
       "table.cells[0].band: 40"},
      {"bad mode", [](auto& m) { m.mutable_table()->mutable_cells(1)->set_mode(v1::Mode(7)); },
       "table.cells[1].mode"},
      {"duplicate cell",
       [](auto& m) { *m.mutable_table()->add_cells() = m.table().cells(0); }, "appears twice"},
      {"NaN weight",
       [](auto& m) { m.mutable_table()->mutable_cells(2)->set_weight(std::nan("")); },
       "table.cells[2].weight"},
      {"negative seconds", [](auto& m) { m.mutable_table()->mutable_cells(0)->set_seconds(-1); },
       "table.cells[0].seconds"},
      {"a change past its confirmation",
       [](auto& m) { m.mutable_table()->mutable_cells(1)->set_beyond(-8); },
       "table.cells[1].beyond: -8, not in (-8, 8)"},
      {"NaN pair seconds",
       [](auto& m) { m.mutable_table()->mutable_pairs(0)->set_tp_seconds(std::nan("")); },
       "table.pairs[0].tp_seconds"},
      {"pair band out of range",
       [](auto& m) { m.mutable_table()->mutable_pairs(0)->set_band(32); },
       "table.pairs[0].band: 32"},
      {"duplicate pair",
       [](auto& m) { *m.mutable_table()->add_pairs() = m.table().pairs(0); },
       "table.pairs[1]: band 1 appears twice"},
      {"seconds_drift past its bound",
       [](auto& m) { m.mutable_table()->mutable_cells(0)->set_seconds_drift(9); },
       "table.cells[0].seconds_drift: 9, not in [-0.8, 4]"},
      {"straggler share over a whole step",
       [](auto& m) { m.mutable_table()->mutable_cells(0)->set_straggler_share(1.01); },
       "table.cells[0].straggler_share: 1.01, not in [0, 1]"},
      {"NaN straggler share",
       [](auto& m) { m.mutable_table()->mutable_cells(1)->set_straggler_share(std::nan("")); },
       "table.cells[1].straggler_share: nan; must be finite and >= 0"},
      {"pair weight without seconds",
       [](auto& m) { m.mutable_table()->mutable_pairs(0)->set_sp_seconds(0); },
       "table.pairs[0]: weight 1 with sp_seconds 0"},
      {"pair without a step",
       [](auto& m) { m.mutable_table()->mutable_pairs(0)->set_last_step(-1); },
       "table.pairs[0].last_step: -1"},
      {"infinite switch cost",
       [](auto& m) { m.mutable_table()->mutable_switch_cost()->set_seconds(INFINITY); },
       "table.switch_cost.seconds"},
      {"negative prior sum", [](auto& m) { m.mutable_table()->mutable_prior()->set_tokens(-5); },
       "table.prior.tokens"},
      {"no group size", [](auto& m) { m.mutable_declared()->set_tp(0); }, "declared.tp"},
      {"hardware id not printable", [](auto& m) { m.set_hardware_id("H200\x01"); },
       "hardware_id: only printable ASCII"},
      {"hardware id too long", [](auto& m) { m.set_hardware_id(std::string(200, 'h')); },
       "hardware_id: at most 128 characters, got 200"},
      {"bad band edges", [](auto& m) { m.set_cv_band_width(0); }, "cv_band_width"},
      {"stages short of the layout", [](auto& m) { m.mutable_stage_tables()->RemoveLast(); },
       "stage_tables: 2 tables, but layout.pp is 3", true},
      {"a stage cell out of range",
       [](auto& m) { m.mutable_stage_tables(1)->mutable_cells(0)->set_band(-1); },
       "stage_tables[1].cells[0].band", true},
      {"stages without a layout", [](auto& m) { m.add_stage_tables(); },
       "stage_tables: 1 tables for a job without a layout"},
      {"bad layout", [](auto& m) { m.mutable_layout()->set_pp(0); }, "layout:", true},
      {"another job's file", [](auto&) {}, "job_id: \"train-13b.v2\", but the file is job other's",
       false, "other"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::PersistedLearned m;
    const std::string text = SerializeLearned(c.pipelined ? PipelinedRecord() : PlainRecord());
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &m));
    c.edit(m);
    m.set_checksum(LearnedChecksum(m));
    std::string edited;
    google::protobuf::TextFormat::PrintToString(m, &edited);
    EXPECT_THAT(ParseLearned("/d/learned/x.textproto", edited, c.expected_job, kStages).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("/d/learned/x.textproto: "), HasSubstr(c.field))));
  }
}

TEST(LearnedStoreTest, RefusesTruncatedAlteredAndOversizedFiles) {
  const std::string text = SerializeLearned(PlainRecord());
  const size_t checksum_at = text.find("checksum:");
  ASSERT_NE(checksum_at, std::string::npos);
  // Cut at a message boundary (it still parses): the checksum, printed last, is gone.
  const size_t table_at = text.find("\ntable {");
  ASSERT_NE(table_at, std::string::npos);
  const std::string cut_clean = text.substr(0, table_at + 1);
  std::string altered = text;
  altered[altered.find("weight: ") + 8] = altered[altered.find("weight: ") + 8] == '9' ? '8' : '9';
  const struct {
    const char* name;
    std::string text;
    const char* what;
  } cases[] = {
      {"cut mid-message", text.substr(0, text.size() / 2), "not a valid spgate.v1.PersistedLearned"},
      {"cut at a boundary", cut_clean, "checksum: missing"},
      {"no checksum", text.substr(0, checksum_at), "checksum: missing"},
      {"one digit changed", altered, "does not match the contents"},
      {"not text format", "\x01\x02garbage{{", "not a valid spgate.v1.PersistedLearned"},
      {"empty", "", "format_version: 0"},
      {"oversized", text + std::string(MaxLearnedFileBytes(kStages), ' '), "bytes, more than"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseLearned("p", c.text, "", kStages).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(c.what)));
  }
}

TEST(LearnedStoreTest, LoadSetsARefusedFileAsideAndKeepsTheOthers) {
  const std::string dir = TempDir();
  ASSERT_THAT(SaveLearned(dir, PlainRecord(), kStages), IsOk());
  const std::string bad = LearnedFilePath(dir, "broken");
  std::ofstream(bad) << "format_version: 1\njob_id: \"broken\"\n";
  std::ofstream(LearnedFilePath(dir, "x") + ".tmp.999999999") << "left by a writer killed";
  const LoadedLearned loaded = LoadLearnedDir(dir, kStages, 8);
  ASSERT_EQ(loaded.records.size(), 1u);
  EXPECT_TRUE(loaded.records[0] == PlainRecord());
  ASSERT_EQ(loaded.problems.size(), 1u);
  EXPECT_THAT(loaded.problems[0],
              AllOf(HasSubstr(bad), HasSubstr("checksum: missing"), HasSubstr("renamed to"),
                    HasSubstr("job broken starts cold")));
  EXPECT_FALSE(std::filesystem::exists(bad));
  EXPECT_TRUE(std::filesystem::exists(bad + ".corrupt"));
  EXPECT_FALSE(std::filesystem::exists(LearnedFilePath(dir, "x") + ".tmp.999999999"));
  // A second and a third refusal keep the copies before them: each is the evidence of one.
  for (int n = 1; n <= 2; ++n) {
    std::ofstream(bad) << "format_version: 1\njob_id: \"broken\"\n# refusal " << n << "\n";
    const LoadedLearned again = LoadLearnedDir(dir, kStages, 8);
    ASSERT_EQ(again.problems.size(), 1u);
    const std::string kept =
        n == 1 ? absl::StrCat("(", bad, ".corrupt, from an earlier refusal, is kept)")
               : absl::StrCat("(", bad, ".corrupt through .corrupt.1, from earlier refusals, "
                              "are kept)");
    EXPECT_THAT(again.problems[0],
                AllOf(HasSubstr(absl::StrCat("renamed to ", bad, ".corrupt.", n, " ", kept)),
                      HasSubstr("job broken starts cold")));
    EXPECT_FALSE(std::filesystem::exists(bad));
    EXPECT_THAT(ReadAll(absl::StrCat(bad, ".corrupt.", n)), HasSubstr(absl::StrCat("refusal ", n)));
  }
  EXPECT_THAT(ReadAll(bad + ".corrupt"), Not(HasSubstr("refusal")));
  // At most max_records, the newest folds kept.
  LearnedRecord newer = PlainRecord();
  newer.job_id = "newer";
  newer.fold_time += absl::Hours(1);
  ASSERT_THAT(SaveLearned(dir, newer, kStages), IsOk());
  const LoadedLearned one = LoadLearnedDir(dir, kStages, 1);
  ASSERT_EQ(one.records.size(), 1u);
  EXPECT_EQ(one.records[0].job_id, "newer");
  EXPECT_THAT(one.problems, ::testing::Contains(HasSubstr("not loaded")));
}

TEST(LearnedStoreTest, AgeingDecaysWeightsToTheFloorAndRestampingMovesSteps) {
  GateConfig c;
  c.adaptive_half_life_steps = 100;
  c.adaptive_min_samples = 4;
  const ThroughputTable t = SomeTable(1);
  const ThroughputTable aged = AgeLearned(c, t, 100);  // one half-life
  const ThroughputCell& before = t.cell(0, Mode::kSequenceParallel);
  const ThroughputCell& after = aged.cell(0, Mode::kSequenceParallel);
  EXPECT_NEAR(after.weight, FlooredWeight(before.weight, 0.5, 4), 1e-12);
  EXPECT_NEAR(after.tokens_per_s(), before.tokens_per_s(), 1e-9);  // the estimate stays
  EXPECT_EQ(after.last_step, before.last_step);
  EXPECT_DOUBLE_EQ(aged.cell(5, Mode::kSequenceParallel).weight, 0.5);  // below the floor
  EXPECT_NEAR(aged.switch_cost().weight, t.switch_cost().weight * 0.5, 1e-12);
  ASSERT_EQ(t.pair(1).weight, 1.0) << "SomeTable's probe paired";
  EXPECT_DOUBLE_EQ(aged.pair(1).weight, 0.5);  // below the floor, as a cell
  EXPECT_NEAR(PairAt(c, aged.pair(1), 42).ratio, PairAt(c, t.pair(1), 42).ratio, 1e-12);
  EXPECT_EQ(aged.prior_sums(), t.prior_sums());  // the hardware's, kept
  EXPECT_EQ(AgeLearned(c, t, 0), t);
  // Restamped at step 7: every cell at 7, decayed to the newest step first.
  const ThroughputTable moved = RestampLearned(c, t, 7);
  EXPECT_EQ(moved.newest_step(), 7);
  for (int band = 0; band < kBands; ++band) {
    for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
      const ThroughputCell& a = t.cell(band, mode);
      const ThroughputCell& b = moved.cell(band, mode);
      if (a.last_step < 0) {
        EXPECT_EQ(b.last_step, -1);
        continue;
      }
      EXPECT_EQ(b.last_step, 7);
      EXPECT_NEAR(b.weight, t.At(c, band, mode, t.newest_step()).samples, 1e-12);
    }
  }
  EXPECT_EQ(moved.prior_sums().last_step, 7);
  EXPECT_EQ(moved.switch_cost().last_step, 7);
  EXPECT_EQ(moved.pair(1).last_step, 7);
  EXPECT_NEAR(moved.pair(1).weight, PairAt(c, t.pair(1), t.newest_step()).samples, 1e-12);
}

// ---- through GateState ----

class LearnedStateTest : public ::testing::Test {
 protected:
  std::unique_ptr<StateHarness> Make(const std::string& dir) {
    StateOptions o;
    o.clock = [this] { return clock_.Now(); };
    o.state_dir = dir;
    o.log = [this](const std::string& line) { log_.push_back(line); };
    StoreOptions so;
    so.state_dir = dir;
    auto s = StateHarness::Create(o, so, &metrics_);
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? std::move(*s) : nullptr;
  }

  static v1::RegisterRequest Reg(const std::string& incarnation, int hidden,
                                 const std::string& hardware_id = "") {
    v1::RegisterRequest r;
    r.set_job_id("j");
    r.set_incarnation(incarnation);
    r.set_hardware_id(hardware_id);
    r.set_group_size(1);
    r.mutable_model()->set_hidden(hidden);
    r.mutable_model()->set_layers(4);
    return r;
  }

  // `steps` steps of ADAPTIVE from `first`: SP takes 2 s, TP-only 1 s, 1 s apart.
  void Run(StateHarness& h, const std::string& session_id, int64_t first, int steps) {
    auto session = h.state->FindSession(session_id);
    ASSERT_THAT(session.status(), IsOk());
    for (int64_t step = first; step < first + steps; ++step) {
      v1::BatchPlan p;
      p.set_job_id("j");
      p.set_step(step);
      p.add_lengths(500);
      p.add_lengths(500);
      v1::Decision d;
      ASSERT_THAT(h.Decide(p, &d), IsOk());
      v1::StepTelemetry t;
      t.set_job_id("j");
      t.set_step(step);
      t.set_mode(d.mode());
      t.set_step_time_s(d.mode() == v1::SEQUENCE_PARALLEL ? 2.0 : 1.0);
      t.set_effective_tokens(1000);
      ASSERT_THAT(h.RecordTelemetry(**session, t), IsOk());
      clock_.Advance(absl::Seconds(1));
    }
  }

  FakeClock clock_;
  Metrics metrics_;
  std::vector<std::string> log_;
};

TEST_F(LearnedStateTest, TablesSurviveARestartAndANewLaunchOfTheSameShape) {
  const std::string dir = TempDir();
  v1::Job before;
  {
    auto h = Make(dir);
    v1::UpdateGateConfigRequest up;
    up.set_job_id("j");
    up.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
    up.mutable_config()->set_adaptive_min_samples(4);
    up.mutable_config()->set_adaptive_half_life_steps(100);
    ASSERT_THAT(h->UpdateGateConfig(up).status(), IsOk());
    auto reg = h->Register(Reg("launch-1", 1024));
    ASSERT_THAT(reg.status(), IsOk());
    Run(*h, reg->session_id(), 0, 120);
    h->state->PersistLearned(/*all=*/false);  // the first write of the job: due at once
    before = *h->GetJob("j");
    ASSERT_GT(before.learned().cells_size(), 0);
    // More learning within the interval is not written: a kill -9 now loses it.
    Run(*h, reg->session_id(), 120, 5);
    h->state->PersistLearned(/*all=*/false);
    ASSERT_NE(h->GetJob("j")->learned().SerializeAsString(),
              before.learned().SerializeAsString());
  }  // killed: nothing more written
  {
    // Restarted on the same directory: launch-1 is restored with the tables last written.
    auto h = Make(dir);
    auto job = h->GetJob("j");
    ASSERT_THAT(job.status(), IsOk());
    EXPECT_EQ(job->learned().SerializeAsString(), before.learned().SerializeAsString());
    EXPECT_TRUE(log_.empty()) << log_.front();
    // A new launch declaring another model shape starts cold, once launch-1 let go.
    clock_.Advance(absl::Seconds(20));
    ASSERT_THAT(h->Register(Reg("launch-2", 2048)).status(), IsOk());
    EXPECT_EQ(h->GetJob("j")->learned().cells_size(), 0);
  }
  // Restarted again: launch-2 learned nothing, so the file is still launch-1's; a third
  // launch declaring launch-1's shape 50 s after its last fold starts from its tables,
  // aged by the steps the job could have run meanwhile (50 s / its mean step time).
  auto loaded = ParseLearned("f", ReadAll(LearnedFilePath(dir, "j")), "j", kStages);
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_EQ(loaded->incarnation, "launch-1");
  ASSERT_GT(loaded->step_seconds, 1.0);
  ASSERT_LT(loaded->step_seconds, 2.0);
  auto h = Make(dir);
  const absl::Time adopt_at = loaded->fold_time + absl::Seconds(50);
  clock_.Advance(adopt_at - clock_.Now());
  auto reg = h->Register(Reg("launch-3", 1024));
  ASSERT_THAT(reg.status(), IsOk());
  GateConfig c;
  c.adaptive_min_samples = 4;
  c.adaptive_half_life_steps = 100;
  const double age = 50.0 / loaded->step_seconds;
  const ThroughputTable adopted = spgate::FromProto(h->GetJob("j")->learned());
  const int band = BandOf(c, 0.0, 1000);
  bool decayed = false;
  for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
    const ThroughputCell& was = loaded->table.cell(band, mode);
    ASSERT_GT(was.weight, 0);
    EXPECT_NEAR(adopted.cell(band, mode).weight,
                FlooredWeight(was.weight, HalfLifeDecay(age, 100), 4), 1e-9);
    EXPECT_NEAR(adopted.cell(band, mode).tokens_per_s(), was.tokens_per_s(), 1e-9);
    decayed = decayed || adopted.cell(band, mode).weight < was.weight - 0.5;
  }
  EXPECT_TRUE(decayed) << "a cell above the floor lost weight";
  // Its first decided step (its counter starts at 0) restamps the tables there.
  Run(*h, reg->session_id(), 0, 1);
  const ThroughputTable restamped = spgate::FromProto(h->GetJob("j")->learned());
  EXPECT_EQ(restamped.newest_step(), 0);
  EXPECT_EQ(restamped.cell(band, Mode::kTensorParallelOnly).last_step, 0);
}

// A pipelined job's per-stage tables come back with its launch, and GetJob (what
// `spgatectl jobs show` prints) has them as stage_learned, with its layout.
TEST_F(LearnedStateTest, StageTablesComeBackWithTheirLaunch) {
  const std::string dir = TempDir();
  const JobLayout layout{.tp = 2, .pp = 3, .dp = 1, .microbatches = 4};
  {
    auto h = Make(dir);
    v1::RegisterRequest r;
    r.set_job_id("p");
    r.set_incarnation("launch-1");
    r.set_group_size(2);
    r.set_group_session(true);
    spgate::ToProto(layout, r.mutable_layout());
    ASSERT_THAT(h->Register(r).status(), IsOk());
  }
  LearnedRecord record = PipelinedRecord();
  record.job_id = "p";
  record.incarnation = "launch-1";
  record.key = LearnedKey{layout, PriorInputs{.tp = 2}, ""};
  ASSERT_THAT(SaveLearned(dir, record, kStages), IsOk());
  auto h = Make(dir);
  auto job = h->GetJob("p");
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->layout().pp(), 3);
  ASSERT_EQ(job->stage_learned_size(), 3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(spgate::FromProto(job->stage_learned(s)), record.stage_tables[s]) << s;
  }
  EXPECT_EQ(job->learned().cells_size(), 0);
}

// The same through the daemon's own write: a pipelined job learns each stage from its
// micro-batches (SP the faster on stage 0, TP-only on stage 1), the sweep's write puts
// both stages' tables on disk, and after a kill and a restart on the directory GetJob has
// them exactly, each where it was.
TEST_F(LearnedStateTest, StageTablesTheDaemonWroteComeBackAfterAKill) {
  const std::string dir = TempDir();
  constexpr int kMicro = 2;
  v1::Job before;
  {
    auto h = Make(dir);
    v1::UpdateGateConfigRequest up;
    up.set_job_id("p");
    up.mutable_config()->set_policy(v1::GateConfig::ADAPTIVE);
    up.mutable_config()->set_adaptive_min_samples(4);
    ASSERT_THAT(h->UpdateGateConfig(up).status(), IsOk());
    std::shared_ptr<Session> sessions[2];
    for (int stage : {0, 1}) {
      v1::RegisterRequest r;
      r.set_job_id("p");
      r.set_incarnation("launch-1");
      r.set_group(stage);
      r.set_group_size(2);
      r.set_global_rank(2 * stage);
      r.set_group_session(true);
      r.mutable_model()->set_hidden(1024);
      r.mutable_model()->set_layers(4);
      spgate::ToProto(JobLayout{.tp = 2, .pp = 2, .dp = 1, .microbatches = kMicro},
                      r.mutable_layout());
      r.mutable_coordinates()->set_stage(stage);
      auto reg = h->Register(r);
      ASSERT_THAT(reg.status(), IsOk());
      auto s = h->state->FindSession(reg->session_id());
      ASSERT_THAT(s.status(), IsOk());
      sessions[stage] = *s;
    }
    for (int64_t step = 0; step < 40; ++step) {
      for (int stage : {0, 1}) {
        v1::BatchPlan p;
        p.set_job_id("p");
        p.set_group(stage);
        p.set_step(step);
        for (int id = 0; id < kMicro; ++id) {
          v1::MicroBatchPlan* m = p.add_micro_batches();
          m->set_id(id);
          for (int64_t l : {100, 300}) m->add_lengths(l);
        }
        v1::Decision d;
        ASSERT_THAT(h->Decide(p, &d), IsOk());
        ASSERT_EQ(d.micro_batches_size(), kMicro);
        v1::StepTelemetry t;
        t.set_job_id("p");
        t.set_group(stage);
        t.set_step(step);
        t.set_mode(v1::SEQUENCE_PARALLEL);
        t.set_effective_tokens(400 * kMicro);
        t.set_ranks(2);
        double seconds = 0;
        for (const v1::MicroBatchDecision& md : d.micro_batches()) {
          const bool sp = md.mode() == v1::SEQUENCE_PARALLEL;
          const double s = (sp == (stage == 0)) ? 0.1 : 0.2;  // the stage's faster mode
          v1::MicroBatchTelemetry* m = t.add_micro_batches();
          m->set_id(md.id());
          m->set_mode(md.mode());
          m->set_forward_s(s / 3);
          m->set_backward_s(s * 2 / 3);
          m->set_effective_tokens(400);
          seconds += s;
        }
        t.set_step_time_s(seconds);
        ASSERT_THAT(h->RecordTelemetry(*sessions[stage], t), IsOk());
      }
      clock_.Advance(absl::Seconds(1));
    }
    h->state->PersistLearned(/*all=*/false);  // the job's first write: due at once
    before = *h->GetJob("p");
  }  // killed: nothing more written
  ASSERT_EQ(before.stage_learned_size(), 2);
  for (int stage : {0, 1}) {
    // Each stage's table is its own: where it measured both modes, its faster one leads.
    const ThroughputTable t = spgate::FromProto(before.stage_learned(stage));
    int both = 0;
    for (int band = 0; band < kBands; ++band) {
      const ThroughputCell& sp = t.cell(band, Mode::kSequenceParallel);
      const ThroughputCell& tp = t.cell(band, Mode::kTensorParallelOnly);
      if (sp.weight <= 0 || tp.weight <= 0) continue;
      ++both;
      EXPECT_EQ(sp.tokens_per_s() > tp.tokens_per_s(), stage == 0)
          << "stage " << stage << " band " << band;
    }
    EXPECT_GT(both, 0) << "stage " << stage << " measured both modes in a band";
  }
  auto h = Make(dir);
  auto job = h->GetJob("p");
  ASSERT_THAT(job.status(), IsOk());
  EXPECT_EQ(job->layout().pp(), 2);
  ASSERT_EQ(job->stage_learned_size(), 2);
  for (int stage : {0, 1}) {
    EXPECT_EQ(job->stage_learned(stage).SerializeAsString(),
              before.stage_learned(stage).SerializeAsString())
        << "stage " << stage;
  }
  EXPECT_TRUE(log_.empty()) << log_.front();
}

// The hardware id is part of the key: a relaunch on other hardware starts cold, one on
// the same hardware adopts the tables (an empty id matching an empty one is the test
// above: its launches declare none, as older clients).
TEST_F(LearnedStateTest, ARelaunchOnOtherHardwareStartsColdAndOnTheSameAdopts) {
  const std::string dir = TempDir();
  const std::string h200 = "NVIDIA H200 sm_90 140GiB";
  {
    auto h = Make(dir);
    auto reg = h->Register(Reg("launch-1", 1024, h200));
    ASSERT_THAT(reg.status(), IsOk());
    Run(*h, reg->session_id(), 0, 30);
    h->state->PersistLearned(/*all=*/true);
    ASSERT_GT(h->GetJob("j")->learned().cells_size(), 0);
  }
  auto loaded = ParseLearned("f", ReadAll(LearnedFilePath(dir, "j")), "j", kStages);
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_EQ(loaded->key.hardware_id, h200);
  {
    auto h = Make(dir);
    clock_.Advance(absl::Seconds(20));  // launch-1 let go
    ASSERT_THAT(h->Register(Reg("launch-2", 1024, "NVIDIA H100 80GB HBM3 sm_90 79GiB")).status(),
                IsOk());
    EXPECT_EQ(h->GetJob("j")->learned().cells_size(), 0);
    // Nor does an older client's launch (no hardware id) take them.
    clock_.Advance(absl::Seconds(20));
    ASSERT_THAT(h->Register(Reg("launch-3", 1024)).status(), IsOk());
    EXPECT_EQ(h->GetJob("j")->learned().cells_size(), 0);
    EXPECT_EQ(h->GetJob("j")->summary().hardware_id(), "");  // the admin view: none declared
  }
  // Neither learned, so the file is still launch-1's: the same hardware adopts it.
  auto h = Make(dir);
  clock_.Advance(absl::Seconds(20));
  ASSERT_THAT(h->Register(Reg("launch-4", 1024, h200)).status(), IsOk());
  EXPECT_GT(h->GetJob("j")->learned().cells_size(), 0);
  // The admin views show the launch's id (spgatectl jobs show / list).
  EXPECT_EQ(h->GetJob("j")->summary().hardware_id(), h200);
  ASSERT_EQ(h->ListJobs().jobs_size(), 1);
  EXPECT_EQ(h->ListJobs().jobs(0).hardware_id(), h200);
  // Within the launch, a rank on other hardware joins (the id differs by accident: MIG
  // slices, SKU names, a rank without a GPU); the first rank's id stays the key, and the
  // first difference is logged once, naming the job, both ids and the rank.
  const std::string h100 = "NVIDIA H100 80GB HBM3 sm_90 79GiB";
  const size_t logged = log_.size();
  for (int group = 1; group <= 2; ++group) {
    v1::RegisterRequest other = Reg("launch-4", 1024, group == 1 ? h100 : "cpu:Xeon");
    other.set_group(group);
    EXPECT_THAT(h->Register(other).status(), IsOk()) << group;
  }
  v1::RegisterRequest none = Reg("launch-4", 1024);  // an older client declares none
  none.set_group(3);
  EXPECT_THAT(h->Register(none).status(), IsOk());
  EXPECT_EQ(h->GetJob("j")->summary().hardware_id(), h200);
  ASSERT_EQ(log_.size(), logged + 1);
  EXPECT_THAT(log_.back(), AllOf(HasSubstr("job j launch launch-4: group 1 rank 0"),
                             HasSubstr(h100), HasSubstr(h200)));
  EXPECT_THAT(prometheus::TextSerializer().Serialize(metrics_.registry()->Collect()),
              HasSubstr("spgate_hardware_id_mismatches_total{job_id=\"j\"} 2"));
  // A new launch logs its own first difference.
  clock_.Advance(absl::Seconds(20));
  ASSERT_THAT(h->Register(Reg("launch-5", 1024, h200)).status(), IsOk());
  v1::RegisterRequest next = Reg("launch-5", 1024, h100);
  next.set_group(1);
  ASSERT_THAT(h->Register(next).status(), IsOk());
  EXPECT_EQ(log_.size(), logged + 2);
}

TEST_F(LearnedStateTest, RegisterRefusesAHardwareIdTooLongOrNotPrintable) {
  auto h = Make(TempDir());
  for (const std::string& bad : {std::string(200, 'h'), std::string("H200\n")}) {
    EXPECT_THAT(h->Register(Reg("launch-1", 1024, bad)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hardware_id: ")));
  }
  EXPECT_THAT(h->Register(Reg("launch-1", 1024, std::string(128, 'h'))).status(), IsOk());
}

TEST_F(LearnedStateTest, ACorruptFileIsSetAsideAndTheJobStartsCold) {
  const std::string dir = TempDir();
  {
    auto h = Make(dir);
    auto reg = h->Register(Reg("launch-1", 1024));
    ASSERT_THAT(reg.status(), IsOk());
    Run(*h, reg->session_id(), 0, 30);
    h->state->PersistLearned(/*all=*/true);
  }
  const std::string path = LearnedFilePath(dir, "j");
  std::string text = ReadAll(path);
  ASSERT_FALSE(text.empty());
  std::ofstream(path, std::ios::trunc) << text.substr(0, text.size() / 2);
  auto h = Make(dir);
  auto job = h->GetJob("j");
  ASSERT_THAT(job.status(), IsOk());  // the launch is restored; its tables are not
  EXPECT_EQ(job->learned().cells_size(), 0);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_THAT(log_[0], AllOf(HasSubstr(path), HasSubstr("renamed to"), HasSubstr("starts cold")));
  EXPECT_TRUE(std::filesystem::exists(path + ".corrupt"));
  // It learns afresh and writes a good file again.
  auto reg = h->Register(Reg("launch-1", 1024));
  ASSERT_THAT(reg.status(), IsOk());
  Run(*h, reg->session_id(), 100, 10);
  h->state->PersistLearned(/*all=*/true);
  EXPECT_THAT(ParseLearned("f", ReadAll(path), "j", kStages).status(), IsOk());
}

}  // namespace
}  // namespace spgate::server
