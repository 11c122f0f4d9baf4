// spgatectl's command table and the help generated from it; see command_table.h.
#include "tools/spgatectl/command_table.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "policy/gate_config.h"

namespace spgate::ctl {
namespace {

using google::protobuf::FieldDescriptor;

// The flags that say where the daemon is and who is asking can also come from the
// environment (env): a flag given wins, then the variable, then the default.
constexpr FlagSpec kGlobalFlags[] = {
    {"admin", "ADDR", "admin API address (default 127.0.0.1:50062)", "SPGATE_ADMIN"},
    {"token_file", "FILE", "send the token in FILE as 'authorization: Bearer <token>'",
     "SPGATE_TOKEN_FILE"},
    {"tls_ca", "FILE", "PEM roots that sign the daemon's certificate; turns TLS on", "SPGATE_TLS_CA"},
    {"tls_cert", "FILE", "PEM client certificate for mTLS (needs --tls_key); turns TLS on",
     "SPGATE_TLS_CERT"},
    {"tls_key", "FILE", "PEM private key of --tls_cert", "SPGATE_TLS_KEY"},
    {"tls_server_name", "NAME", "name to check in the daemon's certificate (default: host of --admin)",
     "SPGATE_TLS_SERVER_NAME"},
    {"timeout", "DURATION", "the command's deadline, all its calls (default 5s; watch: time to connect)",
     "SPGATE_TIMEOUT"},
    {"output", "table|json|yaml",
     "-o for short: table (default), json (proto field names; one object per line for watch) "
     "or yaml (the same document)"},
    {"version", "", "print spgatectl's version and exit"},
};

// A GateConfig field's --help line, from the one field table (the server is the judge
// of ranges; the text only tells the user what it will accept).
std::string GateFieldHelp(absl::string_view field) {
  const GateField* f = FindGateField(std::string_view(field.data(), field.size()));
  if (f == nullptr) return "GateConfig field";
  return absl::StrCat(std::string(f->help), " ", std::string(GateFieldRangeText(f->range)));
}

void AppendFlagLines(std::string* out, const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [flag, help] : lines) width = std::max(width, flag.size());
  for (const auto& [flag, help] : lines) {
    absl::StrAppend(out, "  ", flag, std::string(width - flag.size() + 2, ' '), help, "\n");
  }
}

}  // namespace

std::span<const FlagSpec> GlobalFlags() { return kGlobalFlags; }





