// spgatectl's command table and argument parser; see commands.h.
#include "tools/spgatectl/commands.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "policy/gate_config.h"
#include "tools/spgatectl/flag_values.h"

namespace spgate::ctl {
namespace {

using google::protobuf::FieldDescriptor;

// Flags that are true when given bare ("--force"); "--force=false" is accepted too.
constexpr absl::string_view kBareFlags[] = {"force"};

struct FlagSpec {
  absl::string_view name;
  absl::string_view value;  // placeholder in help: "J", "DURATION"
  absl::string_view help;
};

struct CommandSpec {
  Command command;
  absl::string_view name;     // "gates set"
  absl::string_view usage;    // arguments after the name
  absl::string_view summary;  // one line, for the command list
  std::vector<FlagSpec> flags;
  bool gate_flags = false;   // one flag per GateConfig field
  absl::string_view details;  // paragraph printed by --help
};

constexpr FlagSpec kGlobalFlags[] = {
    {"admin", "ADDR", "admin API address (default 127.0.0.1:50062)"},
    {"token_file", "FILE", "send the token in FILE as 'authorization: Bearer <token>'"},
    {"tls_ca", "FILE", "PEM roots that sign the daemon's certificate; turns TLS on"},
    {"tls_cert", "FILE", "PEM client certificate for mTLS (needs --tls_key); turns TLS on"},
    {"tls_key", "FILE", "PEM private key of --tls_cert"},
    {"tls_server_name", "NAME", "name to check in the daemon's certificate (default: host of --admin)"},
    {"timeout", "DURATION", "deadline of every call (default 5s; watch: time to connect)"},
    {"output", "table|json", "table (default) or json (proto field names; one object per line for watch)"},
};

// A GateConfig field's --help line, from the one field table (the server is the judge
// of ranges; the text only tells the user what it will accept).
std::string GateFieldHelp(absl::string_view field) {
  const GateField* f = FindGateField(std::string_view(field.data(), field.size()));
  if (f == nullptr) return "GateConfig field";
  return absl::StrCat(std::string(f->help), " ", std::string(GateFieldRangeText(f->range)));
}

const std::vector<CommandSpec>& Commands() {
  static const auto* kCommands = new std::vector<CommandSpec>{
      {Command::kGatesGet, "gates get", "[--job_id=J]",
       "show the gate config (global default, or one job's effective config)",
       {{"job_id", "J", "the job's effective config and its overrides (default: global)"}},
       false,
       "SOURCE is 'override' for a value set at this scope through the API and\n"
       "'inherited' for one that comes from the scope below (the global config for a\n"
       "job; the --config file or the built-in defaults for the global scope)."},
      {Command::kGatesSet, "gates set",
       "[--job_id=J] [--FIELD=VALUE ...] [--clear=FIELD,...] [--expected_version=N]",
       "change gate thresholds, globally or for one job",
       {{"job_id", "J", "override for this job only (default: the global config)"},
        {"clear", "FIELD,...", "remove these overrides: the value is inherited again"},
        {"expected_version", "N", "refuse (ABORTED) unless the scope is still at version N"}},
       true,
       "Only the fields given are sent, as the update mask; the others keep their\n"
       "values. The server checks the ranges and names the field it refuses.\n"
       "Example: spgatectl gates set --job_id=llama-70b --max_length_cv=0.25 --clear=window_steps"},
      {Command::kGatesHistory, "gates history", "[--job_id=J] [--limit=N] [--page_token=T]",
       "the audit log of operator changes, newest first",
       {{"job_id", "J", "only this job's entries (default: every scope)"},
        {"limit", "N", "at most N entries (default 50, at most 500)"},
        {"page_token", "T", "continue where the previous page ended"}},
       false,
       "Every config change, rollback, pin and unpin, with who made it (the credential's\n"
       "name or the client certificate's identity), the fields changed and the new version.\n"
       "Needs spgated --state_dir (the log is <state_dir>/audit.log)."},
      {Command::kGatesRollback, "gates rollback", "[--job_id=J] --to_version=N [--expected_version=N]",
       "restore a scope's overrides as they were right after version N",
       {{"job_id", "J", "roll back this job's overrides (default: the global ones)"},
        {"to_version", "N", "a version from 'gates history' of the same scope"},
        {"expected_version", "N", "refuse (ABORTED) unless the scope is still at version N"}},
       false,
       "The rollback is itself a new version and is audited. A version of another scope is\n"
       "INVALID_ARGUMENT; one the audit log does not hold is NOT_FOUND. Needs the admin role."},
      {Command::kJobsList, "jobs list", "", "list the jobs the daemon knows", {}, false, ""},
      {Command::kJobsShow, "jobs show", "JOB",
       "one job: groups, per-mode comparison, decision counts, pins", {}, false,
       "The per-mode table compares the modes over the rolling window, relative to\n"
       "TP-only (the table of docs/design.md §1 computed from live observations)."},
      {Command::kJobsForget, "jobs forget", "JOB [--operator_settings=true]",
       "drop a job's live state (and, with the flag, its overrides and pins)",
       {{"operator_settings", "true|false",
         "also drop the job's config overrides and pins (default false)"}},
       false,
       "The job's groups, decision caches, rolling windows and worker sessions go; its\n"
       "workers' next calls get NOT_FOUND and they register again. Audited; needs the\n"
       "admin role. NOT_FOUND when the daemon holds nothing for the job."},
      {Command::kPin, "pin", "JOB [--group=G] --mode=sp|tp --for=DURATION [--force]",
       "force a mode for a job or one of its groups, for a while",
       {{"group", "G", "pin only this TP group (default: the whole job)"},
        {"mode", "sp|tp", "the mode to force"},
        {"for", "DURATION", "how long the pin lasts (e.g. 30s, 10m, 2h, 1d)"},
        {"force", "", "with --mode=tp: TP-only even where it would not fit the memory budget"}},
       false,
       "A TP-only pin yields to the memory gate: a batch that would not fit TP-only runs SP\n"
       "(docs/design.md §3). --force takes that safety away for this pin; the audit log and\n"
       "'gates history' record that it was forced. An SP pin cannot be forced."},
      {Command::kUnpin, "unpin", "JOB [--group=G]", "remove pins",
       {{"group", "G", "remove only this group's pin (default: every pin of the job)"}}, false,
       ""},
      {Command::kWatch, "watch", "[JOB] [--count=N]",
       "print decisions as they are made, one line each",
       {{"job_id", "J", "same as the JOB argument"},
        {"count", "N", "stop after N decisions (default: until Ctrl-C or SIGTERM)"}},
       false,
       "Ctrl-C or SIGTERM ends the stream cleanly (exit 0; a second Ctrl-C exits at once).\n"
       "With --output=json every decision is one JSON object on its own line."},
      {Command::kEval, "eval",
       "--lengths=L1,L2,... [--rs_wait_share=S] [--job_id=J] [--group=G]\n"
       "                      [--budget=BYTES --peak_sp=BYTES --peak_tp=BYTES] [--FIELD=VALUE ...]",
       "what-if: the decision and reason chain for a hypothetical batch",
       {{"lengths", "L1,L2,...", "sequence lengths of the batch, in tokens"},
        {"rs_wait_share", "S", "hypothetical rolling reduce-scatter wait share"},
        {"job_id", "J", "use the job's config (default: the global config)"},
        {"group", "G", "evaluate against this group's live state (pins, fallback)"},
        {"budget", "BYTES", "device memory budget (e.g. 80GiB); 0 skips the memory gate"},
        {"peak_sp", "BYTES", "predicted peak memory under SP"},
        {"peak_tp", "BYTES", "predicted peak memory under TP-only"}},
       true,
       "Nothing changes on the daemon. GateConfig flags are layered over the live config\n"
       "for this evaluation only.\n"
       "Example: spgatectl eval --lengths=512,4096,16384 --rs_wait_share=0.3 --max_length_cv=1"},
  };
  return *kCommands;
}

const CommandSpec* FindCommand(absl::string_view name) {
  for (const CommandSpec& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::vector<absl::string_view> Subcommands(absl::string_view group) {
  std::vector<absl::string_view> out;
  for (const CommandSpec& c : Commands()) {
    if (absl::StartsWith(c.name, absl::StrCat(group, " "))) out.push_back(c.name.substr(group.size() + 1));
  }
  return out;
}

std::vector<const FieldDescriptor*> GateFields() {
  std::vector<const FieldDescriptor*> out;
  const auto* desc = v1::GateConfig::descriptor();
  for (int i = 0; i < desc->field_count(); ++i) out.push_back(desc->field(i));
  return out;
}

void AppendFlagLines(std::string* out, const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [flag, help] : lines) width = std::max(width, flag.size());
  for (const auto& [flag, help] : lines) {
    absl::StrAppend(out, "  ", flag, std::string(width - flag.size() + 2, ' '), help, "\n");
  }
}

std::string GlobalFlagsHelp() {
  std::vector<std::pair<std::string, std::string>> lines;
  for (const FlagSpec& f : kGlobalFlags) {
    lines.emplace_back(absl::StrCat("--", f.name, "=", f.value), std::string(f.help));
  }
  std::string out = "Global flags (any command):\n";
  AppendFlagLines(&out, lines);
  return out;
}

std::string CommandHelp(const CommandSpec& c) {
  std::string summary(c.summary);
  summary[0] = absl::ascii_toupper(summary[0]);
  std::string out = absl::StrCat("Usage: spgatectl ", c.name, c.usage.empty() ? "" : " ",
                                 c.usage, "\n\n", summary, ".\n");
  if (!c.details.empty()) absl::StrAppend(&out, "\n", c.details, "\n");
  std::vector<std::pair<std::string, std::string>> lines;
  for (const FlagSpec& f : c.flags) {
    lines.emplace_back(f.value.empty() ? absl::StrCat("--", f.name) : absl::StrCat("--", f.name, "=", f.value),
                       std::string(f.help));
  }
  if (c.gate_flags) {
    for (const FieldDescriptor* f : GateFields()) {
      const char* value = f->cpp_type() == FieldDescriptor::CPPTYPE_INT64  ? "N"
                          : f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM ? "POLICY"
                                                                           : "X";
      lines.emplace_back(absl::StrCat("--", f->name(), "=", value), GateFieldHelp(f->name()));
    }
  }
  if (!lines.empty()) {
    absl::StrAppend(&out, "\nFlags:\n");
    AppendFlagLines(&out, lines);
  }
  absl::StrAppend(&out, "\n", GlobalFlagsHelp());
  return out;
}

std::string GroupHelp(absl::string_view group) {
  std::string out = absl::StrCat("Usage: spgatectl ", group, " <", absl::StrJoin(Subcommands(group), "|"),
                                 "> [flags]\n\n");
  std::vector<std::pair<std::string, std::string>> lines;
  for (const CommandSpec& c : Commands()) {
    if (absl::StartsWith(c.name, absl::StrCat(group, " "))) {
      lines.emplace_back(std::string(c.name), std::string(c.summary));
    }
  }
  AppendFlagLines(&out, lines);
  absl::StrAppend(&out, "\nRun 'spgatectl ", group, " <subcommand> --help' for its flags.\n");
  return out;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// One flag as written on the command line.
struct RawFlag {
  std::string name;
  std::string value;
};

struct Tokens {
  std::vector<RawFlag> flags;
  std::vector<std::string> positionals;
  bool help = false;
  std::string error;  // first tokenizing error; reported once the command is known
};

Tokens Tokenize(const std::vector<std::string>& args) {
  Tokens t;
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_positionals || a.size() < 2 || a[0] != '-') {
      t.positionals.push_back(a);
      continue;
    }
    if (a == "--") {
      only_positionals = true;
      continue;
    }
    absl::string_view body(a);
    body.remove_prefix(absl::StartsWith(body, "--") ? 2 : 1);
    const size_t eq = body.find('=');
    RawFlag flag{std::string(body.substr(0, eq)), ""};
    if (flag.name == "help" || flag.name == "h") {
      t.help = true;
      continue;
    }
    if (eq != absl::string_view::npos) {
      flag.value = std::string(body.substr(eq + 1));
    } else if (std::find(std::begin(kBareFlags), std::end(kBareFlags), flag.name) !=
               std::end(kBareFlags)) {
      flag.value = "true";  // never takes the next argument: "pin --force JOB" keeps JOB
    } else if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
      flag.value = args[++i];  // "--flag value"
    } else if (t.error.empty()) {
      t.error = absl::StrCat("--", flag.name, ": missing value (write --", flag.name, "=VALUE)");
    }
    t.flags.push_back(std::move(flag));
  }
  return t;
}

absl::Status Usage(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// Sets the GateConfig field `field` of `config` from the flag's text.
absl::Status SetGateField(const FieldDescriptor* field, absl::string_view value,
                          v1::GateConfig* config) {
  const auto* refl = v1::GateConfig::GetReflection();
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {  // --policy=adaptive
    absl::StatusOr<GatePolicyKind> kind =
        ParseGatePolicy(absl::StrCat("--", field->name()), std::string_view(value.data(), value.size()));
    if (!kind.ok()) return kind.status();
    refl->SetEnumValue(config, field, static_cast<int>(*kind));
  } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
    absl::StatusOr<double> v = ParseDoubleFlag(field->name(), value);
    if (!v.ok()) return v.status();
    refl->SetDouble(config, field, *v);
  } else {
    absl::StatusOr<int64_t> v = ParseInt64Flag(field->name(), value);
    if (!v.ok()) return v.status();
    refl->SetInt64(config, field, *v);
  }
  return absl::OkStatus();
}

absl::Status ApplyGlobalFlag(const RawFlag& f, GlobalOptions* g) {
  if (f.name == "admin") {
    g->admin = f.value;
  } else if (f.name == "token_file") {
    g->token_file = f.value;
  } else if (f.name == "tls_ca") {
    g->tls_ca = f.value;
  } else if (f.name == "tls_cert") {
    g->tls_cert = f.value;
  } else if (f.name == "tls_key") {
    g->tls_key = f.value;
  } else if (f.name == "tls_server_name") {
    g->tls_server_name = f.value;
  } else if (f.name == "timeout") {
    absl::StatusOr<absl::Duration> d = ParseDurationFlag(f.name, f.value);
    if (!d.ok()) return d.status();
    if (*d <= absl::ZeroDuration()) return Usage(absl::StrCat("--timeout: \"", f.value, "\" is not positive"));
    g->timeout = *d;
  } else if (f.name == "output") {
    if (f.value == "table") {
      g->output = OutputFormat::kTable;
    } else if (f.value == "json") {
      g->output = OutputFormat::kJson;
    } else {
      return Usage(absl::StrCat("--output: \"", f.value, "\" is not a format (want table or json)"));
    }
  }
  return absl::OkStatus();
}

bool IsGlobalFlag(absl::string_view name) {
  return std::any_of(std::begin(kGlobalFlags), std::end(kGlobalFlags),
                     [&](const FlagSpec& f) { return f.name == name; });
}

// The flags of one command after the global ones are applied, by name.
class CommandFlags {
 public:
  explicit CommandFlags(std::vector<RawFlag> flags) : flags_(std::move(flags)) {}

