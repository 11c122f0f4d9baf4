// spgatectl's command line: every command's request, the global flags, help, and the
// usage errors (each message names the flag or argument at fault). Pure: no daemon.
#include "tools/spgatectl/commands.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "tools/spgatectl/command_table.h"

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate::ctl {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Args(const std::string& line) {
  if (line.empty()) return {};
  return absl::StrSplit(line, ' ');
}

// The request of the parsed command, in text format, for one-line expectations.
std::string RequestText(const Invocation& inv) {
  const google::protobuf::Message* m = nullptr;
  switch (inv.command) {
    case Command::kGatesGet: m = &inv.gates_get; break;
    case Command::kGatesSet: m = &inv.gates_set; break;
    case Command::kJobsList: m = &inv.jobs_list; break;
    case Command::kJobsShow: m = &inv.jobs_show; break;
    case Command::kJobsForget: m = &inv.jobs_forget; break;
    case Command::kPin: m = &inv.pin; break;
    case Command::kUnpin: m = &inv.unpin; break;
    case Command::kWatch: m = &inv.watch; break;
    case Command::kEval: m = &inv.eval; break;
    case Command::kGatesHistory: m = &inv.gates_history; break;
    case Command::kGatesRollback: m = &inv.gates_rollback; break;
    case Command::kHelp:
    case Command::kVersion:
    case Command::kCompletion: return "help";
  }
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string out;
  printer.PrintToString(*m, &out);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

struct GoodCase {
  std::string line;
  Command command;
  std::string name;
  std::string request;  // text format, single line
};

void PrintTo(const GoodCase& c, std::ostream* os) { *os << '"' << c.line << '"'; }

class ParseGood : public ::testing::TestWithParam<GoodCase> {};

TEST_P(ParseGood, BuildsTheRequest) {
  const GoodCase& c = GetParam();
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args(c.line), &inv), IsOk()) << c.line;
  EXPECT_EQ(inv.command, c.command) << c.line;
  EXPECT_EQ(inv.name, c.name) << c.line;
  EXPECT_EQ(RequestText(inv), c.request) << c.line;
}

