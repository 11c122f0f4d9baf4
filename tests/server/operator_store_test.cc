// OperatorStore on its own, with a fake clock and a temporary --state_dir: config
// updates (versions, expected-version conflicts, validation), the --config file under the
// API's overrides across a restart and a reload, the state file's start-up checks, the
// audit log and its history pages, pins' audit entries, and rollback. What a change does
// to live groups and streams is the live state's, in gate_state_test.cc.
#include "server/operator_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/audit_log.h"
#include "server/persistence.h"
#include "tests/server/test_util.h"
#include "tests/testing/status_matchers.h"

namespace spgate::server {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::IsOkAndHolds;
using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The principal of every change whose audit entry a test does not read.
const AuditContext kTest{"test"};

class OperatorStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<OperatorStore> Make(const std::string& state_dir = "",
                                      v1::GateConfig file_layer = {}) {
    StoreOptions o;
    o.clock = [this] { return clock_.Now(); };
    o.state_dir = state_dir;
    auto s = OperatorStore::Create(std::move(o), std::move(file_layer));
    EXPECT_THAT(s.status(), IsOk());
    return s.ok() ? std::move(*s) : nullptr;
  }

  FakeClock clock_;
};

TEST_F(OperatorStoreTest, VersionConflictIsAborted) {
  auto store = Make();
  auto current = store->GetGateConfig("");
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.3);
  up.mutable_update_mask()->add_paths("max_length_cv");
  up.set_expected_version(current.version() + 7);
  EXPECT_THAT(store->UpdateGateConfig(up, kTest).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("version")));
  up.set_expected_version(current.version());
  auto ok = store->UpdateGateConfig(up, kTest);
  ASSERT_THAT(ok.status(), IsOk());
  EXPECT_GT(ok->version(), current.version());
  EXPECT_THAT(store->UpdateGateConfig(up, kTest).status(), StatusIs(absl::StatusCode::kAborted));
}

// A state directory served read-only (--allow_read_only_state_dir) is loaded and never
// written: every change is refused before a byte is written (no audit line appended and
// cut back, no persist failure reported), a reloaded --config applies in memory, and a
// flush writes nothing.
TEST_F(OperatorStoreTest, AReadOnlyStateDirRefusesEveryChangeAndWritesNothing) {
  const std::string dir = TempDir();
  {
    auto store = Make(dir);
    v1::UpdateGateConfigRequest up;
    up.mutable_config()->set_max_length_cv(0.3);
    up.mutable_update_mask()->add_paths("max_length_cv");
    ASSERT_THAT(store->UpdateGateConfig(up, kTest).status(), IsOk());
  }
  const std::string state_before = ReadAll(StateFilePath(dir));
  const std::string audit_before = ReadAll(AuditLogPath(dir));
  int failures = 0;
  StoreOptions o;
  o.clock = [this] { return clock_.Now(); };
  o.state_dir = dir;
  o.read_only = true;
  o.on_persist_failure = [&failures](absl::string_view) { ++failures; };
  auto created = OperatorStore::Create(std::move(o), {});
  ASSERT_THAT(created.status(), IsOk());
  OperatorStore& store = **created;
  EXPECT_DOUBLE_EQ(store.GetGateConfig("").config().max_length_cv(), 0.3) << "loaded";

  const auto read_only = StatusIs(absl::StatusCode::kUnavailable, HasSubstr("read-only"));
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.4);
  up.mutable_update_mask()->add_paths("max_length_cv");
  EXPECT_THAT(store.UpdateGateConfig(up, kTest).status(), read_only);
  v1::PinModeRequest pin;
  pin.set_job_id("j");
  pin.set_mode(v1::SEQUENCE_PARALLEL);
  pin.mutable_duration()->set_seconds(600);
  EXPECT_THAT(store.PinMode(pin, kTest).status(), read_only);
  v1::RollbackGateConfigRequest rb;
  rb.set_to_version(0);
  EXPECT_THAT(store.RollbackGateConfig(rb, kTest).status(), read_only);
  v1::GateConfig file;
  file.set_window_steps(10);
  EXPECT_THAT(store.ReloadConfigFile(file), IsOk());
  EXPECT_EQ(store.GetGateConfig("").config().window_steps(), 10) << "applies in memory";
  EXPECT_THAT(store.Flush(), IsOk());

  EXPECT_EQ(failures, 0);
  EXPECT_EQ(ReadAll(StateFilePath(dir)), state_before);
  EXPECT_EQ(ReadAll(AuditLogPath(dir)), audit_before);
}