  std::optional<std::string> Get(absl::string_view name) const {
    for (const RawFlag& f : flags_) {
      if (f.name == name) return f.value;
    }
    return std::nullopt;
  }
  const std::vector<RawFlag>& all() const { return flags_; }

 private:
  std::vector<RawFlag> flags_;
};

absl::Status CheckPositionals(const std::vector<std::string>& args, size_t min, size_t max,
                              absl::string_view what) {
  if (args.size() < min) return Usage(absl::StrCat("missing ", what, " argument"));
  if (args.size() > max) return Usage(absl::StrCat("unexpected argument \"", args[max], "\""));
  for (const std::string& a : args) {
    if (a.empty()) return Usage(absl::StrCat(what, " must not be empty"));
  }
  return absl::OkStatus();
}

// Applies --FIELD=VALUE flags to `config`; returns the fields set, in flag order.
absl::StatusOr<std::vector<std::string>> ApplyGateFlags(const CommandFlags& flags,
                                                        v1::GateConfig* config) {
  std::vector<std::string> set;
  for (const RawFlag& f : flags.all()) {
    const FieldDescriptor* field = v1::GateConfig::descriptor()->FindFieldByName(f.name);
    if (field == nullptr) continue;
    if (absl::Status s = SetGateField(field, f.value, config); !s.ok()) return s;
    set.push_back(f.name);
  }
  return set;
}

absl::Status BuildGatesSet(const CommandFlags& flags, v1::UpdateGateConfigRequest* req) {
  if (auto job = flags.Get("job_id")) req->set_job_id(*job);
  if (auto v = flags.Get("expected_version")) {
    absl::StatusOr<int64_t> n = ParseInt64Flag("expected_version", *v);
    if (!n.ok()) return n.status();
    req->set_expected_version(*n);
  }
  v1::GateConfig values;
  absl::StatusOr<std::vector<std::string>> set = ApplyGateFlags(flags, &values);
  if (!set.ok()) return set.status();
  if (!set->empty()) *req->mutable_config() = std::move(values);
  for (const std::string& path : *set) req->mutable_update_mask()->add_paths(path);
  if (auto clear = flags.Get("clear")) {
    absl::StatusOr<std::vector<std::string>> fields = ParseGateFieldListFlag("clear", *clear);
    if (!fields.ok()) return fields.status();
    for (const std::string& field : *fields) {
      if (std::find(set->begin(), set->end(), field) != set->end()) {
        return Usage(absl::StrCat("--clear: ", field, " is also given as --", field,
                                  "=...; set it or clear it, not both"));
      }
      const auto& paths = req->update_mask().paths();
      if (std::find(paths.begin(), paths.end(), field) == paths.end()) {
        req->mutable_update_mask()->add_paths(field);
      }
    }
  }
  if (req->update_mask().paths_size() == 0) {
    return Usage("nothing to change: give --FIELD=VALUE (e.g. --max_length_cv=0.2) or --clear=FIELD");
  }
  return absl::OkStatus();
}

absl::Status BuildPin(const std::vector<std::string>& args, const CommandFlags& flags,
                      v1::PinModeRequest* req) {
  if (absl::Status s = CheckPositionals(args, 1, 1, "JOB"); !s.ok()) return s;
  req->set_job_id(args[0]);
  if (auto g = flags.Get("group")) {
    absl::StatusOr<int32_t> group = ParseInt32Flag("group", *g);
    if (!group.ok()) return group.status();
    req->set_group(*group);
  }
  auto mode = flags.Get("mode");
  if (!mode) return Usage("--mode is required (sp or tp)");
  absl::StatusOr<v1::Mode> m = ParseModeFlag("mode", *mode);
  if (!m.ok()) return m.status();
  req->set_mode(*m);
  if (auto force = flags.Get("force")) {
    if (*force == "true" || *force == "1") {
      if (*m != v1::TENSOR_PARALLEL_ONLY) {
        return Usage("--force applies only to --mode=tp (it lets a TP-only pin override the "
                     "memory gate); an SP pin always fits");
      }
      req->set_force(true);
    } else if (*force != "false" && *force != "0") {
      return Usage(absl::StrCat("--force: \"", *force, "\" is not true or false"));
    }
  }
  auto duration = flags.Get("for");
  if (!duration) return Usage("--for is required (how long the pin lasts, e.g. --for=10m)");
  absl::StatusOr<absl::Duration> d = ParseDurationFlag("for", *duration);
  if (!d.ok()) return d.status();
  absl::Duration rem;
  const int64_t seconds = absl::IDivDuration(*d, absl::Seconds(1), &rem);
  req->mutable_duration()->set_seconds(seconds);
  req->mutable_duration()->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(rem)));
  return absl::OkStatus();
}