INSTANTIATE_TEST_SUITE_P(
    Commands, ParseGood,
    ::testing::Values(
        GoodCase{"gates get", Command::kGatesGet, "gates get", ""},
        GoodCase{"gates get --job_id=j1", Command::kGatesGet, "gates get", "job_id: \"j1\""},
        GoodCase{"gates get --job_id j1", Command::kGatesGet, "gates get", "job_id: \"j1\""},
        GoodCase{"gates set --max_length_cv=0.2", Command::kGatesSet, "gates set",
                 "config { max_length_cv: 0.2 } update_mask { paths: \"max_length_cv\" }"},
        GoodCase{"gates set --job_id=j1 --window_steps=10 --max_rs_wait_share=0.3 "
                 "--expected_version=7",
                 Command::kGatesSet, "gates set",
                 "job_id: \"j1\" config { max_rs_wait_share: 0.3 window_steps: 10 } update_mask "
                 "{ paths: \"window_steps\" paths: \"max_rs_wait_share\" } expected_version: 7"},
        // --clear: masked but unset, so the server removes the override.
        GoodCase{"gates set --clear=max_length_cv,min_dwell_steps --memory_headroom=0.8",
                 Command::kGatesSet, "gates set",
                 "config { memory_headroom: 0.8 } update_mask { paths: \"memory_headroom\" paths: "
                 "\"max_length_cv\" paths: \"min_dwell_steps\" }"},
        // The policy is set by name, either case.
        GoodCase{"gates set --job_id=j1 --policy=adaptive --adaptive_margin=0.05",
                 Command::kGatesSet, "gates set",
                 "job_id: \"j1\" config { policy: ADAPTIVE adaptive_margin: 0.05 } update_mask "
                 "{ paths: \"policy\" paths: \"adaptive_margin\" }"},
        GoodCase{"gates set --policy=STATIC", Command::kGatesSet, "gates set",
                 "config { policy: STATIC } update_mask { paths: \"policy\" }"},
        GoodCase{"gates set --max_length_cv=-1", Command::kGatesSet, "gates set",
                 "config { max_length_cv: -1 } update_mask { paths: \"max_length_cv\" }"},
        GoodCase{"gates history", Command::kGatesHistory, "gates history", ""},
        GoodCase{"gates history --job_id=j1 --limit=20 --page_token=1234",
                 Command::kGatesHistory, "gates history",
                 "job_id: \"j1\" page_size: 20 page_token: \"1234\""},
        GoodCase{"gates rollback --to_version=0", Command::kGatesRollback, "gates rollback", ""},
        GoodCase{"gates rollback --to_version=7", Command::kGatesRollback, "gates rollback",
                 "to_version: 7"},
        GoodCase{"gates rollback --job_id=j1 --to_version=7 --expected_version=9",
                 Command::kGatesRollback, "gates rollback",
                 "job_id: \"j1\" to_version: 7 expected_version: 9"},
        GoodCase{"jobs list", Command::kJobsList, "jobs list", ""},
        GoodCase{"jobs show llama", Command::kJobsShow, "jobs show", "job_id: \"llama\""},
        GoodCase{"pin llama --mode=sp --for=10m", Command::kPin, "pin",
                 "job_id: \"llama\" mode: SEQUENCE_PARALLEL duration { seconds: 600 }"},
        GoodCase{"pin llama --group=3 --mode=tp --for=1.5s", Command::kPin, "pin",
                 "job_id: \"llama\" group: 3 mode: TENSOR_PARALLEL_ONLY duration { seconds: 1 "
                 "nanos: 500000000 }"},
        GoodCase{"pin llama --mode=tp --for=10m --force", Command::kPin, "pin",
                 "job_id: \"llama\" mode: TENSOR_PARALLEL_ONLY duration { seconds: 600 } "
                 "force: true"},
        // A bare --force never swallows the next argument.
        GoodCase{"pin --force llama --mode=tp --for=10m", Command::kPin, "pin",
                 "job_id: \"llama\" mode: TENSOR_PARALLEL_ONLY duration { seconds: 600 } "
                 "force: true"},
        GoodCase{"pin llama --mode=tp --for=10m --force=false", Command::kPin, "pin",
                 "job_id: \"llama\" mode: TENSOR_PARALLEL_ONLY duration { seconds: 600 }"},
        GoodCase{"unpin llama", Command::kUnpin, "unpin", "job_id: \"llama\""},
        GoodCase{"jobs forget llama", Command::kJobsForget, "jobs forget", "job_id: \"llama\""},
        GoodCase{"jobs forget llama --operator_settings=true", Command::kJobsForget,
                 "jobs forget", "job_id: \"llama\" forget_operator_settings: true"},
        // Every boolean flag is true bare, as --force is, and never swallows JOB.
        GoodCase{"jobs forget llama --operator_settings", Command::kJobsForget,
                 "jobs forget", "job_id: \"llama\" forget_operator_settings: true"},
        GoodCase{"jobs forget --operator_settings llama", Command::kJobsForget,
                 "jobs forget", "job_id: \"llama\" forget_operator_settings: true"},
        GoodCase{"jobs forget llama --operator_settings=false", Command::kJobsForget,
                 "jobs forget", "job_id: \"llama\""},
        GoodCase{"unpin llama --group=0", Command::kUnpin, "unpin", "job_id: \"llama\" group: 0"},
        GoodCase{"watch", Command::kWatch, "watch", ""},
        GoodCase{"watch llama --count=3", Command::kWatch, "watch", "job_id: \"llama\""},
        GoodCase{"watch --job_id=llama", Command::kWatch, "watch", "job_id: \"llama\""},
        GoodCase{"eval --lengths=512,4096", Command::kEval, "eval", "lengths: 512 lengths: 4096"},
        GoodCase{"eval --lengths=512 --budget=0", Command::kEval, "eval", "lengths: 512"},
        GoodCase{"eval --lengths=100 --rs_wait_share=0.3 --job_id=j --group=2 --budget=80GiB "
                 "--peak_sp=1KiB --peak_tp=2048 --max_length_cv=1 --probe_interval_steps=5",
                 Command::kEval, "eval",
                 "job_id: \"j\" lengths: 100 rs_wait_share: 0.3 predicted_peak_bytes_sp: 1024 "
                 "predicted_peak_bytes_tp: 2048 memory_budget_bytes: 85899345920 config { "
                 "max_length_cv: 1 probe_interval_steps: 5 } group: 2"},
        // Global flags go anywhere, and `--` ends the flags.
        GoodCase{"--admin=h:1 jobs --output=json show -- --odd-job", Command::kJobsShow,
                 "jobs show", "job_id: \"--odd-job\""}));