// A negative version is no version a scope can be at: a bad argument, not a conflict that
// "read it again and retry" would resolve.
TEST_F(OperatorStoreTest, NegativeExpectedVersionIsInvalidNotAConflict) {
  auto store = Make();
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_max_length_cv(0.3);
  up.mutable_update_mask()->add_paths("max_length_cv");
  up.set_expected_version(-1);
  EXPECT_THAT(store->UpdateGateConfig(up, kTest).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected_version")));
  EXPECT_EQ(store->GetGateConfig("").version(), 0);
}

TEST_F(OperatorStoreTest, InvalidUpdatesNameTheFieldAndChangeNothing) {
  auto store = Make();
  const auto before = store->GetGateConfig("");
  struct Case {
    std::string field;
    double value;
  };
  for (const Case& c : std::vector<Case>{{"max_length_cv", NAN},
                                          {"max_length_cv", 11},
                                          {"max_rs_wait_share", 0},
                                          {"memory_headroom", 1.5},
                                          {"rs_wait_reenable_margin", 0.5},
                                          {"window_steps", 0},
                                          {"probe_interval_steps", 2e6}}) {
    v1::UpdateGateConfigRequest up;
    auto* f = v1::GateConfig::descriptor()->FindFieldByName(c.field);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
      up.mutable_config()->GetReflection()->SetDouble(up.mutable_config(), f, c.value);
    } else {
      up.mutable_config()->GetReflection()->SetInt64(up.mutable_config(), f,
                                                     static_cast<int64_t>(c.value));
    }
    up.mutable_update_mask()->add_paths(c.field);
    EXPECT_THAT(store->UpdateGateConfig(up, kTest).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field << "=" << c.value;
  }
  v1::UpdateGateConfigRequest unknown;
  unknown.mutable_update_mask()->add_paths("max_cv");
  EXPECT_THAT(store->UpdateGateConfig(unknown, kTest).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_cv")));
  EXPECT_EQ(store->GetGateConfig("").SerializeAsString(), before.SerializeAsString());
}

TEST_F(OperatorStoreTest, ApiChangesSurviveARestartAndOutrankTheConfigFile) {
  const std::string dir = TempDir();
  v1::GateConfig file;
  file.set_max_length_cv(0.25);
  file.set_window_steps(10);
  int64_t version = 0;
  {
    auto store = Make(dir, file);
    v1::UpdateGateConfigRequest up;
    up.mutable_config()->set_max_length_cv(0.4);
    up.mutable_update_mask()->add_paths("max_length_cv");
    auto r = store->UpdateGateConfig(up, kTest);
    ASSERT_THAT(r.status(), IsOk());
    version = r->version();
    v1::UpdateGateConfigRequest job_up;
    job_up.set_job_id("job-a");
    job_up.mutable_config()->set_memory_headroom(0.8);
    ASSERT_THAT(store->UpdateGateConfig(job_up, kTest).status(), IsOk());
  }
  auto store = Make(dir, file);
  auto global = store->GetGateConfig("");
  EXPECT_DOUBLE_EQ(global.config().max_length_cv(), 0.4);  // API over file
  EXPECT_EQ(global.config().window_steps(), 10);           // file over default
  EXPECT_DOUBLE_EQ(global.config().max_rs_wait_share(), 0.22);
  EXPECT_EQ(global.version(), version);
  auto job = store->GetGateConfig("job-a");
  EXPECT_DOUBLE_EQ(job.config().memory_headroom(), 0.8);
  EXPECT_DOUBLE_EQ(job.config().max_length_cv(), 0.4);
}

// The audit log outlives a state file moved aside (a corrupt one, as the runbook says):
// the next change's version goes on after the log's newest instead of repeating it, so
// history and rollback name one change per version. A failed write is told to
// on_persist_failure with the file's name.
TEST_F(OperatorStoreTest, VersionsGoOnAfterTheAuditLogsNewestWithoutTheStateFile) {
  const std::string dir = TempDir();
  v1::UpdateGateConfigRequest up;
  up.set_job_id("j");
  up.mutable_config()->set_window_steps(77);
  up.mutable_update_mask()->add_paths("window_steps");
  {
    auto store = Make(dir);
    ASSERT_THAT(store->UpdateGateConfig(up, kTest).status(), IsOk());
    up.mutable_config()->set_window_steps(78);
    auto second = store->UpdateGateConfig(up, kTest);
    ASSERT_THAT(second.status(), IsOk());
    ASSERT_EQ(second->version(), 2);
    // The newest line a pin, which takes no version: it carries the counter, 2 (a pin's
    // line read 0, and versions restarted at 1 beside the old 1 and 2).
    v1::PinModeRequest pin;
    pin.set_job_id("j");
    pin.set_mode(v1::SEQUENCE_PARALLEL);
    pin.mutable_duration()->set_seconds(600);
    ASSERT_THAT(store->PinMode(pin, kTest).status(), IsOk());
  }
  // Only the log's tail is read: its newest entry that parses, past a 200 KiB line that
  // does not (more than the first 64 KiB window).
  EXPECT_THAT(NewestAuditVersion(AuditLogPath(dir)), IsOkAndHolds(2));
  {
    const auto lines = ReadAuditLog(AuditLogPath(dir));
    ASSERT_THAT(lines.status(), IsOk());
    ASSERT_EQ(lines->back().entry.rpc(), "PinMode");
    EXPECT_EQ(lines->back().entry.version_counter(), 2);
  }
  {
    // A log from before entries carried the counter: its newest config change's version.
    const std::string old_dir = TempDir();
    std::ofstream old(AuditLogPath(old_dir));
    old << R"({"rpc":"UpdateGateConfig","version":"5"})" << "\n"
        << R"({"rpc":"PinMode","jobId":"j"})" << "\n";
    old.close();
    EXPECT_THAT(NewestAuditVersion(AuditLogPath(old_dir)), IsOkAndHolds(5));
  }
  EXPECT_THAT(NewestAuditVersion(AuditLogPath(TempDir())), IsOkAndHolds(0)) << "no log";
  std::ofstream(AuditLogPath(dir), std::ios::app) << std::string(200 << 10, 'x') << "\n";
  EXPECT_THAT(NewestAuditVersion(AuditLogPath(dir)), IsOkAndHolds(2));
  ASSERT_TRUE(std::filesystem::remove(StateFilePath(dir)));
  auto store = Make(dir);
  up.mutable_config()->set_window_steps(79);
  auto third = store->UpdateGateConfig(up, kTest);
  ASSERT_THAT(third.status(), IsOk());
  EXPECT_EQ(third->version(), 3) << "not 1 again";

  // The state file's name taken by a directory: the write fails (as root too), and the
  // failure names the file to on_persist_failure as in the refusal.
  std::vector<std::string> failures;
  StoreOptions o;
  o.clock = [this] { return clock_.Now(); };
  o.state_dir = dir;
  o.on_persist_failure = [&failures](absl::string_view what) {
    failures.emplace_back(what);
  };
  auto failing = OperatorStore::Create(std::move(o), {});
  ASSERT_THAT(failing.status(), IsOk());
  ASSERT_TRUE(std::filesystem::remove(StateFilePath(dir)));
  ASSERT_TRUE(std::filesystem::create_directory(StateFilePath(dir)));
  up.mutable_config()->set_window_steps(80);
  EXPECT_THAT((*failing)->UpdateGateConfig(up, kTest),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(StateFilePath(dir))));
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], AllOf(HasSubstr(StateFilePath(dir)), HasSubstr("nothing was changed")));
}

