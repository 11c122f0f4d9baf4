// Shared command-line conventions; see cli.h.
#include "common/cli.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
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

// While ParseFlags runs absl's parser, any exit is absl refusing a flag (after its message
// naming it): with status 2 here, where absl exits 1.
bool parsing = false;

void ExitWithParseStatus() {
  if (!parsing) return;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  _exit(2);
}

}  // namespace

std::vector<char*> ParseFlags(int argc, char* argv[]) {
  static const bool registered = std::atexit(ExitWithParseStatus) == 0;
  (void)registered;
  // absl::ParseCommandLine is this with kHandleUsage: the usage flags are handled below
  // instead, so that a refused flag (also beside a usage flag: --help --bogus) and a
  // help request end with different statuses. (absl/flags/internal: the project already
  // reads WasPresentOnCommandLine from there; Abseil 20220623 as Debian ships it.)
  parsing = true;
  std::vector<char*> rest = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  parsing = false;
  // -1: no usage flag; 1 after help (absl's exit status, 0 here); 0 after --version and
  // --only_check_args.
  const int usage = absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage());
  if (usage != -1) {
    std::cout.flush();
    std::exit(usage == 1 ? 0 : usage);
  }
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