absl::Status BuildEval(const CommandFlags& flags, v1::EvaluateGatesRequest* req) {
  auto lengths = flags.Get("lengths");
  if (!lengths) return Usage("--lengths is required (e.g. --lengths=512,4096,16384)");
  absl::StatusOr<std::vector<int64_t>> l = ParseInt64ListFlag("lengths", *lengths);
  if (!l.ok()) return l.status();
  for (int64_t v : *l) req->add_lengths(v);
  if (auto job = flags.Get("job_id")) req->set_job_id(*job);
  if (auto s = flags.Get("rs_wait_share")) {
    absl::StatusOr<double> v = ParseDoubleFlag("rs_wait_share", *s);
    if (!v.ok()) return v.status();
    req->set_rs_wait_share(*v);
  }
  if (auto g = flags.Get("group")) {
    absl::StatusOr<int32_t> v = ParseInt32Flag("group", *g);
    if (!v.ok()) return v.status();
    req->set_group(*v);
  }
  struct BytesFlag {
    absl::string_view name;
    void (v1::EvaluateGatesRequest::*set)(uint64_t);
  };
  const BytesFlag kBytes[] = {
      {"budget", &v1::EvaluateGatesRequest::set_memory_budget_bytes},
      {"peak_sp", &v1::EvaluateGatesRequest::set_predicted_peak_bytes_sp},
      {"peak_tp", &v1::EvaluateGatesRequest::set_predicted_peak_bytes_tp},
  };
  for (const BytesFlag& b : kBytes) {
    if (auto v = flags.Get(b.name)) {
      absl::StatusOr<uint64_t> bytes = ParseBytesFlag(b.name, *v);
      if (!bytes.ok()) return bytes.status();
      (req->*b.set)(*bytes);
    }
  }
  v1::GateConfig layer;
  absl::StatusOr<std::vector<std::string>> set = ApplyGateFlags(flags, &layer);
  if (!set.ok()) return set.status();
  if (!set->empty()) *req->mutable_config() = std::move(layer);
  return absl::OkStatus();
}