// SIGHUP's half in the store: a new --config layer applies under the API's overrides as a
// new global version; a file that changes nothing served keeps the version; a file that
// is invalid with the global or a job's overrides on top is refused, naming the clash,
// and the running config stays.
TEST_F(OperatorStoreTest, AReloadedConfigFileSitsUnderTheApiOverrides) {
  v1::GateConfig file;
  file.set_max_rs_wait_share(0.5);
  auto store = Make("", file);
  v1::UpdateGateConfigRequest up;
  up.mutable_config()->set_rs_wait_reenable_margin(0.3);
  up.mutable_update_mask()->add_paths("rs_wait_reenable_margin");
  ASSERT_THAT(store->UpdateGateConfig(up, kTest).status(), IsOk());
  const v1::VersionedGateConfig before = store->GetGateConfig("");

  v1::GateConfig next = file;
  next.set_window_steps(10);
  next.set_rs_wait_reenable_margin(0.1);
  ASSERT_THAT(store->ReloadConfigFile(next), IsOk());
  const v1::VersionedGateConfig reloaded = store->GetGateConfig("");
  // The file's fields as last loaded, for gates get's SOURCE (a job's scope has none).
  EXPECT_EQ(reloaded.file_config().SerializeAsString(), next.SerializeAsString());
  EXPECT_EQ(before.file_config().SerializeAsString(), file.SerializeAsString());
  EXPECT_FALSE(store->GetGateConfig("j").has_file_config());
  EXPECT_GT(reloaded.version(), before.version());
  EXPECT_EQ(store->GlobalVersion(), reloaded.version());
  EXPECT_EQ(reloaded.config().window_steps(), 10);                      // the new file
  EXPECT_DOUBLE_EQ(reloaded.config().rs_wait_reenable_margin(), 0.3);  // API over file

  ASSERT_THAT(store->ReloadConfigFile(next), IsOk());
  EXPECT_EQ(store->GetGateConfig("").version(), reloaded.version()) << "nothing changed";

  // Without the file's max_rs_wait_share the default 0.22 is below the override's margin.
  v1::GateConfig clash;
  clash.set_window_steps(10);
  EXPECT_THAT(store->ReloadConfigFile(clash),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("global overrides"), HasSubstr("rs_wait_reenable_margin"))));
  EXPECT_EQ(store->GetGateConfig("").SerializeAsString(), reloaded.SerializeAsString());

  // A job's own overrides are checked over the new file too.
  v1::UpdateGateConfigRequest job_up;
  job_up.set_job_id("j");
  job_up.mutable_config()->set_rs_wait_reenable_margin(0.45);
  job_up.mutable_update_mask()->add_paths("rs_wait_reenable_margin");
  ASSERT_THAT(store->UpdateGateConfig(job_up, kTest).status(), IsOk());
  v1::GateConfig lower = next;
  lower.set_max_rs_wait_share(0.4);
  EXPECT_THAT(store->ReloadConfigFile(lower),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job j")));
  EXPECT_EQ(store->GetGateConfig("").SerializeAsString(), reloaded.SerializeAsString());
}

