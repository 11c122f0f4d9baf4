// spgatectl's command table: every command, its flags and help, and the global flags.
// The parser (commands.cc), the help text and the shell completion (completion.cc) are
// all generated from it, so a command or flag is declared once.
#ifndef SPGATE_TOOLS_SPGATECTL_COMMAND_TABLE_H_
#define SPGATE_TOOLS_SPGATECTL_COMMAND_TABLE_H_

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "tools/spgatectl/commands.h"

namespace spgate::ctl {

struct FlagSpec {
  absl::string_view name;
  absl::string_view value;  // placeholder in help: "J", "DURATION"; empty: a boolean flag,
                            // true when given bare ("--force"), or =true / =false
  absl::string_view help;
  absl::string_view env = "";  // global flags: the environment variable that sets it
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

inline constexpr absl::string_view kOutputFormats[] = {"table", "json", "yaml"};
inline constexpr absl::string_view kShells[] = {"bash", "zsh"};

// Every command, in help order.
const std::vector<CommandSpec>& Commands();
// The flags every command accepts.
std::span<const FlagSpec> GlobalFlags();
const CommandSpec* FindCommand(absl::string_view name);
// "get", "set", ... for "gates"; empty for a word that is no group.
std::vector<absl::string_view> Subcommands(absl::string_view group);
// The GateConfig fields, each a flag of the commands with gate_flags.
std::vector<const google::protobuf::FieldDescriptor*> GateFields();
// The first words of the commands ("gates", "jobs", "pin", ...) and "help", in table order.
std::vector<absl::string_view> TopLevelWords();

std::string GlobalFlagsHelp();
std::string CommandHelp(const CommandSpec& c);
std::string GroupHelp(absl::string_view group);

// Edits (insert, delete, substitute, swap two neighbours) from a to b: "jbos" is one
// from "jobs".
size_t EditDistance(absl::string_view a, absl::string_view b);
// " (did you mean <prefix>X?)" for the known word nearest to `word`, when it is near
// enough to be a typo (one edit for a word of up to 4 letters, else two); else "".
std::string DidYouMean(absl::string_view word, const std::vector<absl::string_view>& known,
                       absl::string_view prefix = "");

}  // namespace spgate::ctl

#endif  // SPGATE_TOOLS_SPGATECTL_COMMAND_TABLE_H_