absl::Status BuildRequest(const CommandSpec& spec, const std::vector<std::string>& args,
                          const CommandFlags& flags, Invocation* out) {
  switch (spec.command) {
    case Command::kGatesGet:
      if (absl::Status s = CheckPositionals(args, 0, 0, ""); !s.ok()) return s;
      if (auto job = flags.Get("job_id")) out->gates_get.set_job_id(*job);
      return absl::OkStatus();
    case Command::kGatesSet:
      if (absl::Status s = CheckPositionals(args, 0, 0, ""); !s.ok()) return s;
      return BuildGatesSet(flags, &out->gates_set);
    case Command::kGatesHistory:
      if (absl::Status s = CheckPositionals(args, 0, 0, ""); !s.ok()) return s;
      if (auto job = flags.Get("job_id")) out->gates_history.set_job_id(*job);
      if (auto t = flags.Get("page_token")) out->gates_history.set_page_token(*t);
      if (auto l = flags.Get("limit")) {
        absl::StatusOr<int32_t> n = ParseInt32Flag("limit", *l);
        if (!n.ok()) return n.status();
        if (*n < 1) return Usage(absl::StrCat("--limit: \"", *l, "\" is not at least 1"));
        out->gates_history.set_page_size(*n);
      }
      return absl::OkStatus();
    case Command::kGatesRollback: {
      if (absl::Status s = CheckPositionals(args, 0, 0, ""); !s.ok()) return s;
      v1::RollbackGateConfigRequest& req = out->gates_rollback;
      if (auto job = flags.Get("job_id")) req.set_job_id(*job);
      auto to = flags.Get("to_version");
      if (!to) return Usage("--to_version is required (a version from 'spgatectl gates history')");
      absl::StatusOr<int64_t> n = ParseInt64Flag("to_version", *to);
      if (!n.ok()) return n.status();
      if (*n < 1) return Usage(absl::StrCat("--to_version: \"", *to, "\" is not at least 1"));
      req.set_to_version(*n);
      if (auto v = flags.Get("expected_version")) {
        absl::StatusOr<int64_t> e = ParseInt64Flag("expected_version", *v);
        if (!e.ok()) return e.status();
        req.set_expected_version(*e);
      }
      return absl::OkStatus();
    }
    case Command::kJobsList:
      return CheckPositionals(args, 0, 0, "");
    case Command::kJobsShow:
      if (absl::Status s = CheckPositionals(args, 1, 1, "JOB"); !s.ok()) return s;
      out->jobs_show.set_job_id(args[0]);
      return absl::OkStatus();
    case Command::kJobsForget:
      if (absl::Status s = CheckPositionals(args, 1, 1, "JOB"); !s.ok()) return s;
      out->jobs_forget.set_job_id(args[0]);
      if (auto v = flags.Get("operator_settings")) {
        if (*v == "true" || *v == "1") {
          out->jobs_forget.set_forget_operator_settings(true);
        } else if (*v != "false" && *v != "0") {
          return Usage(absl::StrCat("--operator_settings: \"", *v, "\" is not true or false"));
        }
      }
      return absl::OkStatus();
    case Command::kPin:
      return BuildPin(args, flags, &out->pin);
    case Command::kUnpin:
      if (absl::Status s = CheckPositionals(args, 1, 1, "JOB"); !s.ok()) return s;
      out->unpin.set_job_id(args[0]);
      if (auto g = flags.Get("group")) {
        absl::StatusOr<int32_t> group = ParseInt32Flag("group", *g);
        if (!group.ok()) return group.status();
        out->unpin.set_group(*group);
      }
      return absl::OkStatus();
    case Command::kWatch: {
      if (absl::Status s = CheckPositionals(args, 0, 1, "JOB"); !s.ok()) return s;
      auto job = flags.Get("job_id");
      if (job && !args.empty() && *job != args[0]) {
        return Usage(absl::StrCat("--job_id=", *job, " and the JOB argument \"", args[0],
                                  "\" disagree"));
      }
      if (!args.empty()) out->watch.set_job_id(args[0]);
      if (job) out->watch.set_job_id(*job);
      if (auto c = flags.Get("count")) {
        absl::StatusOr<int64_t> n = ParseInt64Flag("count", *c);
        if (!n.ok()) return n.status();
        if (*n < 1) return Usage(absl::StrCat("--count: \"", *c, "\" is not at least 1"));
        out->watch_count = *n;
      }
      return absl::OkStatus();
    }
    case Command::kEval:
      if (absl::Status s = CheckPositionals(args, 0, 0, ""); !s.ok()) return s;
      return BuildEval(flags, &out->eval);
    case Command::kHelp:
      break;
  }
  return absl::OkStatus();
}

}  // namespace