TEST(ParseCommandLine, WatchCount) {
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args("watch llama --count=3"), &inv), IsOk());
  EXPECT_EQ(inv.watch_count, 3);
  ASSERT_THAT(ParseCommandLine(Args("watch"), &inv), IsOk());
  EXPECT_EQ(inv.watch_count, 0);
}

TEST(ParseCommandLine, GlobalFlags) {
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args("jobs list"), &inv), IsOk());
  EXPECT_EQ(inv.global.admin, "127.0.0.1:50062");
  EXPECT_EQ(inv.global.timeout, absl::Seconds(5));
  EXPECT_EQ(inv.global.output, OutputFormat::kTable);
  EXPECT_FALSE(inv.global.UseTls());

  ASSERT_THAT(ParseCommandLine(Args("--admin=10.0.0.1:7 --token_file=/t --timeout=250ms "
                                    "--output=json --tls_ca=/ca.pem --tls_cert=/c.pem "
                                    "--tls_key=/k.pem --tls_server_name=spgated jobs list"),
                               &inv),
              IsOk());
  EXPECT_EQ(inv.global.admin, "10.0.0.1:7");
  EXPECT_EQ(inv.global.token_file, "/t");
  EXPECT_EQ(inv.global.timeout, absl::Milliseconds(250));
  EXPECT_EQ(inv.global.output, OutputFormat::kJson);
  EXPECT_EQ(inv.global.tls_ca, "/ca.pem");
  EXPECT_EQ(inv.global.tls_cert, "/c.pem");
  EXPECT_EQ(inv.global.tls_key, "/k.pem");
  EXPECT_EQ(inv.global.tls_server_name, "spgated");
  EXPECT_TRUE(inv.global.UseTls());
}

struct HelpCase {
  std::string line;
  std::string first_line;
};

void PrintTo(const HelpCase& c, std::ostream* os) { *os << '"' << c.line << '"'; }

class ParseHelp : public ::testing::TestWithParam<HelpCase> {};

TEST_P(ParseHelp, PrintsTheRightHelp) {
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args(GetParam().line), &inv), IsOk());
  EXPECT_EQ(inv.command, Command::kHelp);
  const std::vector<std::string> lines = absl::StrSplit(inv.help, '\n');
  EXPECT_EQ(lines[0], GetParam().first_line) << inv.help;
  EXPECT_THAT(inv.help, HasSubstr("--admin=ADDR")) << "global flags are listed";
}

INSTANTIATE_TEST_SUITE_P(
    Commands, ParseHelp,
    ::testing::Values(
        HelpCase{"--help", "spgatectl: operator CLI of spgated, the sequence-parallel gate daemon."},
        HelpCase{"help", "spgatectl: operator CLI of spgated, the sequence-parallel gate daemon."},
        HelpCase{"gates set --help",
                 "Usage: spgatectl gates set [--job_id=J] [--FIELD=VALUE ...] [--clear=FIELD,...] "
                 "[--expected_version=N]"},
        HelpCase{"help gates set",
                 "Usage: spgatectl gates set [--job_id=J] [--FIELD=VALUE ...] [--clear=FIELD,...] "
                 "[--expected_version=N]"},
        HelpCase{"pin -h",
                 "Usage: spgatectl pin JOB [--group=G] --mode=sp|tp --for=DURATION [--force]"},
        HelpCase{"jobs show --help", "Usage: spgatectl jobs show JOB"},
        HelpCase{"jobs forget --help", "Usage: spgatectl jobs forget JOB [--operator_settings]"},
        HelpCase{"watch --help", "Usage: spgatectl watch [JOB] [--count=N]"},
        // --help wins over errors elsewhere on the line.
        HelpCase{"eval --lengths=abc --help",
                 "Usage: spgatectl eval --lengths=L1,L2,... [--rs_wait_share=S] [--job_id=J] "
                 "[--group=G]"}));

TEST(ParseCommandLine, GroupHelpListsSubcommands) {
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args("gates --help"), &inv), IsOk());
  EXPECT_THAT(inv.help, HasSubstr("gates get"));
  EXPECT_THAT(inv.help, HasSubstr("gates set"));
  ASSERT_THAT(ParseCommandLine(Args("help jobs"), &inv), IsOk());
  EXPECT_THAT(inv.help, HasSubstr("jobs show"));
}

