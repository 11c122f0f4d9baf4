// Shared command-line conventions; see cli.h.
#include "common/cli.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/parse.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/version.h"

namespace spgate {
namespace {

// The source root as the compiler named this file ("/src/spgate/" from
// "/src/spgate/common/cli.cc"; empty when it was compiled by a relative name). Every
// project file is named the same way, so stripping this prefix gives "server/main.cc".
absl::string_view SourceRoot() {
  absl::string_view self = __FILE__;
  absl::ConsumeSuffix(&self, "common/cli.cc");
  return self;
}

std::string NormalizeFlagFile(absl::string_view filename) {
  const absl::string_view root = SourceRoot();
  if (!root.empty() && absl::ConsumePrefix(&filename, root)) return std::string(filename);
  // Not below the root: keep it absolute, so IsProjectFlagFile can tell it apart.
  return std::string(filename);
}

// While ParseFlags runs absl's parser: any exit then is absl's, with the status it should
// have (absl exits 1 after a refused flag and after --help).
bool parsing = false;
int parse_exit_status = 2;

void ExitWithParseStatus() {
  if (!parsing) return;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(parse_exit_status);
}

absl::string_view UsageFlagName(std::string_view arg) {
  absl::string_view a(arg.data(), arg.size());
  if (!absl::ConsumePrefix(&a, "--") && !absl::ConsumePrefix(&a, "-")) return {};
  a = a.substr(0, a.find('='));
  for (absl::string_view name : {"help", "helpfull", "helpshort", "helppackage", "helpon",
                                 "helpmatch", "version", "only_check_args"}) {
    if (a == name) return name;
  }
  return {};
}

}  // namespace

bool IsUsageFlag(std::string_view arg) { return !UsageFlagName(arg).empty(); }

std::vector<char*> ParseFlags(int argc, char* argv[]) {
  static const bool registered = std::atexit(ExitWithParseStatus) == 0;
  (void)registered;
  // First the command line without the usage flags: whatever absl refuses there exits 2.
  std::vector<char*> checked;
  bool usage = false, flags_done = false;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i > 0 && !flags_done && IsUsageFlag(arg)) {
      usage = true;
      const absl::string_view name = UsageFlagName(arg);
      // "--helpon NAME": a string flag's value may be the next argument.
      if ((name == "helpon" || name == "helpmatch") && arg.find('=') == arg.npos) ++i;
      continue;
    }
    flags_done = flags_done || arg == "--";
    checked.push_back(argv[i]);
  }
  parsing = true;
  parse_exit_status = 2;
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(checked.size()),
                                                   checked.data());
  if (usage) {
    // The flags are good: the whole line again, for absl to print what was asked and
    // exit (1 after help in absl, 0 here).
    parse_exit_status = 0;
    rest = absl::ParseCommandLine(argc, argv);
  }
  parsing = false;
  return rest;
}

std::string VersionLine(std::string_view program) {
  return absl::StrCat(absl::string_view(program.data(), program.size()), " ",
                      absl::string_view(kVersion.data(), kVersion.size()), "\n");
}

bool IsProjectFlagFile(std::string_view filename) {
  const absl::string_view f(filename.data(), filename.size());
  // Outside the root (an absolute path left by NormalizeFlagFile), absl's own flags
  // ("absl/flags/parse.cc") and anything fetched or built into a build directory.
  if (f.empty() || f[0] == '/' || absl::StartsWith(f, "absl/") || absl::StrContains(f, "/absl/") ||
      absl::StrContains(f, "_deps/") || absl::StartsWith(f, "build")) {
    return false;
  }
  return true;
}

void InitFlagsUsage(std::string_view program) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view f) {
    return IsProjectFlagFile(std::string_view(f.data(), f.size()));
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.contains_helppackage_flags = config.contains_help_flags;
  config.normalize_filename = NormalizeFlagFile;
  config.version_string = [p = std::string(program)] { return VersionLine(p); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace spgate