std::string MainHelp() {
  std::string out =
      "spgatectl: operator CLI of spgated, the sequence-parallel gate daemon.\n\n"
      "Usage: spgatectl <command> [arguments] [flags]\n\nCommands:\n";
  std::vector<std::pair<std::string, std::string>> lines;
  for (const CommandSpec& c : Commands()) {
    lines.emplace_back(std::string(c.name), std::string(c.summary));
  }
  AppendFlagLines(&out, lines);
  absl::StrAppend(&out, "\n", GlobalFlagsHelp(),
                  "\nRun 'spgatectl <command> --help' for a command's flags.\n"
                  "Exit status: 0 ok, 1 the daemon refused or could not be reached, 2 usage error.\n");
  return out;
}

absl::Status ParseCommandLine(const std::vector<std::string>& args, Invocation* out) {
  *out = Invocation();
  Tokens t = Tokenize(args);

  // Find the command: "gates get", "jobs show", "pin", ... or "help [topic]".
  const std::vector<std::string>& pos = t.positionals;
  if (pos.empty()) {
    if (t.help) {
      out->help = MainHelp();
      return absl::OkStatus();
    }
    return Usage("missing command (one of gates, jobs, pin, unpin, watch, eval; see --help)");
  }
  if (pos[0] == "help") {
    const std::string topic = absl::StrJoin(pos.begin() + 1, pos.end(), " ");
    if (topic.empty()) {
      out->help = MainHelp();
    } else if (const CommandSpec* c = FindCommand(topic)) {
      out->help = CommandHelp(*c);
    } else if (!Subcommands(topic).empty()) {
      out->help = GroupHelp(topic);
    } else {
      return Usage(absl::StrCat("help: unknown command \"", topic, "\""));
    }
    return absl::OkStatus();
  }
  const CommandSpec* spec = nullptr;
  size_t consumed = 1;
  if (const std::vector<absl::string_view> subs = Subcommands(pos[0]); !subs.empty()) {
    out->name = pos[0];
    if (pos.size() < 2) {
      if (t.help) {
        out->help = GroupHelp(pos[0]);
        return absl::OkStatus();
      }
      return Usage(absl::StrCat("missing subcommand (one of ", absl::StrJoin(subs, ", "), ")"));
    }
    spec = FindCommand(absl::StrCat(pos[0], " ", pos[1]));
    if (spec == nullptr) {
      return Usage(absl::StrCat("unknown subcommand \"", pos[1], "\" (one of ",
                                absl::StrJoin(subs, ", "), ")"));
    }
    consumed = 2;
  } else {
    spec = FindCommand(pos[0]);
    if (spec == nullptr) {
      return Usage(absl::StrCat("unknown command \"", pos[0],
                                "\" (one of gates, jobs, pin, unpin, watch, eval)"));
    }
  }
  out->name = std::string(spec->name);
  if (t.help) {
    out->help = CommandHelp(*spec);
    return absl::OkStatus();
  }
  if (!t.error.empty()) return Usage(t.error);

  // Every flag must belong to this command or be global; each at most once.
  std::vector<absl::string_view> known;
  for (const FlagSpec& f : kGlobalFlags) known.push_back(f.name);
  for (const FlagSpec& f : spec->flags) known.push_back(f.name);
  if (spec->gate_flags) {
    for (const FieldDescriptor* f : GateFields()) known.push_back(f->name());
  }
  std::vector<RawFlag> command_flags;
  for (size_t i = 0; i < t.flags.size(); ++i) {
    const RawFlag& f = t.flags[i];
    if (std::find(known.begin(), known.end(), f.name) == known.end()) {
      if (spec->command == Command::kUnpin && f.name == "force") {
        return Usage("--force belongs to 'pin --mode=tp'; unpin removes pins and has no --force");
      }
      std::string message = absl::StrCat("unknown flag --", f.name);
      absl::string_view best;
      size_t best_distance = 3;
      for (absl::string_view k : known) {
        const size_t d = EditDistance(f.name, k);
        if (d < best_distance) {
          best_distance = d;
          best = k;
        }
      }
      if (!best.empty()) absl::StrAppend(&message, " (did you mean --", best, "?)");
      return Usage(message);
    }
    for (size_t j = 0; j < i; ++j) {
      if (t.flags[j].name == f.name) return Usage(absl::StrCat("--", f.name, " given twice"));
    }
    // No flag means "empty"; an empty --job_id= would silently address the global config.
    if (f.value.empty()) {
      return Usage(absl::StrCat("--", f.name, ": empty value (leave the flag out instead)"));
    }
    if (IsGlobalFlag(f.name)) {
      if (absl::Status s = ApplyGlobalFlag(f, &out->global); !s.ok()) return s;
    } else {
      command_flags.push_back(f);
    }
  }
  if (!out->global.tls_cert.empty() != !out->global.tls_key.empty()) {
    return Usage("--tls_cert and --tls_key go together (a client certificate needs its key)");
  }

  const std::vector<std::string> rest(pos.begin() + consumed, pos.end());
  if (absl::Status s = BuildRequest(*spec, rest, CommandFlags(std::move(command_flags)), out);
      !s.ok()) {
    return s;
  }
  out->command = spec->command;
  return absl::OkStatus();
}

}  // namespace spgate::ctl