const std::vector<CommandSpec>& Commands() {
  static const auto* kCommands = new std::vector<CommandSpec>{
      {Command::kGatesGet, "gates get", "[--job_id=J]",
       "show the gate config (global default, or one job's effective config)",
       {{"job_id", "J", "the job's effective config and its overrides (default: global)"}},
       false,
       "SOURCE is 'override' for a value set at this scope through the API; for a job,\n"
       "'inherited' for one that comes from the global config; for the global scope,\n"
       "'config file' (the --config file's value) or 'default' (the built-in default's)."},
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
        {"limit", "N", "at most N entries (0 or none: 50; at most 500)"},
        {"page_token", "T", "continue where the previous page ended"}},
       false,
       "Every config change, rollback, pin and unpin, with who made it (the credential's\n"
       "name or the client certificate's identity), the fields changed and the new version.\n"
       "Needs spgated --state_dir (the log is <state_dir>/audit.log)."},
      {Command::kGatesRollback, "gates rollback", "[--job_id=J] --to_version=N [--expected_version=N]",
       "restore a scope's overrides as they were right after version N",
       {{"job_id", "J", "roll back this job's overrides (default: the global ones)"},
        {"to_version", "N",
         "a version from 'gates history' of the same scope, or 0: every override removed"},
        {"expected_version", "N", "refuse (ABORTED) unless the scope is still at version N"}},
       false,
       "The rollback is itself a new version and is audited. A version of another scope is\n"
       "INVALID_ARGUMENT; one the audit log does not hold is NOT_FOUND. Version 0 removes\n"
       "every override of the scope: the global scope is then the --config file as last\n"
       "loaded (a reload included) over the defaults, a job the global config; it needs\n"
       "no audit log. Needs the admin role."},
      {Command::kJobsList, "jobs list", "", "list the jobs the daemon knows", {}, false, ""},
      {Command::kJobsShow, "jobs show", "JOB",
       "one job: groups, per-mode comparison, decision counts, pins", {}, false,
       "The per-mode table compares the modes over the rolling window, relative to\n"
       "TP-only (the table of docs/design.md §1 computed from live observations)."},
      {Command::kJobsForget, "jobs forget", "JOB [--operator_settings]",
       "drop a job's live state (and, with the flag, its overrides and pins)",
       {{"operator_settings", "",
         "also drop the job's config overrides and pins (=true|false also works; default "
         "false)"}},
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
       "(docs/design.md §3); pin says so on stderr when that gate held a pinned group at\n"
       "its last decision. --force takes that safety away for this pin; the audit log and\n"
       "'gates history' record that it was forced. An SP pin cannot be forced.\n"
       "A job (or group) that has not registered yet can be pinned: the pin is kept and\n"
       "applies from its first decision, if it has not expired by then."},
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
        {"budget", "BYTES",
         "device memory budget (e.g. 80GiB); without it (or 0) the memory gate is off"},
        {"peak_sp", "BYTES", "predicted peak memory under SP"},
        {"peak_tp", "BYTES", "predicted peak memory under TP-only"}},
       true,
       "Nothing changes on the daemon. GateConfig flags are layered over the live config\n"
       "for this evaluation only. Without --budget (or with --budget=0) the memory gate is\n"
       "off, and the output says so; --peak_sp or --peak_tp without a budget is a usage\n"
       "error (they would be ignored).\n"
       "Example: spgatectl eval --lengths=512,4096,16384 --rs_wait_share=0.3 --max_length_cv=1"},
      {Command::kCompletion, "completion", "bash|zsh",
       "print a shell completion script", {}, false,
       "Generated from the command table, so every command and flag completes.\n"
       "bash: source <(spgatectl completion bash)   (or save it under\n"
       "      /etc/bash_completion.d/ or ~/.local/share/bash-completion/completions/spgatectl)\n"
       "zsh:  source <(spgatectl completion zsh)    (uses zsh's bashcompinit)"},
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


std::string GlobalFlagsHelp() {
  std::vector<std::pair<std::string, std::string>> lines;
  for (const FlagSpec& f : kGlobalFlags) {
    lines.emplace_back(f.value.empty() ? absl::StrCat("--", f.name) : absl::StrCat("--", f.name, "=", f.value),
                       f.env.empty() ? std::string(f.help) : absl::StrCat(f.help, "; env ", f.env));
  }
  std::string out = "Global flags (any command):\n";
  AppendFlagLines(&out, lines);
  absl::StrAppend(&out, "A flag given wins over its environment variable (an empty one counts as unset),\n"
                        "the variable over the default.\n");
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
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], before[j - 2] + 1);
      }
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string DidYouMean(absl::string_view word, const std::vector<absl::string_view>& known,
                       absl::string_view prefix) {
  absl::string_view best;
  // A short word is a typo of another only one edit away ("put" is not "get").
  size_t best_distance = word.size() <= 4 ? 2 : 3;
  for (absl::string_view k : known) {
    const size_t d = EditDistance(word, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  return best.empty() ? "" : absl::StrCat(" (did you mean ", prefix, best, "?)");
}

std::vector<absl::string_view> TopLevelWords() {
  std::vector<absl::string_view> out;
  for (const CommandSpec& c : Commands()) {
    const absl::string_view word = c.name.substr(0, c.name.find(' '));
    if (std::find(out.begin(), out.end(), word) == out.end()) out.push_back(word);
  }
  out.push_back("help");
  return out;
}

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

}  // namespace spgate::ctl