// The config file's errors name the file, the line and the field: a parse error (the
// parser's line and column) and a value out of range (the line the field was set on).
TEST(GateConfigFileTest, ErrorsNameTheFileTheLineAndTheField) {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"max_length_cv: 0.2\nmax_rs_wait_share: 1.5\n",
       "gates.textproto: gate config: line 2: max_rs_wait_share must be finite and in (0, 1], "
       "got 1.5"},
      {"# tuned\n\nwindow_steps: 0\n",
       "gates.textproto: gate config: line 3: window_steps must be in [1, 1000000], got 0"},
      {"max_rs_wait_share: 0.2\nrs_wait_reenable_margin: 0.3\n",
       "gates.textproto: gate config: line 2: rs_wait_reenable_margin (0.3) must be less than "
       "max_rs_wait_share (0.2)"},
      {"max_length_cv: 0.2\nmax_lenght_cv: 0.3\n", "gates.textproto: not a valid"},
      {"max_length_cv: 0.2\nmax_lenght_cv: 0.3\n", "line 2 column 14"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseGateConfigText("gates.textproto", c.text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.text;
  }
  // A margin the file left at its default, clashing with the file's threshold, names the
  // threshold's line.
  EXPECT_THAT(ParseGateConfigText("g", "window_steps: 10\nmax_rs_wait_share: 0.02\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("g: gate config: line 2: rs_wait_reenable_margin (0.03) must "
                                 "be less than max_rs_wait_share (0.02)")));
  EXPECT_THAT(ParseGateConfigText("g", "max_length_cv: 0.3\nwindow_steps: 10\n"), IsOk());
}

TEST_F(OperatorStoreTest, CorruptStateFileIsAStartupErrorNamingTheFile) {
  const std::string dir = TempDir();
  std::ofstream(StateFilePath(dir)) << "global_overrides { max_length_cv: oops }\n";
  StoreOptions o;
  o.clock = [this] { return clock_.Now(); };
  o.state_dir = dir;
  EXPECT_THAT(OperatorStore::Create(o, {}).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(StateFilePath(dir))));
  // Out-of-range values are as corrupt as unparsable ones.
  std::ofstream(StateFilePath(dir)) << "global_overrides { max_length_cv: -1 }\n";
  EXPECT_THAT(OperatorStore::Create(o, {}).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("max_length_cv")));
  // A version counter no daemon reaches: the next change would overflow it (found by
  // tests/fuzz/state_file_fuzz, corpus/state_file_fuzz/12-counter-max.textproto).
  std::ofstream(StateFilePath(dir))
      << "version_counter: 9223372036854775807\nfile_layer { window_steps: 10 }\n";
  EXPECT_THAT(OperatorStore::Create(o, {}).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("version_counter")));
  // Every refusal names the file and says what to do, whichever check refused it.
  const std::string hint = " (fix or move the file; it is never replaced by defaults)";
  for (const std::string text :
       {"global_overrides { max_length_cv: oops }\n", "global_overrides { max_length_cv: -1 }\n",
        "version_counter: -3\n", "jobs { overrides { window_steps: 10 } }\n",
        "pins { job_id: \"a b\" mode: SEQUENCE_PARALLEL expire_time { seconds: 4000000000 } }\n"}) {
    std::ofstream(StateFilePath(dir), std::ios::trunc) << text;
    EXPECT_THAT(OperatorStore::Create(o, {}).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr("corrupt state file " + StateFilePath(dir)),
                               HasSubstr(hint))))
        << text;
  }
  std::ofstream(StateFilePath(dir), std::ios::trunc) << "version_counter: -3\n";
  EXPECT_THAT(OperatorStore::Create(o, {}).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(": version_counter -3 out of range [0, 4611686018427387904]" +
                                 hint)));
}