TEST(ParseCommandLine, PinHelpExplainsForce) {
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args("pin --help"), &inv), IsOk());
  EXPECT_THAT(inv.help, HasSubstr("--force  "));
  EXPECT_THAT(inv.help, HasSubstr("memory gate"));
}

TEST(ParseCommandLine, GatesSetHelpListsEveryGateConfigField) {
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args("gates set --help"), &inv), IsOk());
  const auto* desc = v1::GateConfig::descriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    EXPECT_THAT(inv.help, HasSubstr("--" + desc->field(i)->name() + "=")) << desc->field(i)->name();
  }
}

struct BadCase {
  std::string line;
  std::string name;     // the command as recognised
  std::string message;  // the exact usage error
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << '"' << c.line << '"'; }

class ParseBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(ParseBad, NamesTheFlagOrArgument) {
  const BadCase& c = GetParam();
  Invocation inv;
  EXPECT_THAT(ParseCommandLine(Args(c.line), &inv),
              StatusIs(absl::StatusCode::kInvalidArgument, c.message))
      << c.line;
  EXPECT_EQ(inv.name, c.name) << c.line;
}

INSTANTIATE_TEST_SUITE_P(
    Commands, ParseBad,
    ::testing::Values(
        BadCase{"", "",
                "missing command (one of gates, jobs, pin, unpin, watch, eval, completion, help; "
                "see --help)"},
        BadCase{"frobnicate", "",
                "unknown command \"frobnicate\" (one of gates, jobs, pin, unpin, watch, eval, "
                "completion, help)"},
        // Did you mean: commands, subcommands, help topics, flags, values.
        BadCase{"jbos list", "", "unknown command \"jbos\" (did you mean jobs?)"},
        BadCase{"evla --lengths=1", "", "unknown command \"evla\" (did you mean eval?)"},
        BadCase{"gates rolback", "gates", "unknown subcommand \"rolback\" (did you mean rollback?)"},
        BadCase{"help jbos", "", "help: unknown command \"jbos\" (did you mean jobs?)"},
        BadCase{"--ouptut=json jobs list", "jobs list", "unknown flag --ouptut (did you mean --output?)"},
        BadCase{"jobs list -o jsno", "jobs list",
                "--output: \"jsno\" is not a format (want table, json or yaml) (did you mean json?)"},
        BadCase{"completion", "completion", "missing SHELL argument"},
        BadCase{"completion fish", "completion",
                "SHELL: \"fish\" is not a supported shell (one of bash, zsh)"},
        BadCase{"gates", "gates", "missing subcommand (one of get, set, history, rollback)"},
        BadCase{"gates put", "gates",
                "unknown subcommand \"put\" (one of get, set, history, rollback)"},
        BadCase{"gates rollback", "gates rollback",
                "--to_version is required (a version from 'spgatectl gates history')"},
        BadCase{"gates rollback --to_version=-1", "gates rollback",
                "--to_version: versions start at 0, got -1"},
        // The daemon's page bound, in the flag's words rather than the wire field's.
        BadCase{"gates history --limit=-1", "gates history",
                "--limit: must be in [0, 500] (0: 50), got -1"},
        BadCase{"gates history --limit=501", "gates history",
                "--limit: must be in [0, 500] (0: 50), got 501"},
        BadCase{"gates set --max_length_cv=0.3 --expected_version=-1", "gates set",
                "--expected_version: versions start at 0, got -1"},
        BadCase{"gates rollback --to_version=2 --expected_version=-3", "gates rollback",
                "--expected_version: versions start at 0, got -3"},
        BadCase{"jobs", "jobs", "missing subcommand (one of list, show, forget)"},
        BadCase{"help nope", "", "help: unknown command \"nope\""},
        // Unknown flags, with a suggestion when one is close.
        BadCase{"gates set --max_lenght_cv=0.2", "gates set",
                "unknown flag --max_lenght_cv (did you mean --max_length_cv?)"},
        BadCase{"gates get --max_length_cv=0.2", "gates get", "unknown flag --max_length_cv"},
        // Unknown and without a value: unknown is what is wrong (it said "missing value").
        BadCase{"jobs list --bogus", "jobs list", "unknown flag --bogus"},
        BadCase{"jobs show j --timeout", "jobs show", "--timeout: missing value (write --timeout=VALUE)"},
        BadCase{"jobs list --verbose=1", "jobs list", "unknown flag --verbose"},
        BadCase{"pin j --mode=sp --for=1m --gruop=1", "pin",
                "unknown flag --gruop (did you mean --group?)"},
        BadCase{"gates set --max_length_cv=0.2 --max_length_cv=0.3", "gates set",
                "--max_length_cv given twice"},
        BadCase{"gates get --job_id", "gates get", "--job_id: missing value (write --job_id=VALUE)"},
        // Values.
        BadCase{"gates set --max_length_cv=abc", "gates set",
                "--max_length_cv: \"abc\" is not a number"},
        BadCase{"gates set --window_steps=1.5", "gates set",
                "--window_steps: \"1.5\" is not an integer"},
        BadCase{"gates set --expected_version=v3 --max_length_cv=1", "gates set",
                "--expected_version: \"v3\" is not an integer"},
        BadCase{"gates set", "gates set",
                "nothing to change: give --FIELD=VALUE (e.g. --max_length_cv=0.2) or --clear=FIELD"},
        BadCase{"gates set --job_id=j", "gates set",
                "nothing to change: give --FIELD=VALUE (e.g. --max_length_cv=0.2) or --clear=FIELD"},
        BadCase{"gates set --clear=speed", "gates set",
                "--clear: \"speed\" is not a GateConfig field (one of max_length_cv, "
                "max_rs_wait_share, bucket_target_cv, rs_wait_reenable_margin, "
                "probe_interval_steps, min_dwell_steps, window_steps, memory_headroom, policy, "
                "adaptive_cv_band_width, adaptive_tokens_band_base, adaptive_half_life_steps, "
                "adaptive_min_samples, adaptive_margin, adaptive_explore_share, "
                "adaptive_explore_floor, adaptive_change_threshold, adaptive_explore_boost_steps, "
                "adaptive_flip_interval_steps, adaptive_straggler_share)"},
        BadCase{"gates set --policy=dynamic", "gates set",
                "--policy: \"dynamic\" is not a policy (STATIC or ADAPTIVE)"},
        BadCase{"gates set --clear=max_length_cv --max_length_cv=0.3", "gates set",
                "--clear: max_length_cv is also given as --max_length_cv=...; set it or clear it, "
                "not both"},
        BadCase{"gates get extra", "gates get", "unexpected argument \"extra\""},
        BadCase{"jobs show", "jobs show", "missing JOB argument"},
        BadCase{"jobs show a b", "jobs show", "unexpected argument \"b\""},
        BadCase{"pin --mode=sp --for=1m", "pin", "missing JOB argument"},
        BadCase{"pin j --for=1m", "pin", "--mode is required (sp or tp)"},
        BadCase{"pin j --mode=fast --for=1m", "pin", "--mode: \"fast\" is not a mode (want sp or tp)"},
        BadCase{"pin j --mode=tp", "pin",
                "--for is required (how long the pin lasts, e.g. --for=10m)"},
        BadCase{"pin j --mode=tp --for=10minutes", "pin",
                "--for: \"10minutes\" is not a duration (e.g. 30s, 10m, 1h30m, 2d)"},
        BadCase{"pin j --mode=tp --for=1m --group=x", "pin", "--group: \"x\" is not a 32-bit integer"},
        BadCase{"pin j --mode=sp --for=1m --force", "pin",
                "--force applies only to --mode=tp (it lets a TP-only pin override the memory "
                "gate); an SP pin always fits"},
        BadCase{"pin j --mode=tp --for=1m --force=yes", "pin",
                "--force: \"yes\" is not true or false"},
        BadCase{"unpin", "unpin", "missing JOB argument"},
        BadCase{"unpin j --force", "unpin",
                "--force belongs to 'pin --mode=tp'; unpin removes pins and has no --force"},
        BadCase{"jobs forget", "jobs forget", "missing JOB argument"},
        BadCase{"jobs forget j --operator_settings=yes", "jobs forget",
                "--operator_settings: \"yes\" is not true or false"},
        BadCase{"unpin j --group=1.0", "unpin", "--group: \"1.0\" is not a 32-bit integer"},
        BadCase{"watch a b", "watch", "unexpected argument \"b\""},
        BadCase{"watch a --job_id=b", "watch", "--job_id=b and the JOB argument \"a\" disagree"},
        BadCase{"watch --count=0", "watch", "--count: \"0\" is not at least 1"},
        BadCase{"watch --count=many", "watch", "--count: \"many\" is not an integer"},
        BadCase{"eval", "eval", "--lengths is required (e.g. --lengths=512,4096,16384)"},
        BadCase{"eval --lengths=512,x", "eval", "--lengths: item 2 \"x\" is not an integer"},
        BadCase{"eval --lengths=1 --rs_wait_share=high", "eval",
                "--rs_wait_share: \"high\" is not a number"},
        BadCase{"eval --lengths=1 --budget=80XB", "eval",
                "--budget: \"80XB\" is not a byte count (e.g. 85899345920, 80GiB, 512MiB)"},
        BadCase{"eval --lengths=1 --memory_headroom=most", "eval",
                "--memory_headroom: \"most\" is not a number"},
        BadCase{"eval --lengths=1 --clear=max_length_cv", "eval", "unknown flag --clear"},
        // Global flags.
        BadCase{"jobs list --output=xml", "jobs list",
                "--output: \"xml\" is not a format (want table, json or yaml)"},
        BadCase{"eval --lengths=1 --budget=80GiB --peak_sp=70GiB", "eval",
                "--budget needs --peak_sp and --peak_tp: the memory gate compares each mode's "
                "predicted peak with it, and a missing one (--peak_tp) would read 0 and always "
                "fit"},
        BadCase{"eval --lengths=1 --peak_tp=79GiB", "eval",
                "--peak_tp needs --budget: without a budget the memory gate is off and the peaks "
                "would be ignored (--budget=0 turns the gate off explicitly)"},
        // --budget=0 turns the gate off too: a peak with it would be as silently ignored.
        BadCase{"eval --lengths=8192,8192 --budget=0 --peak_tp=5", "eval",
                "--peak_tp with --budget=0: the memory gate is off and the peaks would be "
                "ignored (give a budget, or leave the peaks out)"},
        BadCase{"eval --lengths=1 --budget=0GiB --peak_sp=1 --peak_tp=1", "eval",
                "--peak_sp with --budget=0: the memory gate is off and the peaks would be "
                "ignored (give a budget, or leave the peaks out)"},
        BadCase{"jobs list --timeout=0s", "jobs list", "--timeout: \"0s\" is not positive"},
        BadCase{"jobs list --timeout=5", "jobs list",
                "--timeout: \"5\" is not a duration (e.g. 30s, 10m, 1h30m, 2d)"},
        BadCase{"jobs list --admin=", "jobs list",
                "--admin: empty value (leave the flag out instead)"},
        BadCase{"gates set --job_id= --max_length_cv=0.2", "gates set",
                "--job_id: empty value (leave the flag out instead)"},
        BadCase{"jobs list --tls_cert=/c.pem", "jobs list",
                "--tls_cert and --tls_key go together (a client certificate needs its key; "
                "SPGATE_TLS_CERT and SPGATE_TLS_KEY count as the flags)"}));

