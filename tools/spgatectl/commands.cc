// spgatectl's argument parser (the command table is command_table.cc); see commands.h.
#include "tools/spgatectl/commands.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "policy/gate_config.h"
#include "common/cli.h"
#include "common/config_history.h"
#include "common/status_macros.h"
#include "common/job_id.h"
#include "tools/spgatectl/command_table.h"
#include "tools/spgatectl/flag_values.h"

namespace spgate::ctl {
namespace {

using google::protobuf::FieldDescriptor;

// A flag the command table declares without a value ("--force", "--operator_settings"):
// a boolean, true when given bare; "=true" / "=false" are accepted too (ParseBoolFlag).
bool IsBareFlag(absl::string_view name) {
  for (const CommandSpec& c : Commands()) {
    for (const FlagSpec& f : c.flags) {
      if (f.name == name && f.value.empty()) return true;
    }
  }
  return false;
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
  bool version = false;
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
    const bool single_dash = !absl::StartsWith(body, "--");
    body.remove_prefix(single_dash ? 1 : 2);
    const size_t eq = body.find('=');
    RawFlag flag{std::string(body.substr(0, eq)), ""};
    if (flag.name == "help" || flag.name == "h") {
      t.help = true;
      continue;
    }
    if (flag.name == "version") {
      t.version = true;
      continue;
    }
    // kubectl's -o: "-o json", "-o=json" and "-ojson" are --output.
    if (single_dash && absl::StartsWith(body, "o")) {
      if (flag.name != "o" && flag.name != "output" && eq == absl::string_view::npos) {
        t.flags.push_back(RawFlag{"output", std::string(body.substr(1))});
        continue;
      }
      if (flag.name == "o") flag.name = "output";
    }
    if (eq != absl::string_view::npos) {
      flag.value = std::string(body.substr(eq + 1));
    } else if (IsBareFlag(flag.name)) {
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
    } else if (f.value == "yaml") {
      g->output = OutputFormat::kYaml;
    } else {
      return Usage(absl::StrCat("--output: \"", f.value, "\" is not a format (want table, json or yaml)",
                                DidYouMean(f.value, {std::begin(kOutputFormats), std::end(kOutputFormats)})));
    }
  }
  return absl::OkStatus();
}

bool IsGlobalFlag(absl::string_view name) {
  return std::any_of(GlobalFlags().begin(), GlobalFlags().end(),
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
    absl::StatusOr<int64_t> n = ParseVersionFlag("expected_version", *v);
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
    absl::StatusOr<bool> on = ParseBoolFlag("force", *force);
    if (!on.ok()) return on.status();
    if (*on && *m != v1::TENSOR_PARALLEL_ONLY) {
      return Usage("--force applies only to --mode=tp (it lets a TP-only pin override the "
                   "memory gate); an SP pin always fits");
    }
    req->set_force(*on);
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
  if (req->memory_budget_bytes() == 0) {
    // No budget, or --budget=0: the memory gate is off, and a peak given would be ignored.
    const bool given = flags.Get("budget").has_value();
    for (absl::string_view peak : {"peak_sp", "peak_tp"}) {
      if (flags.Get(peak)) {
        return Usage(given ? absl::StrCat("--", peak, " with --budget=0: the memory gate is off "
                                          "and the peaks would be ignored (give a budget, or "
                                          "leave the peaks out)")
                           : absl::StrCat("--", peak, " needs --budget: without a budget the "
                                          "memory gate is off and the peaks would be ignored "
                                          "(--budget=0 turns the gate off explicitly)"));
      }
    }
  } else {
    for (absl::string_view peak : {"peak_sp", "peak_tp"}) {
      if (!flags.Get(peak)) {
        return Usage(absl::StrCat("--budget needs --peak_sp and --peak_tp: the memory gate "
                                  "compares each mode's predicted peak with it, and a missing "
                                  "one (--", peak, ") would read 0 and always fit"));
      }
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
        RETURN_IF_ERROR(ValidateHistoryPageSize("--limit", *n));  // the daemon's page rule
        out->gates_history.set_page_size(*n);
      }
      return absl::OkStatus();
    case Command::kGatesRollback: {
      if (absl::Status s = CheckPositionals(args, 0, 0, ""); !s.ok()) return s;
      v1::RollbackGateConfigRequest& req = out->gates_rollback;
      if (auto job = flags.Get("job_id")) req.set_job_id(*job);
      auto to = flags.Get("to_version");
      if (!to) return Usage("--to_version is required (a version from 'spgatectl gates history')");
      absl::StatusOr<int64_t> n = ParseVersionFlag("to_version", *to);
      if (!n.ok()) return n.status();
      req.set_to_version(*n);
      if (auto v = flags.Get("expected_version")) {
        absl::StatusOr<int64_t> e = ParseVersionFlag("expected_version", *v);
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
        absl::StatusOr<bool> on = ParseBoolFlag("operator_settings", *v);
        if (!on.ok()) return on.status();
        out->jobs_forget.set_forget_operator_settings(*on);
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
      if (!out->watch.job_id().empty()) {
        if (absl::Status s = ValidateJobId(out->watch.job_id()); !s.ok()) {
          return Usage(std::string(s.message()));  // the daemon's rule: no stream for it
        }
      }
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
    case Command::kCompletion: {
      if (absl::Status s = CheckPositionals(args, 1, 1, "SHELL"); !s.ok()) return s;
      absl::StatusOr<std::string> script = CompletionScript(args[0]);
      if (!script.ok()) return script.status();
      out->help = *std::move(script);
      return absl::OkStatus();
    }
    case Command::kHelp:
    case Command::kVersion:
      break;
  }
  return absl::OkStatus();
}

}  // namespace


std::optional<std::string> ProcessEnv(absl::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// OK when `flag` is global or the command's own; else the usage error naming it.
absl::Status CheckKnownFlag(const RawFlag& flag, const CommandSpec& spec) {
  std::vector<absl::string_view> known;
  for (const FlagSpec& f : GlobalFlags()) known.push_back(f.name);
  for (const FlagSpec& f : spec.flags) known.push_back(f.name);
  if (spec.gate_flags) {
    for (const FieldDescriptor* f : GateFields()) known.push_back(f->name());
  }
  if (std::find(known.begin(), known.end(), flag.name) != known.end()) return absl::OkStatus();
  if (spec.command == Command::kUnpin && flag.name == "force") {
    return Usage("--force belongs to 'pin --mode=tp'; unpin removes pins and has no --force");
  }
  return Usage(absl::StrCat("unknown flag --", flag.name, DidYouMean(flag.name, known, "--")));
}

// The global flags (the environment first, so that a flag given overrides it) into
// `global`, and the command's own flags into `command_flags`: every flag must belong to
// the command or be global, each at most once, none empty.
absl::Status SortFlags(const std::vector<RawFlag>& flags, const CommandSpec& spec,
                       const EnvLookup& env, GlobalOptions* global,
                       std::vector<RawFlag>* command_flags) {
  // The environment first, so that a flag given overrides it.
  if (env) {
    for (const FlagSpec& f : GlobalFlags()) {
      if (f.env.empty()) continue;
      const std::optional<std::string> value = env(f.env);
      if (!value.has_value() || value->empty()) continue;
      if (absl::Status s = ApplyGlobalFlag(RawFlag{std::string(f.name), *value}, global); !s.ok()) {
        return Usage(absl::StrCat("environment variable ", f.env, ": ", s.message()));
      }
    }
  }

  for (size_t i = 0; i < flags.size(); ++i) {
    const RawFlag& f = flags[i];
    RETURN_IF_ERROR(CheckKnownFlag(f, spec));
    for (size_t j = 0; j < i; ++j) {
      if (flags[j].name == f.name) return Usage(absl::StrCat("--", f.name, " given twice"));
    }
    // No flag means "empty"; an empty --job_id= would silently address the global config.
    if (f.value.empty()) {
      return Usage(absl::StrCat("--", f.name, ": empty value (leave the flag out instead)"));
    }
    if (IsGlobalFlag(f.name)) {
      if (absl::Status s = ApplyGlobalFlag(f, global); !s.ok()) return s;
    } else {
      command_flags->push_back(f);
    }
  }
  if (!global->tls_cert.empty() != !global->tls_key.empty()) {
    return Usage("--tls_cert and --tls_key go together (a client certificate needs its key; "
                 "SPGATE_TLS_CERT and SPGATE_TLS_KEY count as the flags)");
  }
  return absl::OkStatus();
}

absl::Status ParseCommandLine(const std::vector<std::string>& args, Invocation* out) {
  return ParseCommandLine(args, EnvLookup(), out);
}

absl::Status ParseCommandLine(const std::vector<std::string>& args, const EnvLookup& env,
                              Invocation* out) {
  *out = Invocation();
  Tokens t = Tokenize(args);
  if (t.version) {
    out->command = Command::kVersion;
    out->help = VersionLine("spgatectl");
    return absl::OkStatus();
  }

  // Find the command: "gates get", "jobs show", "pin", ... or "help [topic]".
  const std::vector<std::string>& pos = t.positionals;
  const std::vector<absl::string_view> words = TopLevelWords();
  if (pos.empty()) {
    if (t.help) {
      out->help = MainHelp();
      return absl::OkStatus();
    }
    return Usage(absl::StrCat("missing command (one of ", absl::StrJoin(words, ", "), "; see --help)"));
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
      return Usage(absl::StrCat("help: unknown command \"", topic, "\"", DidYouMean(topic, words)));
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
      const std::string guess = DidYouMean(pos[1], subs);
      return Usage(absl::StrCat("unknown subcommand \"", pos[1], "\"",
                                guess.empty() ? absl::StrCat(" (one of ", absl::StrJoin(subs, ", "), ")")
                                              : guess));
    }
    consumed = 2;
  } else {
    spec = FindCommand(pos[0]);
    if (spec == nullptr) {
      const std::string guess = DidYouMean(pos[0], words);
      return Usage(absl::StrCat("unknown command \"", pos[0], "\"",
                                guess.empty() ? absl::StrCat(" (one of ", absl::StrJoin(words, ", "), ")")
                                              : guess));
    }
  }
  out->name = std::string(spec->name);
  if (t.help) {
    out->help = CommandHelp(*spec);
    return absl::OkStatus();
  }
  if (!t.error.empty()) {
    // A flag the command does not have says so, rather than that it lacks a value.
    for (const RawFlag& f : t.flags) RETURN_IF_ERROR(CheckKnownFlag(f, *spec));
    return Usage(t.error);
  }

  std::vector<RawFlag> command_flags;
  if (absl::Status s = SortFlags(t.flags, *spec, env, &out->global, &command_flags); !s.ok()) {
    return s;
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