// A changed --config file takes a new version at start-up, written before the store is
// used: a daemon killed (-9) right after would otherwise come back with the old counter
// and give the next file the version the first one was served under.
TEST_F(OperatorStoreTest, AChangedConfigFilesVersionIsWrittenAtStartUp) {
  const std::string dir = TempDir();
  v1::GateConfig a, b;
  a.set_max_length_cv(0.25);
  b.set_max_length_cv(0.35);
  std::vector<std::pair<v1::GateConfig, double>> starts = {{a, 0.25}, {b, 0.35}, {a, 0.25}};
  int64_t last = 0;
  for (const auto& [file, cv] : starts) {
    // Each store dropped without a change or a Flush: what a kill -9 leaves.
    auto store = Make(dir, file);
    ASSERT_NE(store, nullptr);
    const v1::VersionedGateConfig served = store->GetGateConfig("");
    EXPECT_DOUBLE_EQ(served.config().max_length_cv(), cv);
    EXPECT_GT(served.version(), last) << "one version, one config";
    last = served.version();
  }
  EXPECT_EQ(last, 3);
  // An unchanged file keeps its version, and writes nothing.
  const std::string written = ReadAll(StateFilePath(dir));
  auto store = Make(dir, a);
  EXPECT_EQ(store->GetGateConfig("").version(), 3);
  EXPECT_EQ(ReadAll(StateFilePath(dir)), written);
}

TEST_F(OperatorStoreTest, StartUpRemovesTempFilesOfDeadWritersOnly) {
  const std::string dir = TempDir();
  { auto store = Make(dir); }
  const std::string path = StateFilePath(dir);
  const std::string state_text = ReadAll(path);
  // A child that has exited stands for a daemon killed between its temp file and the
  // rename; this process for a writer still running.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string stale = absl::StrCat(path, ".tmp.", dead);
  const std::string live = absl::StrCat(path, ".tmp.", getppid());
  const std::string other = absl::StrCat(path, ".tmp.notapid");
  for (const std::string& f : {stale, live, other}) std::ofstream(f) << "version_counter: 1\n";

  EXPECT_EQ(RemoveStaleTempFiles(path), 1);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_EQ(ReadAll(path), state_text);

  // The store does it at start-up.
  std::ofstream(stale) << "version_counter: 1\n";
  auto store = Make(dir);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_EQ(ReadAll(path), state_text);
}