// -o is --output, in each of kubectl's spellings.
TEST(ParseCommandLine, OutputShortFlag) {
  struct Case {
    std::string line;
    OutputFormat format;
  };
  for (const Case& c : {Case{"jobs list", OutputFormat::kTable}, Case{"-o json jobs list", OutputFormat::kJson},
                        Case{"jobs list -o yaml", OutputFormat::kYaml}, Case{"jobs list -o=yaml", OutputFormat::kYaml},
                        Case{"jobs list -ojson", OutputFormat::kJson},
                        Case{"jobs list --output yaml", OutputFormat::kYaml},
                        Case{"-o table jobs list", OutputFormat::kTable}}) {
    Invocation inv;
    ASSERT_THAT(ParseCommandLine(Args(c.line), &inv), IsOk()) << c.line;
    EXPECT_EQ(inv.global.output, c.format) << c.line;
    EXPECT_EQ(inv.command, Command::kJobsList) << c.line;
  }
}

// Flags > environment > defaults, for every variable; an empty variable is unset, a bad
// one is a usage error naming it, and without a lookup nothing is read.
TEST(ParseCommandLine, EnvironmentPrecedence) {
  const std::map<std::string, std::string> env = {
      {"SPGATE_ADMIN", "env-host:1"},      {"SPGATE_TOKEN_FILE", "/env/token"},
      {"SPGATE_TLS_CA", "/env/ca.pem"},    {"SPGATE_TLS_CERT", "/env/c.pem"},
      {"SPGATE_TLS_KEY", "/env/k.pem"},    {"SPGATE_TLS_SERVER_NAME", "env-name"},
      {"SPGATE_TIMEOUT", "7s"},            {"SPGATE_OUTPUT", "json"}};
  auto lookup = [&env](absl::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  Invocation inv;
  ASSERT_THAT(ParseCommandLine(Args("jobs list"), lookup, &inv), IsOk());
  EXPECT_EQ(inv.global.admin, "env-host:1");
  EXPECT_EQ(inv.global.token_file, "/env/token");
  EXPECT_EQ(inv.global.tls_ca, "/env/ca.pem");
  EXPECT_EQ(inv.global.tls_cert, "/env/c.pem");
  EXPECT_EQ(inv.global.tls_key, "/env/k.pem");
  EXPECT_EQ(inv.global.tls_server_name, "env-name");
  EXPECT_EQ(inv.global.timeout, absl::Seconds(7));
  EXPECT_EQ(inv.global.output, OutputFormat::kTable) << "the output format is not read from the environment";

  ASSERT_THAT(ParseCommandLine(Args("--admin=flag-host:2 jobs list --timeout=1s --tls_ca=/f/ca.pem"), lookup, &inv),
              IsOk());
  EXPECT_EQ(inv.global.admin, "flag-host:2");
  EXPECT_EQ(inv.global.timeout, absl::Seconds(1));
  EXPECT_EQ(inv.global.tls_ca, "/f/ca.pem");
  EXPECT_EQ(inv.global.token_file, "/env/token");  // no flag: still the variable

  ASSERT_THAT(ParseCommandLine(Args("jobs list"), &inv), IsOk());
  EXPECT_EQ(inv.global.admin, "127.0.0.1:50062") << "no lookup, no environment";

  auto only = [](std::string name, std::string value) {
    return [name, value](absl::string_view n) -> std::optional<std::string> {
      if (n == name) return value;
      return std::nullopt;
    };
  };
  ASSERT_THAT(ParseCommandLine(Args("jobs list"), only("SPGATE_ADMIN", ""), &inv), IsOk());
  EXPECT_EQ(inv.global.admin, "127.0.0.1:50062") << "an empty variable is unset";
  EXPECT_THAT(ParseCommandLine(Args("jobs list"), only("SPGATE_TIMEOUT", "soon"), &inv),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "environment variable SPGATE_TIMEOUT: --timeout: \"soon\" is not a duration "
                       "(e.g. 30s, 10m, 1h30m, 2d)"));
  EXPECT_THAT(ParseCommandLine(Args("jobs list"), only("SPGATE_TLS_CERT", "/c.pem"), &inv),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SPGATE_TLS_KEY")));
}

TEST(ParseCommandLine, VersionPrintsTheProjectVersion) {
  for (const std::string line : {"--version", "jobs list --version"}) {
    Invocation inv;
    ASSERT_THAT(ParseCommandLine(Args(line), &inv), IsOk()) << line;
    EXPECT_EQ(inv.command, Command::kVersion);
    EXPECT_EQ(inv.help, absl::StrCat("spgatectl ", std::string(kVersion), "\n"));
  }
}

// The scripts come from the command table: every command word, subcommand and flag is in
// them, and the zsh one is the bash one behind bashcompinit.
TEST(ParseCommandLine, CompletionCoversTheCommandTable) {
  for (const std::string shell : {"bash", "zsh"}) {
    Invocation inv;
    ASSERT_THAT(ParseCommandLine({"completion", shell}, &inv), IsOk());
    EXPECT_EQ(inv.command, Command::kCompletion);
    const std::string& script = inv.help;
    EXPECT_THAT(script, HasSubstr("complete -F _spgatectl spgatectl"));
    if (shell == "zsh") {
      EXPECT_THAT(script, HasSubstr("bashcompinit"));
    }
    for (const CommandSpec& c : Commands()) {
      EXPECT_THAT(script, HasSubstr(absl::StrCat("\"", c.name, "\"|")));
      for (const FlagSpec& f : c.flags) {
        EXPECT_THAT(script, HasSubstr(absl::StrCat("--", f.name, f.value.empty() ? " " : "= ")));
      }
    }
    for (absl::string_view w : TopLevelWords()) EXPECT_THAT(script, HasSubstr(w));
    for (const FlagSpec& f : GlobalFlags()) EXPECT_THAT(script, HasSubstr(absl::StrCat("--", f.name)));
    EXPECT_THAT(script, HasSubstr("--max_length_cv="));  // a GateConfig field
  }
}

}  // namespace
}  // namespace spgate::ctl