TEST_F(OperatorStoreTest, EveryChangeIsAuditedWithItsPrincipal) {
  const std::string dir = TempDir();
  auto store = Make(dir);
  auto global = store->UpdateGateConfig(SetCv(0.3), AuditContext{"alice"});
  ASSERT_THAT(global.status(), IsOk());
  v1::UpdateGateConfigRequest job = SetCv(0.5, "j");
  job.mutable_config()->set_window_steps(10);
  job.mutable_update_mask()->add_paths("window_steps");
  auto job_v = store->UpdateGateConfig(job, AuditContext{"bob"});
  ASSERT_THAT(job_v.status(), IsOk());
  v1::PinModeRequest pin;
  pin.set_job_id("j");
  pin.set_group(0);
  pin.set_mode(v1::TENSOR_PARALLEL_ONLY);
  pin.mutable_duration()->set_seconds(600);
  ASSERT_THAT(store->PinMode(pin, AuditContext{"CN=ops"}).status(), IsOk());
  v1::UnpinRequest unpin;
  unpin.set_job_id("j");
  ASSERT_THAT(store->Unpin(unpin, AuditContext{"carol"}).status(), IsOk());

  auto records = ReadAuditLog(AuditLogPath(dir));
  ASSERT_THAT(records.status(), IsOk());
  ASSERT_EQ(records->size(), 4u);
  const v1::AuditEntry& e0 = (*records)[0].entry;
  EXPECT_EQ(e0.principal(), "alice");
  EXPECT_EQ(e0.rpc(), "UpdateGateConfig");
  EXPECT_EQ(e0.job_id(), "");
  EXPECT_EQ(e0.version(), global->version());
  EXPECT_EQ(absl::FromUnixSeconds(e0.time().seconds()), clock_.Now());
  ASSERT_EQ(e0.changes_size(), 1);
  EXPECT_EQ(e0.changes(0).field(), "max_length_cv");
  EXPECT_FALSE(e0.changes(0).old_value().set());
  EXPECT_DOUBLE_EQ(e0.changes(0).new_value().value(), 0.3);
  const v1::AuditEntry& e1 = (*records)[1].entry;
  EXPECT_EQ(e1.job_id(), "j");
  EXPECT_EQ(e1.version(), job_v->version());
  EXPECT_EQ(e1.changes_size(), 2);
  EXPECT_DOUBLE_EQ(e1.overrides().max_length_cv(), 0.5);
  EXPECT_EQ(e1.overrides().window_steps(), 10);
  const v1::AuditEntry& e2 = (*records)[2].entry;
  EXPECT_EQ(e2.rpc(), "PinMode");
  EXPECT_EQ(e2.principal(), "CN=ops");
  EXPECT_EQ(e2.group(), 0);
  EXPECT_TRUE(e2.has_group());
  EXPECT_EQ(e2.mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_EQ(absl::FromUnixSeconds(e2.expire_time().seconds()), clock_.Now() + absl::Minutes(10));
  const v1::AuditEntry& e3 = (*records)[3].entry;
  EXPECT_EQ(e3.rpc(), "Unpin");
  EXPECT_EQ(e3.removed(), 1);
  // One JSON object per line.
  const std::string text = ReadAll(AuditLogPath(dir));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4);
  EXPECT_THAT(text, HasSubstr("\"principal\":\"alice\""));

  // History: newest first, filtered by job, paged.
  v1::ListConfigHistoryRequest h;
  auto all = store->ListConfigHistory(h);
  ASSERT_THAT(all.status(), IsOk());
  ASSERT_EQ(all->entries_size(), 4);
  EXPECT_EQ(all->entries(0).rpc(), "Unpin");
  EXPECT_EQ(all->next_page_token(), "");
  h.set_job_id("j");
  h.set_page_size(2);
  auto page1 = store->ListConfigHistory(h);
  ASSERT_THAT(page1.status(), IsOk());
  ASSERT_EQ(page1->entries_size(), 2);
  EXPECT_EQ(page1->entries(1).rpc(), "PinMode");
  ASSERT_NE(page1->next_page_token(), "");
  h.set_page_token(page1->next_page_token());
  auto page2 = store->ListConfigHistory(h);
  ASSERT_THAT(page2.status(), IsOk());
  ASSERT_EQ(page2->entries_size(), 1);
  EXPECT_EQ(page2->entries(0).principal(), "bob");
  EXPECT_EQ(page2->next_page_token(), "");
  h.set_page_size(kMaxHistoryPageSize + 1);
  EXPECT_THAT(store->ListConfigHistory(h).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_size")));
  h.set_page_size(0);
  h.set_page_token("x");
  EXPECT_THAT(store->ListConfigHistory(h).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page_token")));
}

v1::PinModeRequest PinRequest(const std::string& job, std::optional<int> group, v1::Mode mode,
                              absl::Duration d, bool force = false) {
  v1::PinModeRequest r;
  r.set_job_id(job);
  if (group) r.set_group(*group);
  r.set_mode(mode);
  r.mutable_duration()->set_seconds(absl::ToInt64Seconds(d));
  r.set_force(force);
  return r;
}

// A pin's audit entry reads old -> new: the pin it replaced at the same scope (only one
// still in force), and an unpin names every pin it removed.
TEST_F(OperatorStoreTest, PinAuditRecordsTheReplacedAndRemovedPins) {
  const std::string dir = TempDir();
  auto store = Make(dir);
  const AuditContext ops{"ops"};
  const absl::Time t0 = clock_.Now();
  // 1: job pin, nothing before it.
  ASSERT_THAT(store->PinMode(PinRequest("j", std::nullopt, v1::SEQUENCE_PARALLEL,
                                        absl::Minutes(10)), ops).status(), IsOk());
  // 2: job pin replacing 1, forced.
  ASSERT_THAT(store->PinMode(PinRequest("j", std::nullopt, v1::TENSOR_PARALLEL_ONLY,
                                        absl::Minutes(20), /*force=*/true), ops).status(), IsOk());
  // 3: group 1's pin does not replace the job's.
  ASSERT_THAT(store->PinMode(PinRequest("j", 1, v1::SEQUENCE_PARALLEL, absl::Minutes(1)), ops)
                  .status(), IsOk());
  // 4: group 1 again after its pin expired: nothing in force was replaced.
  clock_.Advance(absl::Minutes(2));
  ASSERT_THAT(store->PinMode(PinRequest("j", 1, v1::TENSOR_PARALLEL_ONLY, absl::Minutes(5)), ops)
                  .status(), IsOk());
  // 5: group 1 replaced while in force.
  ASSERT_THAT(store->PinMode(PinRequest("j", 1, v1::SEQUENCE_PARALLEL, absl::Minutes(30)), ops)
                  .status(), IsOk());
  // 6: group 2, then 7: unpin group 2 alone, 8: unpin the job (job pin + group 1).
  ASSERT_THAT(store->PinMode(PinRequest("j", 2, v1::SEQUENCE_PARALLEL, absl::Minutes(1)), ops)
                  .status(), IsOk());
  v1::UnpinRequest unpin;
  unpin.set_job_id("j");
  unpin.set_group(2);
  ASSERT_THAT(store->Unpin(unpin, ops).status(), IsOk());
  unpin.clear_group();
  ASSERT_THAT(store->Unpin(unpin, ops).status(), IsOk());
  // 9: unpin with nothing left.
  ASSERT_THAT(store->Unpin(unpin, ops).status(), IsOk());

  auto records = ReadAuditLog(AuditLogPath(dir));
  ASSERT_THAT(records.status(), IsOk());
  ASSERT_EQ(records->size(), 9u);
  auto entry = [&](int i) -> const v1::AuditEntry& { return (*records)[i].entry; };
  auto expire = [](const v1::Pin& p) { return absl::FromUnixSeconds(p.expire_time().seconds()); };

  EXPECT_FALSE(entry(0).has_replaced_pin());
  ASSERT_TRUE(entry(1).has_replaced_pin());
  EXPECT_TRUE(entry(1).force());
  EXPECT_EQ(entry(1).replaced_pin().job_id(), "j");
  EXPECT_FALSE(entry(1).replaced_pin().has_group());
  EXPECT_EQ(entry(1).replaced_pin().mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_FALSE(entry(1).replaced_pin().force());
  EXPECT_EQ(expire(entry(1).replaced_pin()), t0 + absl::Minutes(10));
  EXPECT_FALSE(entry(2).has_replaced_pin());
  EXPECT_FALSE(entry(3).has_replaced_pin());
  ASSERT_TRUE(entry(4).has_replaced_pin());
  EXPECT_EQ(entry(4).replaced_pin().group(), 1);
  EXPECT_EQ(entry(4).replaced_pin().mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_EQ(expire(entry(4).replaced_pin()), t0 + absl::Minutes(7));

  EXPECT_EQ(entry(6).rpc(), "Unpin");
  EXPECT_EQ(entry(6).removed(), 1);
  ASSERT_EQ(entry(6).removed_pins_size(), 1);
  EXPECT_EQ(entry(6).removed_pins(0).group(), 2);
  EXPECT_EQ(entry(7).removed(), 2);
  ASSERT_EQ(entry(7).removed_pins_size(), 2);
  EXPECT_FALSE(entry(7).removed_pins(0).has_group());
  EXPECT_EQ(entry(7).removed_pins(0).mode(), v1::TENSOR_PARALLEL_ONLY);
  EXPECT_TRUE(entry(7).removed_pins(0).force());
  EXPECT_EQ(expire(entry(7).removed_pins(0)), t0 + absl::Minutes(20));
  EXPECT_EQ(entry(7).removed_pins(1).group(), 1);
  EXPECT_EQ(entry(7).removed_pins(1).mode(), v1::SEQUENCE_PARALLEL);
  EXPECT_EQ(entry(8).removed(), 0);
  EXPECT_EQ(entry(8).removed_pins_size(), 0);
}

TEST_F(OperatorStoreTest, RollbackRestoresTheOverridesOfThatVersion) {
  const std::string dir = TempDir();
  auto store = Make(dir);
  auto v1 = store->UpdateGateConfig(SetCv(0.3), kTest);
  ASSERT_THAT(v1.status(), IsOk());
  v1::UpdateGateConfigRequest second = SetCv(0.4);
  second.mutable_config()->set_window_steps(10);
  second.mutable_update_mask()->add_paths("window_steps");
  auto v2 = store->UpdateGateConfig(second, kTest);
  ASSERT_THAT(v2.status(), IsOk());
  auto job_v = store->UpdateGateConfig(SetCv(0.6, "j"), kTest);
  ASSERT_THAT(job_v.status(), IsOk());

  v1::RollbackGateConfigRequest rb;
  rb.set_to_version(v1->version());
  auto back = store->RollbackGateConfig(rb, AuditContext{"alice"});
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_GT(back->version(), job_v->version());
  EXPECT_DOUBLE_EQ(back->config().max_length_cv(), 0.3);
  EXPECT_FALSE(back->overrides().has_window_steps());
  EXPECT_EQ(back->config().window_steps(), 50);  // the default again
  // The rollback is audited, as a new version with its changes.
  v1::ListConfigHistoryRequest h;
  h.set_page_size(1);
  auto newest = store->ListConfigHistory(h);
  ASSERT_THAT(newest.status(), IsOk());
  ASSERT_EQ(newest->entries_size(), 1);
  EXPECT_EQ(newest->entries(0).rpc(), "RollbackGateConfig");
  EXPECT_EQ(newest->entries(0).rolled_back_to(), v1->version());
  EXPECT_EQ(newest->entries(0).version(), back->version());
  EXPECT_EQ(newest->entries(0).changes_size(), 2);
  // A rollback to a rollback's version works too (it is a config change).
  rb.set_to_version(v2->version());
  ASSERT_THAT(store->RollbackGateConfig(rb, kTest).status(), IsOk());
  EXPECT_EQ(store->GetGateConfig("").config().window_steps(), 10);

  rb.set_to_version(999);
  EXPECT_THAT(store->RollbackGateConfig(rb, kTest).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("version 999")));
  rb.set_to_version(job_v->version());
  EXPECT_THAT(store->RollbackGateConfig(rb, kTest).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job j's config")));
  rb.set_job_id("j");
  rb.set_to_version(v1->version());
  EXPECT_THAT(store->RollbackGateConfig(rb, kTest).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the global config")));
  rb.set_to_version(job_v->version());
  rb.set_expected_version(1);
  EXPECT_THAT(store->RollbackGateConfig(rb, kTest).status(), StatusIs(absl::StatusCode::kAborted));

  auto memory_only = Make();
  rb.clear_expected_version();
  EXPECT_THAT(memory_only->RollbackGateConfig(rb, kTest).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--state_dir")));
  EXPECT_THAT(memory_only->ListConfigHistory({}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--state_dir")));
}

// Version 0 is the scope without API overrides: all of them gone, the --config file layer
// kept. Audited when something changed; a scope already there gets no new
// version; it needs no audit log, so it works without --state_dir too.
TEST_F(OperatorStoreTest, RollbackToZeroIsTheStartUpConfig) {
  v1::GateConfig file;
  file.set_window_steps(20);
  struct Case {
    std::string name;
    std::string state_dir;
  };
  for (const Case& c : {Case{"with --state_dir", TempDir()}, Case{"in memory", ""}}) {
    SCOPED_TRACE(c.name);
    auto store = Make(c.state_dir, file);
    ASSERT_THAT(store->UpdateGateConfig(SetCv(0.3), kTest).status(), IsOk());
    ASSERT_THAT(store->UpdateGateConfig(SetCv(0.6, "j"), kTest).status(), IsOk());

    v1::RollbackGateConfigRequest rb;
    rb.set_to_version(0);
    rb.set_job_id("j");
    auto job = store->RollbackGateConfig(rb, kTest);
    ASSERT_THAT(job.status(), IsOk());
    EXPECT_EQ(job->overrides().ByteSizeLong(), 0u);
    EXPECT_DOUBLE_EQ(job->config().max_length_cv(), 0.3);  // inherited from the global scope
    rb.clear_job_id();
    auto global = store->RollbackGateConfig(rb, kTest);
    ASSERT_THAT(global.status(), IsOk());
    EXPECT_EQ(global->overrides().ByteSizeLong(), 0u);
    EXPECT_DOUBLE_EQ(global->config().max_length_cv(), 0.18);  // the default
    EXPECT_EQ(global->config().window_steps(), 20);            // the file layer stays
    EXPECT_GT(global->version(), job->version());
    // Already at version 0: nothing changes, no new version.
    auto again = store->RollbackGateConfig(rb, kTest);
    ASSERT_THAT(again.status(), IsOk());
    EXPECT_EQ(again->version(), global->version());
    if (!c.state_dir.empty()) {
      v1::ListConfigHistoryRequest h;
      h.set_page_size(1);
      auto newest = store->ListConfigHistory(h);
      ASSERT_THAT(newest.status(), IsOk());
      ASSERT_EQ(newest->entries_size(), 1);
      EXPECT_EQ(newest->entries(0).rpc(), "RollbackGateConfig");
      EXPECT_EQ(newest->entries(0).rolled_back_to(), 0);
      EXPECT_EQ(newest->entries(0).version(), global->version());
    }
    rb.set_to_version(-1);
    EXPECT_THAT(store->RollbackGateConfig(rb, kTest).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("to_version")));
  }
}

}  // namespace
}  // namespace spgate::server
